"""``memctl mcp``: a Model Context Protocol server over stdio that forwards to the memd daemon.

An MCP client (Claude Desktop, an IDE, an agent runtime) starts ``memctl mcp -w ~/agent`` and
gets three tools bound to that one workspace:

* ``memory_search``: hybrid search, answered like OpenClaw's tool;
* ``memory_get``: read a window of lines of a memory file, as OpenClaw's tool does;
* ``memory_append``: append a note to today's memory file.

The server holds one :class:`memd_client.Client`, which connects on first use, starting memd
if nothing listens (unless ``MEMD_AUTOSTART=0``), and reconnects after a failure. A workspace
given as a directory that memd does not know yet is registered on first use, as the OpenClaw
plugin does (``--no-register``: it is an error instead). Every reply has a readable text for
the model and the full structure in ``structuredContent``, which each tool's ``outputSchema``
describes (failures included). A failure is a tool error (``isError: true``) whose text says
what went wrong and what to do; when memory itself is unavailable (the daemon is not running,
the workspace is not registered) its structure also says ``disabled: true``, as OpenClaw's
tools do. Nothing but the protocol goes to stdout: logging goes to stderr, and the SDK points
fd 1 at stderr while it serves.

This module builds the server, its tools and their inputs; what the tools answer (their output
schemas, the replies and failures) is memd.ctl.mcp_replies'.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from memd.ctl.mcp_replies import (
    AppendOutput,
    GetOutput,
    SearchOutput,
    _citation,
    _failure,
    _success,
    get_reply,
    get_text,
    search_reply,
    search_text,
    split_citation,
)
from memd_client import Client, UnknownWorkspace

__all__ = ["SERVER_NAME", "build_server", "run"]

SERVER_NAME = "memd"

# When a search finds nothing while edits are still waiting to be indexed, search once more
# after letting the daemon catch up for at most this long.
_RETRY_WAIT_MS = 2000

_SEARCH_DESCRIPTION = """\
Search this workspace's long-term memory (MEMORY.md, memory/*.md notes and, if visible, past \
session transcripts) by meaning and keywords.

Use it BEFORE answering anything about prior work, past decisions, dates, people, preferences, \
todos or facts the user told you earlier, and whenever the user says "remember", "last time" \
or "what did we decide". Returns the best-matching snippets, each with path, startLine, endLine, \
score and a citation "path#Lstart-Lend"; call memory_get with that path to read more around a \
hit. An empty result means nothing relevant is stored. If the tool fails because memory is \
unavailable, tell the user what the error says to do instead of guessing."""

_GET_DESCRIPTION = """\
Read lines of one memory file of this workspace (a path from a memory_search hit, e.g. \
"MEMORY.md" or "memory/2026-01-02.md", or a hit's citation such as "MEMORY.md#L3-L7").

Use it after memory_search when a snippet is cut short or you need the surrounding context: \
pass "from" (1-based first line, e.g. a hit's startLine minus a few) and "lines" (how many). \
If the reply has "truncated": true, call again with from = nextFrom to continue. A file that \
does not exist returns empty text."""

_APPEND_DESCRIPTION = """\
Append a note to today's memory file (memory/YYYY-MM-DD.md) in this workspace; it is \
searchable as soon as this returns.

Use it to remember something durable that should survive this conversation: a decision, a \
user preference, a fact about a person or project, a todo, a lesson learned. Write a short, \
self-contained Markdown note (e.g. "- 2026-01-02: the launch moved to May (per Ana)"). Do not \
store secrets or transient chatter. Returns the path and lines written."""


def _accept_from(fn: Callable[..., CallToolResult]) -> Callable[..., CallToolResult]:
    """Let the SDK call ``fn`` with the schema's ``from`` (a keyword) as ``from_``.

    The SDK builds the schema from ``fn``'s signature (it follows ``__wrapped__``), where
    ``from_`` carries the alias "from", and calls the tool with aliased names.
    """

    @functools.wraps(fn)
    def call(**kwargs: Any) -> CallToolResult:
        if "from" in kwargs:
            kwargs["from_"] = kwargs.pop("from")
        return fn(**kwargs)

    return call


_T = TypeVar("_T")


def build_server(workspace: str, client: Client, *, register: bool = True) -> MCPServer[Any]:
    """An MCP server whose tools forward to ``client`` for ``workspace`` (a name or a path);
    with ``register``, a directory memd does not know yet is registered on first use."""

    def on_workspace(call: Callable[[], _T]) -> _T:
        try:
            return call()
        except UnknownWorkspace:
            if not (register and os.path.isabs(workspace) and os.path.isdir(workspace)):
                raise
            client.workspace_add(workspace)  # then memd indexes it: the call waits for that
            return call()

    def unknown(exc: BaseException) -> str | None:
        """What to do about an unknown workspace that is a directory registering was refused
        for (the general advice otherwise)."""
        if isinstance(exc, UnknownWorkspace) and not register and os.path.isdir(workspace):
            return (
                f"Register it with `memctl workspace add {workspace}`, or start `memctl mcp` "
                "without --no-register."
            )
        return None

    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        title="memd memory",
        version=_version(),
        instructions=(
            f"Long-term memory for the workspace {workspace!r}, served by the local memd daemon. "
            "Search it (memory_search) before answering questions about prior work, decisions, "
            "preferences or facts from earlier conversations; read around a hit with memory_get; "
            "save durable facts with memory_append."
        ),
        log_level="WARNING",
    )

    @server.tool(
        name="memory_search",
        title="Search memory",
        description=_SEARCH_DESCRIPTION,
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    def memory_search(
        query: Annotated[str, Field(description="What to look for, in natural language.")],
        max_results: Annotated[
            int | None, Field(ge=1, le=100, description="At most this many hits (default 6).")
        ] = None,
        min_score: Annotated[
            float | None,
            Field(ge=0.0, le=1.0, description="Drop hits scoring below this (0 to 1)."),
        ] = None,
        sources: Annotated[
            Literal["memory", "sessions", "all"] | None,
            Field(description="Search notes only, session transcripts only, or all (default)."),
        ] = None,
    ) -> Annotated[CallToolResult, SearchOutput]:
        try:
            options: dict[str, Any] = {
                "max_results": max_results,
                "min_score": min_score,
                "sources": sources,
            }
            result = on_workspace(lambda: client.search(workspace, query, **options))
            freshness = result.get("freshness") or {}
            if not result.get("results") and freshness.get("fresh") is False:
                # Edits still waiting to be indexed may hold the answer: let them land.
                result = client.search(workspace, query, wait_ms=_RETRY_WAIT_MS, **options)
        except Exception as exc:
            return _failure(exc, unknown(exc), results=[])
        reply = search_reply(result)
        return _success(search_text(query, reply), reply)

    @_accept_from
    def memory_get(
        path: Annotated[
            str,
            Field(
                description='A memory file relative to the workspace ("MEMORY.md"), or a '
                'citation from memory_search ("MEMORY.md#L3-L7").'
            ),
        ],
        from_: Annotated[
            int | None, Field(alias="from", ge=1, description="First line, 1-based (default 1).")
        ] = None,
        lines: Annotated[
            int | None, Field(ge=1, le=10_000, description="How many lines (default 120).")
        ] = None,
    ) -> Annotated[CallToolResult, GetOutput]:
        plain, start, count = split_citation(path)
        try:
            result = on_workspace(
                lambda: client.get(
                    workspace,
                    plain,
                    from_line=from_ if from_ is not None else start,
                    lines=lines if lines is not None else count,
                )
            )
        except Exception as exc:
            return _failure(exc, unknown(exc), path=plain, text="")
        reply = get_reply(result)
        return _success(get_text(reply), reply)

    server.add_tool(
        memory_get,
        name="memory_get",
        title="Read memory",
        description=_GET_DESCRIPTION,
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )

    @server.tool(
        name="memory_append",
        title="Remember",
        description=_APPEND_DESCRIPTION,
        annotations=ToolAnnotations(
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    def memory_append(
        text: Annotated[str, Field(min_length=1, description="The note to remember (Markdown).")],
    ) -> Annotated[CallToolResult, AppendOutput]:
        try:
            result = on_workspace(lambda: client.append(workspace, text))
        except Exception as exc:
            return _failure(exc, unknown(exc))
        path = str(result.get("path"))
        start, end = result.get("start_line"), result.get("end_line")
        reply = {
            "path": path,
            "startLine": start,
            "endLine": end,
            "citation": _citation(path, start, end),
        }
        return _success(f"Saved to {reply['citation']}; it is searchable now.", reply)

    return server


def _version() -> str:
    from memd import __version__

    return __version__


def run(
    workspace: str,
    socket: Path | None,
    identity: Mapping[str, str] | None,
    *,
    timeout: float | None = 30.0,
    register: bool = True,
) -> None:
    """Serve the memory tools for ``workspace`` over stdio until the client disconnects.

    Args:
        workspace: a registered workspace name, or an absolute directory.
        socket: the daemon's socket (default: ``$MEMD_SOCKET`` or the per-user runtime dir).
        identity: whom the tools speak for (agent_id, session_key, ...), as memctl's options.
        timeout: seconds each daemon call may take.
        register: register ``workspace`` (a directory) with memd on first use.
    """
    # Before the SDK's own logging setup (a no-op once the root logger has a handler).
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="memctl mcp: %(levelname)s %(message)s"
    )
    client = Client(socket, timeout, identity=identity)  # connects on the first call
    try:
        build_server(workspace, client, register=register).run("stdio")
    finally:
        client.close()
