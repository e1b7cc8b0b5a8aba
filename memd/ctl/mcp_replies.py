"""What ``memctl mcp``'s tools answer: each tool's output schema, the daemon's replies reshaped as
OpenClaw's memory tools shape them, the text the model reads, and failures that say what to do.

Its own module: memd.ctl.mcp_server builds the server and its tools' inputs; this is the shape
of every reply, which a test checks without starting a server.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, Field

from memd_client import (
    Busy,
    DaemonNotRunning,
    DaemonUnavailable,
    MemdError,
    PathRefused,
    ProviderUnavailable,
    Timeout,
    UnknownWorkspace,
)

__all__ = [
    "AppendOutput",
    "GetOutput",
    "SearchOutput",
    "get_reply",
    "get_text",
    "search_reply",
    "search_text",
    "split_citation",
]

logger = logging.getLogger(__name__)


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
