"""The methods of memd's socket protocol as plain Python: argument checks, freshness, waits.

Dispatch (memd.ipc) maps a request to one of these methods and never sees the index; these
methods never see a socket or msgpack.

Over 400 lines: one method per protocol call (thirteen), each with its parameter checks, is
read in one place; what they share lives elsewhere: freshness in memd/freshness.py, the
session-start context in memd/markdown/context.py, the flush rules in memd/flush.py,
idempotency keys in memd/once.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import apsw
import psutil

from memd import __version__
from memd.blas import blas_threads
from memd.dreams.diary import DIARY_FILE
from memd.dreams.dream import PHASES, DreamOptions, last_runs, run_dream
from memd.dreams.dreaming import run_promotion
from memd.dreams.privacy import without_transcripts
from memd.dreams.ranking import MANUAL
from memd.dreams.recall_store import RecallStore
from memd.dreams.recorder import RecallRecorder
from memd.dreams.schedule import Schedule
from memd.dreams.similar import meaning_threshold
from memd.dreams.transcripts import Message, Transcript
from memd.embed.autopull import ModelPull
from memd.flush import SILENT_REPLY, check_flush_target, daily_log, flush_plan, is_silent
from memd.freshness import check as check_freshness
from memd.index.cache import cached_vectors
from memd.indexer import URGENT, Indexer
from memd.markdown.context import DEFAULT_CONTEXT_CHARS, session_context
from memd.markdown.identity import Longterm
from memd.markdown.read import MemoryPath
from memd.once import AppendKeys, Once, crash_point
from memd.params import bool_param, float_param, int_param, only, str_param
from memd.redact import redact as redact_text
from memd.registry import DirIdentity, Workspace, save_registry
from memd.scopes import ANONYMOUS, Caller, allowed_sources
from memd.service import MemoryService
from memd.sessions.transcript import list_transcripts, render
from memd.text import first_control
from memd.watch import RESCAN_ALL, Watchers
from memd_client.errors import BadRequest, MemdError, PathRefused, Timeout
from memd_client.protocol import PROTOCOL_VERSION

__all__ = ["Api"]

MAX_WAIT_MS = 60_000
MAX_CONTEXT_CHARS = 200_000
APPEND_WAIT_SECONDS = 60.0
PROMOTE_WAIT_SECONDS = 60.0
_CHECKPOINT = re.compile(r"\.checkpoint\..+\.jsonl$", re.IGNORECASE)  # OpenClaw's copies
# How long the first search of a never-indexed workspace waits for its keyword rows.
FIRST_INDEX_WAIT_MS = 10_000
APPEND_KEYS_KEPT = 10_000
APPEND_KEY_SECONDS = 600.0


class Api:
    """Everything the daemon answers; thread-safe (many connection threads call it at once)."""

    def __init__(
        self,
        service: MemoryService,
        indexer: Indexer,
        watchers: Watchers,
        *,
        registry: Path,
        socket_path: str = "",
        recorder: RecallRecorder | None = None,
        schedule: Schedule | None = None,
        clock: Callable[[], datetime] | None = None,
        append_keys: AppendKeys | None = None,
    ) -> None:
        self.service = service
        self.indexer = indexer
        self.watchers = watchers
        self.registry = registry
        self.socket_path = socket_path
        self.recorder = recorder
        self.schedule = schedule
        self.clock = clock
        self.started_at = time.time()
        self.started: dict[str, Any] = {}  # how memd was started (set by the daemon)
        self.model_pull: ModelPull | None = None  # the model fetched in the background, if any
        self.connections = 0
        self._registry_lock = threading.Lock()
        # append's idempotency keys, by (workspace root, key): runs in flight and their
        # results here, and on disk with the writes they guard (a retry after a crash)
        self._once = Once(kept=APPEND_KEYS_KEPT, seconds=APPEND_KEY_SECONDS)
        self._keys = append_keys or AppendKeys(
            None, kept=APPEND_KEYS_KEPT, seconds=APPEND_KEY_SECONDS
        )
        self._process = psutil.Process()

    # -- helpers --------------------------------------------------------------------------------

    def _ws(self, params: Mapping[str, Any]) -> Workspace:
        ref = str_param(params, "workspace")
        assert ref is not None
        return self.service.registry.get(ref)

    def _targets(self, params: Mapping[str, Any]) -> list[Workspace]:
        """The workspace a request names, or every workspace when it names none."""
        if params.get("workspace") is None:
            return self.service.registry.all()
        return [self._ws(params)]

    def freshness(
        self,
        ws: Workspace,
        *,
        since: float | None = None,
        walked_stale: int | None = None,
        mode: str | None = None,
    ) -> dict[str, Any]:
        """The freshness of a reply about ``ws`` that started at ``since`` (default now), in
        ``mode`` (default: the configured search mode, whose vectors must be there too)."""
        claim = check_freshness(
            ws, self.indexer, self.watchers, since=since, walked_stale=walked_stale
        )
        return claim.reply(mode=mode or self.service.config.search.mode)

    def _wait_fresh(self, ws: Workspace, wait_ms: int, *, vectors: bool) -> int:
        """Sync ``ws`` now (a walk of the whole workspace) and wait up to ``wait_ms`` for it,
        and with ``vectors`` for the vectors of what it indexed; return the time waited."""
        start = time.monotonic()
        future = self.indexer.request_sync(ws, priority=URGENT)
        try:
            future.result(timeout=wait_ms / 1000)
            if vectors:
                left = wait_ms / 1000 - (time.monotonic() - start)
                self.indexer.wait_embedded(ws, max(0.0, left))
        except (FutureTimeout, MemdError):
            pass  # the reply's freshness says what is still pending
        return int((time.monotonic() - start) * 1000)

    def now(self) -> datetime:
        """Now, in the user's time zone (the machine's when none is configured)."""
        moment = self.clock() if self.clock else datetime.now(UTC)
        zone = self.service.config.timezone
        return moment.astimezone(ZoneInfo(zone)) if zone else moment.astimezone()

    # -- methods --------------------------------------------------------------------------------

    def _embedder(self) -> dict[str, Any]:
        """What the daemon embeds with (whatever the workspaces), for doctor and status."""
        e = self.service.embedder
        if e is None:
            return {"active": "none", "model": "", "dims": 0, "reason": self.service.choice.reason}
        return {"active": e.provider, "model": e.model, "dims": e.dims}

    def hello(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(params, "client", "protocol", "agent_id", "session_key", "chat_type", "channel")
        return {
            "protocol": PROTOCOL_VERSION,
            "server": "memd",
            "version": __version__,
            "pid": os.getpid(),
            "started": self.started,
            "methods": sorted(METHODS),
        }

    def status(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(params, "workspace")
        targets = self._targets(params)
        with self._process.oneshot():
            daemon = {
                "pid": os.getpid(),
                "version": __version__,
                "started_at": self.started_at,
                "uptime_s": round(time.time() - self.started_at, 1),
                "rss_bytes": self._process.memory_info().rss,
                "sqlite_memory_bytes": apsw.memory_used(),  # page caches, statements, FTS5
                "cpu_percent": self._process.cpu_percent(interval=None),
                "threads": self._process.num_threads(),
                "blas_threads": blas_threads(),
                "readers": self.service.readers.health() if self.service.readers else None,
                "connections": self.connections,
                "socket": self.socket_path,
                "started": self.started,
                "embedder": self._embedder(),
                "model_pull": self.model_pull.status() if self.model_pull else None,
                "missing_workspaces": sorted(self.service.registry.missing),
            }
        workspaces = []
        for ws in targets:
            started = time.time()
            st = self.service.status(ws.name)
            try:
                recalls: dict[str, Any] = RecallStore(
                    ws.root, folder=ws.dream_place.folder
                ).counts()
            except Exception as exc:  # a damaged store is reported, not fatal
                recalls = {"error": str(exc)}
            nxt = self.schedule.next_run() if self.schedule else None
            st["dreaming"] = {
                "recall_store": recalls,
                "last_runs": last_runs(ws.root, ws.dream_place.folder),
                "enabled": self.service.config.dreaming.enabled,
                "next_run": nxt.isoformat() if nxt else None,
            }
            # status walked the workspace itself: that walk vouches for its files
            st["freshness"] = self.freshness(ws, since=started, walked_stale=st["files_stale"])
            watcher = self.watchers.state(ws.root)
            watcher["pending_keys"] = sorted(watcher.get("pending_keys") or ())
            st["watcher"] = watcher
            workspaces.append(st)
        # What the remote provider is sent, today and in total, and its batches: daemon-wide.
        return {
            "daemon": daemon,
            "embedding": self.service.provider_costs(),
            "workspaces": workspaces,
        }

    def _sources(self, ws: Workspace, caller: Caller, requested: Any) -> tuple[list[str], bool]:
        """(the index sources this caller may search here, whether MEMORY.md is excluded)."""
        if requested is None or requested == "all" or requested == ["all"]:
            wanted = {"memory", "sessions"}
        elif isinstance(requested, str) and requested in ("memory", "sessions"):
            wanted = {requested}
        elif (
            isinstance(requested, list)
            and requested
            and all(s in ("memory", "sessions", "all") for s in requested)
        ):
            wanted = {"memory", "sessions"} if "all" in requested else set(requested)
        else:
            raise BadRequest("sources must be 'memory', 'sessions', 'all' or a list of them")
        allowed = allowed_sources(caller, self.service.config.scopes)
        sources: list[str] = [s for s in ("memory", "sessions") if s in wanted and s in allowed]
        if "sessions" in sources and not self._may_see_sessions(ws, caller):
            sources.remove("sessions")
        return sources, "longterm" not in allowed

    def _embeds(self, ws: Workspace) -> bool:
        return ws.syncer.embedder is not None

    @staticmethod
    def _may_see_sessions(ws: Workspace, caller: Caller) -> bool:
        # Transcripts are returned only to their own agent; an anonymous caller sees none.
        return bool(caller.agent_id) and caller.agent_id == ws.agent_id

    def search(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(
            params,
            "workspace",
            "query",
            "max_results",
            "min_score",
            "mode",
            "wait_ms",
            "decay",
            "mmr",
            "sources",
        )
        started = time.time()  # the reply vouches for the files as they were now
        ws = self._ws(params)
        query = str_param(params, "query")
        assert query is not None
        if len(query) > 4096:
            raise BadRequest("query is longer than 4096 characters")
        mode = str_param(params, "mode", required=False)
        if mode is not None and mode not in ("hybrid", "keyword", "vector"):
            raise BadRequest("mode must be hybrid, keyword or vector")
        wait_ms = int_param(params, "wait_ms", 0, MAX_WAIT_MS, 0) or 0
        sources, no_longterm = self._sources(ws, caller, params.get("sources"))
        max_results = (
            int_param(params, "max_results", 1, 100) or self.service.config.search.max_results
        )
        if not wait_ms and ws.syncer.last_sync is None and self.service.never_indexed(ws):
            # A workspace added a moment ago: its keyword rows come from the writer first.
            wait_ms = FIRST_INDEX_WAIT_MS
        asked = mode or self.service.config.search.mode
        waited = (
            self._wait_fresh(ws, wait_ms, vectors=asked != "keyword" and self._embeds(ws))
            if wait_ms
            else 0
        )
        # Checked before the search reads: what is indexed now is in the snapshot it reads.
        claim = check_freshness(
            ws,
            self.indexer,
            self.watchers,
            since=started,
            waited_ms=waited,
            synced=bool(wait_ms),
        )
        results: list[dict[str, Any]] = []
        outcome = None
        if sources:
            outcome = self.service.search(
                ws.name,
                query,
                index_first=False,
                # MEMORY.md hits are dropped below for callers that may not see them: ask for
                # a few more so the reply still has max_results when it can.
                max_results=min(100, max_results + (5 if no_longterm else 0)),
                min_score=float_param(params, "min_score", 0.0, 1.0),
                mode=mode,
                decay=bool_param(params, "decay"),
                mmr=bool_param(params, "mmr"),
                sources=tuple(sources),
            )
            # Long-term memory by what each file is, not its name: a hard link or a bind mount
            # of MEMORY.md is MEMORY.md.
            longterm = Longterm(ws.root) if no_longterm else None
            results = [
                h.to_dict()
                for h in outcome.results
                if not (longterm is not None and longterm.holds(h.path))
            ][:max_results]
        memory_hits = [r for r in results if r["source"] == "memory"]
        if self.recorder is not None and self.service.config.dreaming.record_recalls:
            # off the reply path
            self.recorder.submit(ws.root, query, memory_hits, folder=ws.dream_place.folder)
        return {
            "results": results,
            "freshness": claim.reply(mode=outcome.mode if outcome else "keyword", searched=True),
            "provider": outcome.provider if outcome else "none",
            "model": outcome.model if outcome else "",
            "mode": outcome.mode if outcome else (mode or "hybrid"),
            "note": outcome.note if outcome else "no source this caller may search",
            "sources": sources,
        }

    def get(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(params, "workspace", "path", "from", "lines")
        ws = self._ws(params)
        path = params.get("path")
        if not isinstance(path, str):
            raise BadRequest("path must be a string")
        allowed = allowed_sources(caller, self.service.config.scopes)

        def check(target: MemoryPath | str) -> None:
            """The one access decision of ``get``, on the resolved target."""
            if isinstance(target, str):  # a session transcript
                if "sessions" not in allowed or not self._may_see_sessions(ws, caller):
                    raise PathRefused(
                        "path refused: session transcripts are visible to their own agent only"
                    )
            elif target.longterm and "longterm" not in allowed:
                raise PathRefused("path refused: long-term memory is not available in this chat")
            elif "memory" not in allowed:
                raise PathRefused("path refused: memory is not available in this chat")

        result = self.service.get(
            ws.name,
            path,
            int_param(params, "from", 1, 10**9, 1) or 1,
            int_param(params, "lines", 1, 10_000),
            check=check,
        )
        return {
            "path": result.path,
            "text": result.text,
            "from": result.from_line,
            "lines": result.lines,
            "truncated": result.truncated,
            "next_from": result.next_from,
            "missing": result.missing,
            "freshness": self.freshness(ws),
        }

    def context(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        """The session-start context: MEMORY.md, today's and yesterday's logs, under a budget."""
        only(params, "workspace", "max_chars")
        ws = self._ws(params)
        max_chars = int_param(params, "max_chars", 1, MAX_CONTEXT_CHARS) or DEFAULT_CONTEXT_CHARS
        allowed = allowed_sources(caller, self.service.config.scopes)
        day = self.now().date()
        if "memory" not in allowed:
            sections = []
        else:
            sections = session_context(
                ws.root,
                day=day,
                max_chars=max_chars,
                longterm="longterm" in allowed,
                check=functools.partial(self._check_longterm, allowed),
                extra_paths=ws.extra_paths,
            )
        parts = [f"## {s.title}: {s.citation}\n{s.text}" for s in sections]
        return {
            "text": "\n\n".join(parts),
            "sections": [
                {
                    "path": s.path,
                    "title": s.title,
                    "start_line": s.start_line,
                    "end_line": s.end_line,
                    "total_lines": s.total_lines,
                    "truncated": s.truncated,
                    "citation": s.citation,
                    "text": s.text,
                }
                for s in sections
            ],
            "date": day.isoformat(),
            "max_chars": max_chars,
            "longterm": "longterm" in allowed,
            "freshness": self.freshness(ws),
        }

    @staticmethod
    def _check_longterm(allowed: set[str], target: MemoryPath) -> None:
        # A daily log that is a symlink to MEMORY.md is long-term memory too.
        if target.longterm and "longterm" not in allowed:
            raise PathRefused("long-term memory is not available in this chat")

    def flush_plan(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        """When and how an agent host flushes a session to memory before compaction."""
        only(params, "workspace")
        self._ws(params)
        return flush_plan(self.now(), timezone=self.service.config.timezone)

    def append(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(params, "workspace", "text", "idempotency_key", "path", "flush")
        ws = self._ws(params)
        text = str_param(params, "text")
        assert text is not None
        day = self.now().date()
        path = str_param(params, "path", required=False)
        if path is not None:  # the caller says where it means to write: only today's log
            check_flush_target(path, day)
        if bool_param(params, "flush") and is_silent(text):
            # A flush that found nothing worth keeping: nothing is written.
            return {
                "path": daily_log(day),
                "start_line": None,
                "end_line": None,
                "written": False,
                "note": f"{SILENT_REPLY}: nothing to store",
                "freshness": self.freshness(ws),
            }
        bad = first_control(text.replace("\r\n", "\n"), allowed="\t\n")
        if bad is not None:
            raise BadRequest(
                f"text holds the control character U+{ord(bad):04X}; only tab and newline are "
                "allowed (escape sequences in memory would reach every terminal that shows it)"
            )
        key = params.get("idempotency_key")
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 128):
            raise BadRequest("idempotency_key must be a string of 1 to 128 characters")
        if key is None:
            return self._append(ws, text, day)
        result, duplicate = self._once.run(
            (ws.root, key),
            text,
            lambda: self._append_keyed(ws, key, text, day),
            wait=APPEND_WAIT_SECONDS,
        )
        if duplicate or result.get("duplicate"):
            result["duplicate"] = True
            result["freshness"] = self.freshness(ws)
        return result

    def _append_keyed(self, ws: Workspace, key: str, text: str, day: date) -> dict[str, Any]:
        """An append under a key that outlives the daemon: the key is on disk before the text
        (memd/once.py, AppendKeys), so a retry after a crash learns whether the text landed
        and writes it only if it did not. MEMD_CRASH_AT stops the daemon between the steps."""
        crash_point("append:received")
        earlier = self._keys.recall(ws.root, key, text)
        if earlier is not None:
            # Written before a crash (or before this process forgot the key): it may not be
            # indexed yet, and the reply promises that it is searchable.
            with contextlib.suppress(FutureTimeout, MemdError):
                future = self.indexer.request_sync(ws, {earlier["path"]}, priority=URGENT)
                future.result(timeout=APPEND_WAIT_SECONDS)
            return {**earlier, "written": True, "note": None, "duplicate": True}
        self._keys.intend(ws.root, key, text, daily_log(day))
        crash_point("append:intent")
        result = self._append(ws, text, day)
        crash_point("append:written")
        self._keys.done(ws.root, key, result)
        crash_point("append:done")
        return result

    def _append(self, ws: Workspace, text: str, day: date) -> dict[str, Any]:
        try:
            appended = self.indexer.append(ws, text, day=day).result(timeout=APPEND_WAIT_SECONDS)
        except FutureTimeout:
            raise Timeout(
                f"append: the index did not catch up within {APPEND_WAIT_SECONDS:g} s; "
                "the text is on disk"
            ) from None
        limit = self.service.config.index.max_file_bytes
        try:
            size = (ws.root / appended.path).stat().st_size
        except OSError:
            size = 0
        note = None
        if size > limit:
            note = (
                f"{appended.path} is {size} bytes, over index.max_file_bytes ({limit}): only its "
                f"first {limit} bytes are indexed, so this text is on disk but not searchable "
                "until the limit is raised"
            )
        return {
            "path": appended.path,
            "start_line": appended.start_line,
            "end_line": appended.end_line,
            "written": True,
            "note": note,
            "freshness": self.freshness(ws),
        }

    def record_recall(
        self, params: Mapping[str, Any], caller: Caller = ANONYMOUS
    ) -> dict[str, Any]:
        only(params, "workspace", "query", "results")
        ws = self._ws(params)
        query = str_param(params, "query")
        results = params.get("results")
        if not isinstance(results, list) or len(results) > 100:
            raise BadRequest("results must be a list of at most 100 items")
        clean = []
        for item in results:
            if not isinstance(item, dict):
                raise BadRequest("each result must be a map with path, start_line, end_line")
            path = str_param(item, "path")
            start = int_param(item, "start_line", 1, 10**9)
            end = int_param(item, "end_line", 1, 10**9)
            if start is None or end is None or end < start:
                raise BadRequest("each result needs start_line <= end_line")
            score = float_param(item, "score", 0.0, 1.0)
            clean.append({"path": path, "start_line": start, "end_line": end, "score": score})
        store = RecallStore(
            ws.root,
            folder=ws.dream_place.folder,
            timezone=self.service.config.timezone,
            clock=self.clock,
        )
        with _workspace_write("record recalls"):
            return {"recorded": store.record(query or "", clean)}

    def promote(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(
            params,
            "workspace",
            "apply",
            "explain",
            "include_promoted",
            "limit",
            "min_score",
            "min_recall_count",
            "min_unique_queries",
        )
        ws = self._ws(params)
        thresholds = MANUAL
        overrides: dict[str, Any] = {}
        if (v := int_param(params, "limit", 1, 1000)) is not None:
            overrides["limit"] = v
        if (f := float_param(params, "min_score", 0.0, 1.0)) is not None:
            overrides["min_score"] = f
        if (v := int_param(params, "min_recall_count", 0, 10_000)) is not None:
            overrides["min_recall_count"] = v
        if (v := int_param(params, "min_unique_queries", 0, 10_000)) is not None:
            overrides["min_unique_queries"] = v
        if overrides:
            thresholds = dataclasses.replace(thresholds, **overrides)
        if self.recorder is not None:
            self.recorder.wait_idle()
        explain = str_param(params, "explain", required=False)
        include_promoted = bool(bool_param(params, "include_promoted"))
        with _workspace_write("promote"):
            if bool_param(params, "apply"):
                # MEMORY.md is written by the writer, and searchable before the reply.
                future = self.indexer.promote(
                    ws, thresholds, explain=explain, include_promoted=include_promoted
                )
                try:
                    result = future.result(timeout=PROMOTE_WAIT_SECONDS)
                except FutureTimeout:
                    raise Timeout(
                        f"promote: the writer did not finish within {PROMOTE_WAIT_SECONDS:g} s; "
                        "the promotion goes on and MEMORY.md will show it"
                    ) from None
            else:  # a dry run only reads
                result = run_promotion(
                    ws.root,
                    thresholds,
                    explain=explain,
                    include_promoted=include_promoted,
                    max_chars=self.service.config.dreaming.memory_max_chars,
                    timezone=self.service.config.timezone,
                    clock=self.clock,
                    folder=ws.dream_place.folder,
                    redact=self.service.config.index.redact,
                )
        result = self._shown_to(ws, caller, result)
        result["workspace"] = ws.name
        return result

    def dream(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        """Run dreaming's phases (all three unless ``phase`` names one); ``apply`` writes the
        recall store, MEMORY.md and DREAMS.md, and replies once they are searchable."""
        only(params, "workspace", "phase", "apply")
        ws = self._ws(params)
        phase = str_param(params, "phase", required=False) or "all"
        if phase not in ("all", *PHASES):
            raise BadRequest(f"phase must be light, rem, deep or all, not {phase!r}")
        phases = PHASES if phase == "all" else (phase,)
        if self.recorder is not None:
            self.recorder.wait_idle()
        with _workspace_write("dream"):
            if bool_param(params, "apply"):
                future = self.start_dream(ws, phases)
                try:
                    result = future.result(timeout=PROMOTE_WAIT_SECONDS)
                except FutureTimeout:
                    raise Timeout(
                        f"dream: the writer did not finish within {PROMOTE_WAIT_SECONDS:g} s; "
                        "the run goes on and DREAMS.md will show it"
                    ) from None
            else:  # a preview computes the run on copies and writes nothing
                result = self._dream(ws, phases, apply=False)
        result = self._shown_to(ws, caller, result)
        result["workspace"] = ws.name
        return result

    def _shown_to(self, ws: Workspace, caller: Caller, result: dict[str, Any]) -> dict[str, Any]:
        """A dreaming reply as ``caller`` may see it: what came from the workspace's
        transcripts only for a caller that may see them (memd/dreams/privacy.py)."""
        if self._may_see_sessions(ws, caller):
            return result
        shown, left_out = without_transcripts(result)
        shown["withheld_from_transcripts"] = left_out
        return dict(shown)

    def start_dream(self, ws: Workspace, phases: Sequence[str] = PHASES) -> Future[dict[str, Any]]:
        """Queue a dreaming run that writes (the schedule's, or ``dream`` with ``apply``)."""
        return self.indexer.dream(ws, functools.partial(self._dream, ws, phases, apply=True))

    def _dream(self, ws: Workspace, phases: Sequence[str], *, apply: bool) -> dict[str, Any]:
        config = self.service.config
        embedder = self.service.embedder
        threshold = meaning_threshold(embedder.model) if embedder is not None else None
        options = DreamOptions(
            phases=phases,
            apply=apply,
            memory_max_chars=config.dreaming.memory_max_chars,
            diary_max_chars=config.dreaming.diary_max_chars,
            timezone=config.timezone,
            redact=config.index.redact,
        )
        result = run_dream(
            ws.root,
            options,
            vectors=cached_vectors(embedder, self.service.cache)
            if embedder and threshold
            else None,
            meaning_threshold=threshold,
            transcripts=(
                functools.partial(_transcripts, ws.sessions_dir, redact=config.index.redact)
                if ws.sessions_dir is not None
                else None
            ),
            clock=self.clock,
            folder=ws.dream_place.folder,
        )
        if apply:
            result["written"] = [DIARY_FILE, *(["MEMORY.md"] if _promoted(result) else [])]
        return result

    def reindex(self, params: Mapping[str, Any], caller: Caller = ANONYMOUS) -> dict[str, Any]:
        only(params, "workspace", "force", "wait", "dry_run")
        targets = self._targets(params)
        force = bool(bool_param(params, "force"))
        wait = bool_param(params, "wait")
        if bool_param(params, "dry_run"):
            if not force:
                raise BadRequest("dry_run estimates a rebuild: it goes with force")
            # Nothing is queued or written: what a rebuild would send, counted here.
            return {"estimates": [self._estimate(ws) for ws in targets]}
        futures = [(ws, self.indexer.reindex(ws, force=force)) for ws in targets]
        if wait is False:
            return {"queued": [ws.name for ws, _ in futures]}
        reports = []
        for ws, future in futures:
            r = future.result()
            reports.append(
                {
                    "workspace": ws.name,
                    "scanned": r.scanned,
                    "indexed": r.indexed,
                    "unchanged": r.unchanged,
                    "removed": r.removed,
                    "embedded": r.embedded,
                    "pending_files": r.pending_files,
                    "rebuilt": r.rebuilt,
                    "errors": [list(e) for e in r.errors],
                    "seconds": round(r.seconds, 3),
                }
            )
        return {"workspaces": reports}

    def _estimate(self, ws: Workspace) -> dict[str, Any]:
        embedder = self.service.embedder
        return {
            "workspace": ws.name,
            "provider": embedder.provider if embedder else "none",
            "model": embedder.model if embedder else "fts-only",
            **ws.syncer.estimate(),
        }

    def workspace_add(
        self, params: Mapping[str, Any], caller: Caller = ANONYMOUS
    ) -> dict[str, Any]:
        only(params, "path", "name", "extra_paths", "sessions_dir", "agent_id")
        path = str_param(params, "path")
        assert path is not None
        if not os.path.isabs(path):
            raise BadRequest("path must be absolute")
        extra = params.get("extra_paths") or []
        if not isinstance(extra, list) or not all(isinstance(e, str) for e in extra):
            raise BadRequest("extra_paths must be a list of strings")
        sessions_dir = str_param(params, "sessions_dir", required=False) or ""
        if sessions_dir and not os.path.isabs(sessions_dir):
            raise BadRequest("sessions_dir must be absolute")
        name = str_param(params, "name", required=False) or ""
        agent_id = str_param(params, "agent_id", required=False) or ""
        registry = self.service.registry
        known = registry.find_root(path)
        if known is not None:
            # Added again with other settings: those given replace the registered ones.
            changed = registry.update(
                known,
                name=name,
                extra_paths=tuple(extra) if "extra_paths" in params else None,
                sessions_dir=sessions_dir,
                agent_id=agent_id,
            )
            now = DirIdentity.of(known.root)
            if now is not None and (known.identity is None or not known.identity.same(now)):
                # Another directory at the registered path (a drive mounted elsewhere, a
                # directory put in place of the old one): adding it again follows it.
                known.identity = now
                changed.append("directory")
            if changed:
                self._save_registry()
                self.watchers.unwatch(known.root)
                self.watchers.watch(known.root, known.extra_paths, self.indexer.changes_of(known))
                self.indexer.request_sync(known, {RESCAN_ALL})
            return {**_ws_entry(known), "added": False, "updated": changed}
        ws = registry.add(
            path, name=name, extra_paths=tuple(extra), sessions_dir=sessions_dir, agent_id=agent_id
        )
        self._save_registry()
        self.watchers.watch(ws.root, ws.extra_paths, self.indexer.changes_of(ws))
        self.indexer.request_sync(ws)
        return {**_ws_entry(ws), "added": True, "updated": []}

    def workspace_remove(
        self, params: Mapping[str, Any], caller: Caller = ANONYMOUS
    ) -> dict[str, Any]:
        only(params, "workspace")
        ref = str_param(params, "workspace")
        if ref is not None and self.service.registry.forget_missing(ref):
            self._save_registry()
            return {"removed": True}
        ws = self._ws(params)
        self.watchers.unwatch(ws.root)
        removed = self.service.registry.remove(ws.name)
        self._save_registry()
        return {"removed": removed}

    def workspace_list(
        self, params: Mapping[str, Any], caller: Caller = ANONYMOUS
    ) -> dict[str, Any]:
        only(params)
        return {
            "workspaces": [_ws_entry(ws) for ws in self.service.registry.all()],
            "missing": list(self.service.registry.missing.values()),
        }

    # -- registry -------------------------------------------------------------------------------

    def _save_registry(self) -> None:
        entries = [
            # with which directory was registered (Workspace.root_problem)
            {**_ws_entry(ws), **(ws.identity.to_entry() if ws.identity else {})}
            for ws in self.service.registry.all()
        ]
        entries += list(self.service.registry.missing.values())  # kept until they come back or go
        with self._registry_lock:
            save_registry(self.registry, entries)


def _ws_entry(ws: Workspace) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": ws.name,
        "path": str(ws.root),
        "extra_paths": list(ws.extra_paths),
    }
    if ws.sessions_dir is not None:
        entry["sessions_dir"] = str(ws.sessions_dir)
        entry["agent_id"] = ws.agent_id
    return entry


def _transcripts(directory: Path, *, redact: bool) -> list[Transcript]:
    """The live transcripts of ``directory`` for dreaming, each rendered when it is read
    (redacted as the index redacts them); checkpoint copies and dreaming's own runs left out."""

    def reader(path: Path) -> list[Message]:
        rendered = render(path.read_bytes(), redact=redact_text if redact else None)
        if rendered.dreaming_narrative:
            return []
        lines = rendered.text.split("\n") if rendered.text else []
        return [
            Message(line, at, text)
            for line, at, text in zip(rendered.line_map, rendered.timestamps, lines, strict=True)
        ]

    files, _complete = list_transcripts(directory)
    return [
        Transcript(f.name, f.size, f.mtime_ns, functools.partial(reader, f.abs))
        for f in files
        if not f.archived and not _CHECKPOINT.search(f.name)
    ]


def _promoted(result: Mapping[str, Any]) -> bool:
    deep = result.get("deep")
    return bool(deep and deep.get("applied"))


@contextlib.contextmanager
def _workspace_write(what: str) -> Iterator[None]:
    """A write into the workspace the OS refuses (read-only, disk full) is a typed error."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise PathRefused(f"cannot {what}: {exc.strerror or exc}{where}") from None


METHODS = (
    "hello",
    "status",
    "search",
    "get",
    "append",
    "record_recall",
    "reindex",
    "workspace_add",
    "workspace_remove",
    "workspace_list",
    "promote",
    "dream",
    "context",
    "flush_plan",
)
