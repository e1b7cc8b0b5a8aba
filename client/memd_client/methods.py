"""The daemon's methods as typed Python calls, written once for the blocking and the asyncio client.

Each method is written as the builder of its request (a :class:`Call`: method, params, timeout);
:class:`BlockingMethods` and :class:`AsyncMethods` differ only in how a call is carried out. So
``c.search(...)`` has one signature and one body: it returns a :class:`SearchResult` from the
blocking client and a coroutine of one from the asyncio client.

Over 400 lines: one builder per protocol method (14), each with its parameters documented.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    NamedTuple,
    ParamSpec,
    Self,
    TypeVar,
    cast,
    overload,
)

from memd_client.errors import Internal, Timeout, UnknownWorkspace
from memd_client.protocol import PROTOCOL_VERSION

if TYPE_CHECKING:  # annotations only: the result maps are plain dicts at run time
    from memd_client.types import (
        AppendResult,
        ContextResult,
        DreamResult,
        FlushPlan,
        GetResult,
        HelloResult,
        PromoteResult,
        RecordRecallResult,
        ReindexResult,
        SearchResult,
        StatusResult,
        WorkspaceAddResult,
        WorkspaceListResult,
        WorkspaceRemoveResult,
    )

__all__ = ["AsyncMethods", "BlockingMethods", "Call", "Methods", "WorkspaceRef"]

P = ParamSpec("P")
T = TypeVar("T")

# A workspace is a registered name or a directory; a path is sent absolute (the daemon's cwd
# is not the caller's).
WorkspaceRef = str | os.PathLike[str]


def _absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _is_path(ref: str) -> bool:
    """A reference written as a path: ``~``, ``.``, ``..`` or a separator in it."""
    return ref.startswith(("~", ".")) or os.sep in ref or (os.altsep or os.sep) in ref


def _workspace(ref: WorkspaceRef) -> str:
    """A workspace reference as sent: a path form (a Path, ``~/ws``, ``./ws``, ``a/b``) made
    absolute here, where it was written; a plain word as it is (a registered name)."""
    if not isinstance(ref, str) or _is_path(ref):
        return _absolute(ref)
    return ref


def _as_directory(call: Call[T]) -> Call[T] | None:
    """The call again with its plain-word workspace as the directory of that name in the
    current directory, when there is one: a name first, then a path (``-w notes`` for
    ``./notes``)."""
    ref = call.params.get("workspace")
    if not isinstance(ref, str) or _is_path(ref) or not os.path.isdir(ref):
        return None
    return call._replace(params={**call.params, "workspace": _absolute(ref)})


class Call(NamedTuple, Generic[T]):
    """One request of a typed method: what to send, the client-side timeout, and what a
    Timeout should add (an append says how to retry it without writing twice)."""

    method: str
    params: dict[str, Any]
    timeout: float | None
    on_timeout: str = ""

    def result(self, value: Any) -> T:
        """The reply's result, which is a map for every method."""
        if not isinstance(value, dict):
            raise Internal(f"memd answered {self.method} with a {type(value).__name__}, not a map")
        return cast(T, value)

    def timed_out(self, exc: Timeout) -> Timeout:
        return Timeout(f"{exc}; {self.on_timeout}") if self.on_timeout else exc


class _Method(Generic[P, T]):
    """A method written as the builder of its request; read from a client, it makes the call
    (returning the result, or with the asyncio client a coroutine of it)."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self._build = build
        self.__name__ = build.__name__
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, obj: BlockingMethods, owner: type[Any]) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, obj: AsyncMethods, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: Methods | None, owner: type[Any]) -> Any:
        if obj is None:
            return self
        client, build = obj, self._build

        def method(*args: Any, **kwargs: Any) -> Any:
            # The request is built at call time, also for the asyncio client: paths are made
            # absolute against the cwd of the call, and bad arguments raise at once.
            return client._run(build(client, *args, **kwargs))

        method.__name__ = build.__name__
        method.__qualname__ = f"{type(obj).__name__}.{build.__name__}"
        method.__doc__ = build.__doc__
        return method


class Methods(ABC):
    """One typed method per daemon method, each returning the result map of docs/protocol.md."""

    timeout: float | None
    # Who this client speaks for (agent_id, session_key, chat_type, channel); sent with every
    # search, get and context, so transcript hits and scope rules apply to it.
    identity: Mapping[str, str] | None = None

    @abstractmethod
    def _run(self, call: Call[Any]) -> Any:
        """Carry ``call`` out: its result (blocking) or a coroutine of it (asyncio)."""

    def _caller(self) -> dict[str, str] | None:
        return dict(self.identity) if self.identity else None

    @_Method
    def hello(
        self, client: str | None = None, protocol: int = PROTOCOL_VERSION
    ) -> Call[HelloResult]:
        """Introduce this client; the result names the protocol, server version and methods."""
        params: dict[str, Any] = {"client": client, "protocol": protocol, **(self.identity or {})}
        return Call("hello", params, self.timeout)

    @_Method
    def status(self, workspace: WorkspaceRef | None = None) -> Call[StatusResult]:
        """Report the daemon and every workspace (or only ``workspace``)."""
        ref = None if workspace is None else _workspace(workspace)
        return Call("status", {"workspace": ref}, self.timeout)

    @_Method
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
    ) -> Call[SearchResult]:
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
            "caller": self._caller(),
        }
        timeout = self.timeout
        if timeout is not None and wait_ms:
            timeout += wait_ms / 1000
        return Call("search", params, timeout)

    @_Method
    def get(
        self,
        workspace: WorkspaceRef,
        path: str,
        *,
        from_line: int | None = None,
        lines: int | None = None,
    ) -> Call[GetResult]:
        """Read ``lines`` lines of a memory file from line ``from_line`` (1-based, default 1)."""
        params = {
            "workspace": _workspace(workspace),
            "path": path,
            "from": from_line,
            "lines": lines,
            "caller": self._caller(),
        }
        return Call("get", params, self.timeout)

    @_Method
    def append(
        self,
        workspace: WorkspaceRef,
        text: str,
        *,
        idempotency_key: str | None = None,
        path: str | None = None,
        flush: bool = False,
    ) -> Call[AppendResult]:
        """Append ``text`` to today's memory file; returns once it is searchable.

        Every call carries an idempotency key (a new random one unless given): the daemon
        appends a key's text once, and a retry with the same key gets the first result. After
        a Timeout the append may still happen, so retry with the same key, never a new one.

        ``path``, when given, is where the caller means to write; anything but today's daily
        log is refused (PathRefused names the rule). ``flush`` marks a pre-compaction flush:
        its silent reply (``NO_REPLY``) writes nothing and returns ``written: False``.
        """
        import uuid  # only appends need it: every memctl process would pay for it otherwise

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
        advice = (
            f"the append may still happen: retry with idempotency_key={key!r} "
            "so it is not written twice"
        )
        return Call("append", params, self.timeout, on_timeout=advice)

    @_Method
    def context(
        self, workspace: WorkspaceRef, *, max_chars: int | None = None
    ) -> Call[ContextResult]:
        """The session-start context: MEMORY.md (when this caller may see it) and the daily
        logs of today and yesterday, under ``max_chars`` (default 12,000), with citations."""
        params = {
            "workspace": _workspace(workspace),
            "max_chars": max_chars,
            "caller": self._caller(),
        }
        return Call("context", params, self.timeout)

    @_Method
    def flush_plan(self, workspace: WorkspaceRef) -> Call[FlushPlan]:
        """When and how to flush a session to memory before compaction: thresholds, today's
        daily log (in the user's time zone), and the prompts with their safety rules."""
        return Call("flush_plan", {"workspace": _workspace(workspace)}, self.timeout)

    @_Method
    def record_recall(
        self, workspace: WorkspaceRef, query: str, results: Sequence[Mapping[str, Any]]
    ) -> Call[RecordRecallResult]:
        """Record that ``results`` (path, start_line, end_line, …) were recalled for ``query``."""
        params = {"workspace": _workspace(workspace), "query": query, "results": list(results)}
        return Call("record_recall", params, self.timeout)

    @_Method
    def reindex(
        self,
        workspace: WorkspaceRef | None = None,
        *,
        force: bool = False,
        wait: bool = True,
        timeout: float | None = None,
        dry_run: bool = False,
    ) -> Call[ReindexResult]:
        """Reindex one workspace (default all); with ``force``, rebuild from scratch.

        Args:
            wait: return the reports when done; else return at once with the queued names.
            timeout: seconds to wait for the reports; None waits as long as indexing takes.
            dry_run: with ``force``, change nothing: return ``estimates``, what the rebuild
                would send to the embedding provider (texts, tokens, requests).
        """
        params = {
            "workspace": None if workspace is None else _workspace(workspace),
            "force": force or None,
            "wait": wait,
            "dry_run": dry_run or None,
        }
        return Call("reindex", params, timeout if wait else self.timeout)

    @_Method
    def workspace_add(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        extra_paths: Sequence[str | os.PathLike[str]] | None = None,
        sessions_dir: str | os.PathLike[str] | None = None,
        agent_id: str | None = None,
    ) -> Call[WorkspaceAddResult]:
        """Register the directory ``path`` (made absolute here) as a workspace; ``sessions_dir``
        adds the transcripts of agent ``agent_id`` as a second source."""
        params = {
            "path": _absolute(path),
            "name": name,
            "extra_paths": None if extra_paths is None else [_absolute(p) for p in extra_paths],
            "sessions_dir": None if sessions_dir is None else _absolute(sessions_dir),
            "agent_id": agent_id,
        }
        return Call("workspace_add", params, self.timeout)

    @_Method
    def workspace_remove(self, workspace: WorkspaceRef) -> Call[WorkspaceRemoveResult]:
        """Unregister a workspace (its files stay); the result says whether one was removed."""
        params = {"workspace": _workspace(workspace)}
        return Call("workspace_remove", params, self.timeout)

    @_Method
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
    ) -> Call[PromoteResult]:
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
            "caller": self._caller(),
        }
        return Call("promote", params, self.timeout)

    @_Method
    def dream(
        self, workspace: WorkspaceRef, *, phase: str = "all", apply: bool = False
    ) -> Call[DreamResult]:
        """Run dreaming (``phase``: light, rem, deep or all); without ``apply`` a preview that
        writes nothing."""
        params = {
            "workspace": _workspace(workspace),
            "phase": phase,
            "apply": apply,
            "caller": self._caller(),
        }
        return Call("dream", params, self.timeout)

    @_Method
    def workspace_list(self) -> Call[WorkspaceListResult]:
        """List the registered workspaces."""
        return Call("workspace_list", {}, self.timeout)


class BlockingMethods(Methods):
    """The methods over a blocking ``_call``: each returns its result."""

    @abstractmethod
    def _call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        """Send one request (None params left out) and return its result or raise its error."""

    def _run(self, call: Call[T]) -> T:
        try:
            return call.result(self._call(call.method, call.params, call.timeout))
        except Timeout as exc:
            raise call.timed_out(exc) from None
        except UnknownWorkspace:
            again = _as_directory(call)
            if again is None:
                raise
            return self._run(again)


class AsyncMethods(Methods):
    """The methods over an asyncio ``_call``: each returns a coroutine of its result."""

    @abstractmethod
    async def _call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        """Send one request (None params left out) and return its result or raise its error."""

    async def _run(self, call: Call[T]) -> T:
        try:
            return call.result(await self._call(call.method, call.params, call.timeout))
        except Timeout as exc:
            raise call.timed_out(exc) from None
        except UnknownWorkspace:
            again = _as_directory(call)
            if again is None:
                raise
            return await self._run(again)
