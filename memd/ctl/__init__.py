"""memctl, memd's command line: status, search, reindex, workspaces, models, the service files,
doctor and the MCP server.

It lives with the daemon package, not in memd_client, because some of its commands run daemon
code in-process (doctor's checks, model downloads, the service files); the client library stays
standard library and msgpack only. Everything else it does goes through memd_client's socket.
"""
