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

Over 400 lines: three tools, each with its input and output schema; the schemas are most of it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from memd_client import (
    Busy,
    Client,
    DaemonNotRunning,
    DaemonUnavailable,
    MemdError,
    PathRefused,
    ProviderUnavailable,
    Timeout,
    UnknownWorkspace,
)

__all__ = [
    "SERVER_NAME",
    "AppendOutput",
    "GetOutput",
    "SearchOutput",
    "build_server",
    "get_text",
    "run",
    "search_text",
    "split_citation",
]

logger = logging.getLogger(__name__)

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


# -- what each tool returns in structuredContent (its outputSchema) ----------------------------


class _Outcome(BaseModel):
    """What every reply may carry: on a failure, what went wrong and what to do."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    error: str | None = Field(None, description="What went wrong (failures only).")
    action: str | None = Field(None, description="What to do about it (failures only).")
    disabled: bool | None = Field(
        None,
        description="True when memory as a whole is unavailable (memd not running, "
        "workspace unknown), as OpenClaw's memory tools say it.",
    )
    unavailable: bool | None = Field(None, description="Same as disabled.")


class SearchHit(BaseModel):
    path: str = Field(description="Memory file, relative to the workspace.")
    startLine: int  # OpenClaw's names, as its tools spell them
    endLine: int
    score: float
    snippet: str
    source: str = Field(description='"memory" or "sessions".')
    citation: str = Field(description='"path#Lstart-Lend", for memory_get or for quoting.')


class SearchOutput(_Outcome):
    """memory_search's structuredContent."""

    results: list[SearchHit]
    provider: str | None = None
    model: str | None = None
    mode: str | None = Field(None, description='"hybrid", "keyword" or "vector".')
    freshness: dict[str, Any] | None = Field(
        None, description="How fresh the index was (fresh, pending_files, problems, ...)."
    )
    note: str | None = None


class GetOutput(_Outcome):
    """memory_get's structuredContent."""

    path: str | None
    text: str
    from_: int | None = Field(None, alias="from", description="First line returned, 1-based.")
    lines: int | None = Field(None, description="How many lines were returned.")
    missing: bool | None = Field(None, description="True when the file does not exist.")
    truncated: bool | None = None
    nextFrom: int | None = Field(None, description="Where to continue when truncated.")


class AppendOutput(_Outcome):
    """memory_append's structuredContent."""

    path: str | None = None
    startLine: int | None = None
    endLine: int | None = None
    citation: str | None = None


def _action(exc: BaseException) -> str:
    """What a person (or the agent) should do about ``exc``."""
    if isinstance(exc, DaemonNotRunning):
        return "Start memd with `memd run` (or `memctl service install`), then retry."
    if isinstance(exc, DaemonUnavailable):
        return "memd is not answering; retry shortly, or restart it with `memd run`."
    if isinstance(exc, UnknownWorkspace):
        return (
            "Start `memctl mcp` with -w naming a workspace directory (registered on first use) "
            "or a registered name (`memctl workspace list`)."
        )
    if isinstance(exc, ProviderUnavailable):
        return "The embedding provider is unavailable; check `memctl status` and memd's log."
    if isinstance(exc, Busy | Timeout):
        return "memd is busy; retry in a moment."
    if isinstance(exc, PathRefused):
        return "Use a path from a memory_search hit (MEMORY.md or memory/*.md)."
    return "Check `memctl status` and memd's log."


def _message(exc: BaseException) -> str:
    if isinstance(exc, MemdError):
        return str(exc) or type(exc).__name__
    logger.exception("unexpected error in a memory tool")
    return f"unexpected error: {type(exc).__name__}: {exc}"


_UNAVAILABLE = (DaemonNotRunning, DaemonUnavailable, UnknownWorkspace)


def _failure(exc: BaseException, action: str | None = None, **extra: Any) -> CallToolResult:
    """A tool error the model can act on: what went wrong and what to do, as text and data.

    When memd is not running or not answering, its message already says why and what to do
    (the client tried to start it): the text says it once."""
    error, action = _message(exc), action or _action(exc)
    data: dict[str, Any] = {**extra, "error": error, "action": action}
    text = f"{error.rstrip('.')}. {action}"
    if isinstance(exc, DaemonNotRunning):
        text = error
    if isinstance(exc, _UNAVAILABLE):
        data |= {"disabled": True, "unavailable": True}
        text = f"Memory is unavailable: {text}"
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=data, is_error=True
    )


def _success(text: str, data: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def search_text(query: str, reply: Mapping[str, Any]) -> str:
    """What the model reads of a search: each hit's citation, score and snippet."""
    hits = reply.get("results") or []
    if not hits:
        lines = [f"No memory matches {query!r}."]
    else:
        lines = [f"{len(hits)} memory hit(s) for {query!r}:"]
        for i, hit in enumerate(hits, 1):
            lines.append(f"\n{i}. {hit['citation']} (score {hit.get('score') or 0:.2f})")
            lines.extend(f"   {line}" for line in str(hit.get("snippet") or "").splitlines())
    freshness = reply.get("freshness") or {}
    if freshness.get("fresh") is False:
        lines.append(
            f"\n(The index is catching up: {freshness.get('pending_files', 0)} file(s) pending.)"
        )
    if reply.get("note"):
        lines.append(f"\nNote: {reply['note']}")
    return "\n".join(lines)


def get_text(reply: Mapping[str, Any]) -> str:
    """What the model reads of a get: where the lines are from, then the lines."""
    path, text = reply.get("path"), str(reply.get("text") or "")
    if reply.get("missing"):
        return f"{path} does not exist (yet): nothing stored there."
    first = reply.get("from") or 1
    last = first + max(int(reply.get("lines") or 0), 1) - 1
    return f"{path}#L{first}-L{last}:\n{text}"


_CITATION = re.compile(r"^(?P<path>.+?)#L(?P<start>\d+)(?:-L?(?P<end>\d+))?$")


def split_citation(path: str) -> tuple[str, int | None, int | None]:
    """``"MEMORY.md#L3-L7"`` -> ``("MEMORY.md", 3, 5)`` (path, first line, line count);
    a plain path comes back with Nones."""
    m = _CITATION.match(path.strip())
    if m is None:
        return path, None, None
    start = int(m["start"])
    end = int(m["end"]) if m["end"] else None
    if start < 1 or (end is not None and end < start):
        return path, None, None
    return m["path"], start, (end - start + 1 if end is not None else None)


def _citation(path: str, start: Any, end: Any) -> str:
    return f"{path}#L{start}-L{end}"


def search_reply(result: Mapping[str, Any]) -> dict[str, Any]:
    """The daemon's search result in the shape of OpenClaw's ``memory_search`` tool output."""
    hits = []
    for hit in result.get("results") or []:
        path = str(hit.get("path"))
        start, end = hit.get("start_line"), hit.get("end_line")
        hits.append(
            {
                "path": path,
                "startLine": start,
                "endLine": end,
                "score": hit.get("score"),
                "snippet": hit.get("snippet"),
                "source": hit.get("source"),
                "citation": _citation(path, start, end),
            }
        )
    reply: dict[str, Any] = {
        "results": hits,
        "provider": result.get("provider"),
        "model": result.get("model"),
        "mode": result.get("mode"),
        "freshness": result.get("freshness"),
    }
    if result.get("note"):
        reply["note"] = result["note"]
    return reply


def get_reply(result: Mapping[str, Any]) -> dict[str, Any]:
    """The daemon's get result in the shape of OpenClaw's ``memory_get`` tool output."""
    text = str(result.get("text") or "")
    reply: dict[str, Any] = {
        "path": result.get("path"),
        "text": text,
        "from": result.get("from"),
        "lines": result.get("lines"),
    }
    if result.get("missing"):
        reply["missing"] = True
    if result.get("truncated"):
        reply["truncated"] = True
        next_from = result.get("next_from")
        if next_from:
            reply["nextFrom"] = next_from
            reply["text"] = f"{text}\n\n[More content available. Use from={next_from} to continue.]"
    return reply


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
