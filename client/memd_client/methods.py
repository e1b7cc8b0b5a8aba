"""The daemon's methods as typed Python calls, each returning the result map of docs/protocol.md."""

from __future__ import annotations

import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from memd_client.errors import Timeout
from memd_client.protocol import PROTOCOL_VERSION

__all__ = ["Methods", "WorkspaceRef"]

# A workspace is a registered name or a directory; a path is sent absolute (the daemon's cwd
# is not the caller's).
WorkspaceRef = str | os.PathLike[str]


def _absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _workspace(ref: WorkspaceRef) -> str:
    return ref if isinstance(ref, str) else _absolute(ref)


class Methods(ABC):
    """One typed wrapper per daemon method over a single ``_map`` primitive."""

    timeout: float | None
    # Who this client speaks for (agent_id, session_key, chat_type, channel); sent with every
    # search, get and context, so transcript hits and scope rules apply to it.
    identity: Mapping[str, str] | None = None

    @abstractmethod
    def _map(self, method: str, params: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Call ``method`` (None params left out) and return its result, which must be a map."""

    def hello(self, client: str | None = None, protocol: int = PROTOCOL_VERSION) -> dict[str, Any]:
        """Introduce this client; the result names the protocol, server version and methods."""
        params: dict[str, Any] = {"client": client, "protocol": protocol, **(self.identity or {})}
        return self._map("hello", params, self.timeout)

    def status(self, workspace: WorkspaceRef | None = None) -> dict[str, Any]:
        """Report the daemon and every workspace (or only ``workspace``)."""
        ref = None if workspace is None else _workspace(workspace)
        return self._map("status", {"workspace": ref}, self.timeout)

    def search(
        self,
        workspace: WorkspaceRef,
        query: str,
        *,
        max_results: int | None = None,
        min_score: float | None = None,
        mode: str | None = None,
        wait_ms: int | None = None,
        decay: bool | None = None,
        mmr: bool | None = None,
        sources: str | Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Search a workspace's memory; ``mode`` is "hybrid", "keyword" or "vector";
        ``sources`` is "memory", "sessions" or "all" (default: all this client may see).

        Args:
            wait_ms: how long the daemon may wait for pending edits to be indexed first; the
                client's timeout is extended by as much.
        """
        params = {
            "workspace": _workspace(workspace),
            "query": query,
            "max_results": max_results,
            "min_score": min_score,
            "mode": mode,
            "wait_ms": wait_ms,
            "decay": decay,
            "mmr": mmr,
            "sources": [sources] if isinstance(sources, str) else sources,
            "caller": dict(self.identity) if self.identity else None,
        }
        timeout = self.timeout
        if timeout is not None and wait_ms:
            timeout += wait_ms / 1000
        return self._map("search", params, timeout)

    def get(
        self,
        workspace: WorkspaceRef,
        path: str,
        *,
        from_line: int | None = None,
        lines: int | None = None,
    ) -> dict[str, Any]:
        """Read ``lines`` lines of a memory file from line ``from_line`` (1-based, default 1)."""
        params = {
            "workspace": _workspace(workspace),
            "path": path,
            "from": from_line,
            "lines": lines,
            "caller": dict(self.identity) if self.identity else None,
        }
        return self._map("get", params, self.timeout)

    def append(
        self,
        workspace: WorkspaceRef,
        text: str,
        *,
        idempotency_key: str | None = None,
        path: str | None = None,
        flush: bool = False,
    ) -> dict[str, Any]:
        """Append ``text`` to today's memory file; returns once it is searchable.

        Every call carries an idempotency key (a new random one unless given): the daemon
        appends a key's text once, and a retry with the same key gets the first result. After
        a Timeout the append may still happen, so retry with the same key, never a new one.

        ``path``, when given, is where the caller means to write; anything but today's daily
        log is refused (PathRefused names the rule). ``flush`` marks a pre-compaction flush:
        its silent reply (``NO_REPLY``) writes nothing and returns ``written: False``.
        """
        key = idempotency_key or uuid.uuid4().hex
        params: dict[str, Any] = {
            "workspace": _workspace(workspace),
            "text": text,
            "idempotency_key": key,
        }
        if path is not None:
            params["path"] = path
        if flush:
            params["flush"] = True
        try:
            return self._map("append", params, self.timeout)
        except Timeout as exc:
            raise Timeout(
                f"{exc}; the append may still happen: retry with idempotency_key={key!r} "
                "so it is not written twice"
            ) from None

    def context(self, workspace: WorkspaceRef, *, max_chars: int | None = None) -> dict[str, Any]:
        """The session-start context: MEMORY.md (when this caller may see it) and the daily
        logs of today and yesterday, under ``max_chars`` (default 12,000), with citations."""
        params = {
            "workspace": _workspace(workspace),
            "max_chars": max_chars,
            "caller": dict(self.identity) if self.identity else None,
        }
        return self._map("context", params, self.timeout)

    def flush_plan(self, workspace: WorkspaceRef) -> dict[str, Any]:
        """When and how to flush a session to memory before compaction: thresholds, today's
        daily log (in the user's time zone), and the prompts with their safety rules."""
        return self._map("flush_plan", {"workspace": _workspace(workspace)}, self.timeout)

    def record_recall(
        self, workspace: WorkspaceRef, query: str, results: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """Record that ``results`` (path, start_line, end_line, …) were recalled for ``query``."""
        params = {"workspace": _workspace(workspace), "query": query, "results": list(results)}
        return self._map("record_recall", params, self.timeout)

    def reindex(
        self,
        workspace: WorkspaceRef | None = None,
        *,
        force: bool = False,
        wait: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Reindex one workspace (default all); with ``force``, rebuild from scratch.

        Args:
            wait: return the reports when done; else return at once with the queued names.
            timeout: seconds to wait for the reports; None waits as long as indexing takes.
        """
        params = {
            "workspace": None if workspace is None else _workspace(workspace),
            "force": force or None,
            "wait": wait,
        }
        return self._map("reindex", params, timeout if wait else self.timeout)

    def workspace_add(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        extra_paths: Sequence[str | os.PathLike[str]] | None = None,
        sessions_dir: str | os.PathLike[str] | None = None,
        agent_id: str | None = None,
    ) -> dict[str, Any]:
        """Register the directory ``path`` (made absolute here) as a workspace; ``sessions_dir``
        adds the transcripts of agent ``agent_id`` as a second source."""
        params = {
            "path": _absolute(path),
            "name": name,
            "extra_paths": None if extra_paths is None else [_absolute(p) for p in extra_paths],
            "sessions_dir": None if sessions_dir is None else _absolute(sessions_dir),
            "agent_id": agent_id,
        }
        return self._map("workspace_add", params, self.timeout)

    def workspace_remove(self, workspace: WorkspaceRef) -> dict[str, Any]:
        """Unregister a workspace (its files stay); the result says whether one was removed."""
        params = {"workspace": _workspace(workspace)}
        return self._map("workspace_remove", params, self.timeout)

    def promote(
        self,
        workspace: WorkspaceRef,
        *,
        apply: bool = False,
        explain: str | None = None,
        include_promoted: bool | None = None,
        limit: int | None = None,
        min_score: float | None = None,
        min_recall_count: int | None = None,
        min_unique_queries: int | None = None,
    ) -> dict[str, Any]:
        """Rank the workspace's short-term memories; with ``apply``, write them to MEMORY.md."""
        params = {
            "workspace": _workspace(workspace),
            "apply": apply,
            "explain": explain,
            "include_promoted": include_promoted,
            "limit": limit,
            "min_score": min_score,
            "min_recall_count": min_recall_count,
            "min_unique_queries": min_unique_queries,
        }
        return self._map("promote", params, self.timeout)

    def workspace_list(self) -> dict[str, Any]:
        """List the registered workspaces."""
        return self._map("workspace_list", {}, self.timeout)
