"""The single writer: one thread applies every index write of every workspace.

Watcher batches, periodic reconciles, appends, promotions into MEMORY.md and read-your-writes
waits all become jobs on one priority queue; between jobs, when no sync is queued, the thread
embeds a step of the pending text (EMBED_STEP_CHARS), so a long embedding backlog never holds
up a write that someone waits for. A write someone waits for indexes only the files it wrote,
and a sync of many changed files (a ``git checkout``) goes SYNC_SLICE files at a time, so an
append waits for one slice of a bulk edit, not all of it. A rebuild runs on a thread of its
own, building a new file while the live index serves; a reindex asked for meanwhile waits for
it and gets its report, and shutdown abandons it (the old index stays).

Over 400 lines: every kind of write the one writer thread takes, with its queueing.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

from memd.clock import Clock
from memd.embed.queued import DOCUMENT_JOB_CHARS
from memd.index.index import reads_first
from memd.index.sync import SyncReport
from memd.markdown.append import Appended, append_daily
from memd.registry import Workspaces
from memd.watch.layout import RESCAN_ALL, RESCANS
from memd.workspace import Workspace
from memd_client.errors import Busy, IndexError_, PathRefused, UnknownWorkspace

__all__ = ["Writer", "URGENT", "WATCH", "RECONCILE"]

logger = logging.getLogger(__name__)

URGENT, WATCH, RECONCILE = 0, 1, 2
T = TypeVar("T")

# Changed files one sync job indexes before the jobs queued behind it get a turn. A file takes
# a few milliseconds; 64 of them keep an append's wait during a bulk edit well under a second.
SYNC_SLICE = 64
# New text the writer embeds between two jobs. A file's texts are embedded over as many steps
# as it takes (they wait in the embedding cache), so an append waits for one step, not for a
# whole file (a daily log of 30 chunks is 20 s of a slow CPU).
EMBED_STEP_CHARS = DOCUMENT_JOB_CHARS
# How long shutdown waits for a rebuild to stop: it stops between two files or two embedding
# steps (memd/index/sync.py), and its temporary file is removed.
REBUILD_STOP_S = 5.0


class _RebuildCancelled(BaseException):
    """Raised inside a rebuild (from its progress callback) when memd stops. A BaseException:
    no ``except Exception`` on the way may take it for a provider failure."""


@dataclass(order=True)
class _Job:
    priority: int
    seq: int
    kind: str = field(compare=False)
    root: Path = field(compare=False)
    future: Future[Any] = field(compare=False)
    payload: Any = field(compare=False, default=None)


@dataclass
class _State:
    """What the writer knows of one workspace."""

    dirty: set[str] = field(default_factory=set)
    queued: _Job | None = None  # the not yet started sync job, which later requests join
    running: set[str] = field(default_factory=set)  # the keys the running sync took
    rebuild: threading.Thread | None = None
    # Who waits for the running rebuild's report (None: no rebuild runs).
    waiters: list[Future[SyncReport]] | None = None
    sync_started_at: float = 0.0  # wall-clock start of the last sync that completed
    rescanned_at: float = 0.0  # wall-clock start of the last complete walk without errors
    walk_errors: list[tuple[str, str]] = field(default_factory=list)  # of the last walk


class Writer:
    def __init__(
        self,
        workspaces: Workspaces,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.clock = clock or Clock()  # today's date for appends (a reload sets a new one)
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._seq = itertools.count(1)
        self._states: dict[Path, _State] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._abandon = threading.Event()  # rebuilds stop at their next step (memd stops)
        self._thread = threading.Thread(target=self._run, name="memd-writer", daemon=True)
        self._embed_cursor = 0
        self.jobs_done = 0
        # Notified after every job and embedding step (read-your-writes waits for vectors).
        self._progress = threading.Condition()
        self._steps = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the running job, then stop; queued jobs fail with a clear error. A rebuild is
        abandoned (it stops within REBUILD_STOP_S; the old index stays)."""
        deadline = time.monotonic() + REBUILD_STOP_S
        self.abandon_rebuilds()
        self._stopping.set()
        self._queue.put(_Job(-1, 0, "stop", Path("/"), Future()))
        self._thread.join(timeout)
        for ws in self.workspaces.all():  # a wave of requests in flight ends within its timeout
            ws.syncer.settle(timeout)
        with self._lock:  # none starts once stopping is set
            rebuilds = [s.rebuild for s in self._states.values() if s.rebuild is not None]
        for t in rebuilds:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive():
                logger.warning("%s did not stop within %g s", t.name, REBUILD_STOP_S)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job.kind != "stop" and job.future.set_running_or_notify_cancel():
                job.future.set_exception(Busy("memd is shutting down"))

    def abandon_rebuilds(self) -> None:
        """Stop every rebuild at its next file or embedding step (its temporary file goes, the
        old index stays) and answer whoever waits for one (Busy): the first step of shutdown,
        before the connections waiting for those answers are closed."""
        self._abandon.set()

    # -- requests -------------------------------------------------------------------------------

    def _state(self, root: Path) -> _State:
        with self._lock:
            return self._states.setdefault(root, _State())

    def request_sync(
        self, ws: Workspace, keys: set[str] | None = None, *, priority: int = WATCH
    ) -> Future[SyncReport]:
        """Queue a sync of ``ws`` (joining one already queued); ``keys`` are the changed paths."""
        with self._lock:
            state = self._states.setdefault(ws.root, _State())
            state.dirty.update(keys or {RESCAN_ALL})
            job = state.queued
            if job is not None and job.priority <= priority:
                return job.future
            job = _Job(priority, next(self._seq), "sync", ws.root, Future())
            if state.queued is not None:
                # A more urgent request: the new job replaces the queued one, which then
                # resolves with the new job's report.
                older = state.queued
                job.future.add_done_callback(functools.partial(_relay, target=older.future))
                older.kind = "skip"
            state.queued = job
        self._check_running()
        self._queue.put(job)
        return job.future

    def changes_of(self, ws: Workspace) -> Callable[[set[str]], None]:
        """What a watcher of ``ws`` reports its changed keys to: a sync request."""

        def changed(keys: set[str]) -> None:
            try:
                self.request_sync(ws, keys)
            except Busy:
                pass  # shutting down

        return changed

    def append(self, ws: Workspace, text: str, *, day: date | None = None) -> Future[Appended]:
        """Append ``text`` to the daily log of ``ws`` for ``day`` (today in the user's time zone
        when not given); resolves once it is searchable."""
        job = _Job(URGENT, next(self._seq), "append", ws.root, Future(), payload=(text, day))
        self._check_running()
        self._queue.put(job)
        return job.future

    def submit(
        self,
        ws: Workspace,
        work: Callable[[], T],
        *,
        indexes: Iterable[str] | Callable[[T], Iterable[str]] = (),
        priority: int = URGENT,
    ) -> Future[T]:
        """Run ``work`` (a write into ``ws``'s files) on the writer, then index exactly the
        files it wrote (``indexes``: their workspace paths, or a function of its result that
        names them); the future resolves with its result once they are searchable."""
        job = _Job(priority, next(self._seq), "work", ws.root, Future(), payload=(work, indexes))
        self._check_running()
        self._queue.put(job)
        return job.future

    def reindex(self, ws: Workspace, *, force: bool) -> Future[SyncReport]:
        """Sync ``ws`` comparing every file's content, or (``force``) rebuild it. While a rebuild
        runs, either waits for it and resolves with its report: it reads every file anew."""
        self._check_running()
        # Asked for (after fixing a provider or freeing disk): failed embedding retries now.
        ws.syncer.reset_backoff()
        future: Future[SyncReport] = Future()
        if self._join_rebuild(ws, future):
            return future
        if not force:
            ws.syncer.look_next = True  # every file's content is compared, not its size and mtime
            return self.request_sync(ws, priority=URGENT)
        self._start_rebuild(ws, future)
        return future

    def dirty_keys(self, ws: Workspace) -> set[str]:
        """The changed paths not yet indexed in ``ws``: queued for the next sync, or being
        indexed by the running one (and rescan keys, RESCANS)."""
        queued, running = self.pending_keys(ws)
        return queued | running

    def pending_keys(self, ws: Workspace) -> tuple[set[str], set[str]]:
        """(the changed paths queued for the next sync of ``ws``, those the running sync is
        indexing now); either may hold a rescan key (RESCANS)."""
        with self._lock:
            state = self._states.get(ws.root)
            return (set(state.dirty), set(state.running)) if state else (set(), set())

    def rescanned_since(self, ws: Workspace, when: float) -> bool:
        """True when a walk of the whole workspace that started after ``when`` (wall clock)
        has completed without errors: every file as it was at ``when`` is indexed."""
        with self._lock:
            state = self._states.get(ws.root)
            return state is not None and state.rescanned_at > when

    def walk_errors(self, ws: Workspace) -> list[tuple[str, str]]:
        """The files the last walk of ``ws`` could not index, with why (a walk with any does
        not vouch for the workspace: those files are not in the index)."""
        with self._lock:
            state = self._states.get(ws.root)
            return list(state.walk_errors) if state else []

    def wait_embedded(self, ws: Workspace, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no file of ``ws`` lacks vectors; False when some
        still does (the time ran out, or nothing embeds now: no provider, a failure's backoff,
        a rebuild)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._progress:
                seen = self._steps
            if not ws.syncer.has_pending():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not self._may_embed(ws) or self._stopping.is_set():
                return False
            with self._progress:
                if self._steps == seen:
                    self._progress.wait(left)

    def _stepped(self) -> None:
        with self._progress:
            self._steps += 1
            self._progress.notify_all()

    def pending(self, ws: Workspace) -> int:
        """Changed paths known to the writer and not yet indexed (a rescan counts as one)."""
        with self._lock:
            state = self._states.get(ws.root)
            return len(state.dirty) if state else 0

    def synced_since(self, ws: Workspace, when: float) -> bool:
        """True when a sync that started after ``when`` (wall clock) has completed."""
        with self._lock:
            state = self._states.get(ws.root)
            return state is not None and state.sync_started_at > when

    def _check_running(self) -> None:
        if self._stopping.is_set():
            raise Busy("memd is shutting down")

    # -- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        reads_first()
        while True:
            idle = not self._has_embedding_work()
            try:
                job = self._queue.get(timeout=0.5 if idle else 0.0)
            except queue.Empty:
                job = None
            if job is not None:
                if job.kind == "stop":
                    return
                self._do(job)
                self.jobs_done += 1
                self._stepped()
            if self._stopping.is_set():
                return
            if not self._syncs_queued():  # changed files' keyword rows before any vectors
                self._embed_one()

    def _syncs_queued(self) -> bool:
        with self._lock:
            return any(state.queued is not None for state in self._states.values())

    def _do(self, job: _Job) -> None:
        if job.kind == "skip" or not _claim(job.future):
            return
        ws = self._workspace(job.root)
        if ws is None:
            job.future.set_exception(UnknownWorkspace(f"workspace {job.root} was removed"))
            return
        problem = ws.root_problem()
        if problem is not None:
            # Not the directory registered (unmounted, replaced) or gone: nothing is written
            # into it and its index is kept as it is; the changed paths stay pending.
            with self._lock:
                state = self._states.setdefault(ws.root, _State())
                if state.queued is job:
                    state.queued = None
            logger.debug("%s of %s refused: %s", job.kind, ws.name, problem)
            job.future.set_exception(PathRefused(problem))
            return
        try:
            if job.kind == "sync":
                report = self._sync(ws, job)
                if job.payload is not None:  # the report of its earlier slices
                    job.payload.add(report)
                    report = job.payload
                if not self._go_on(ws, job, report):  # else it goes on with the rest later
                    job.future.set_result(report)
            elif job.kind == "append":
                self._append_batch(ws, job)
            elif job.kind == "work":
                work, indexes = job.payload
                result = work()
                written = set(indexes(result) if callable(indexes) else indexes)
                if written:
                    self._sync(ws, None, only=written)
                job.future.set_result(result)
        except Exception as exc:  # handed to whoever waits; the writer goes on
            logger.warning("%s of %s failed: %s", job.kind, ws.name, exc)
            job.future.set_exception(exc)

    def _go_on(self, ws: Workspace, job: _Job, report: SyncReport) -> bool:
        """Queue ``job`` again when changed files remain after its slice (True), behind the
        jobs already queued; a sync requested meanwhile takes the rest instead, and ``job``
        resolves with it."""
        with self._lock:
            state = self._states.setdefault(ws.root, _State())
            if not state.dirty:
                return False
            job.payload = report
            newer = state.queued
            if newer is None:
                # Behind what came meanwhile, ahead of what comes next: a stream of appends
                # takes turns with the slices instead of starving them.
                job.priority, job.seq = URGENT, next(self._seq)
                state.queued = job
        if newer is None:
            self._queue.put(job)
        else:
            newer.future.add_done_callback(functools.partial(_relay, target=job.future))
        return True

    def _append_batch(self, ws: Workspace, first: _Job) -> None:
        """Write ``first`` and every other append queued for the same workspace, then make
        them searchable with one sync: 60 queued appends cost one re-index of the daily log,
        not 60, and an edit in another workspace waits behind one batch, not all of them."""
        batch = [first, *self._take_queued_appends(ws.root)]
        written: list[tuple[_Job, Appended]] = []
        for job in batch:
            if job is not first and not job.future.set_running_or_notify_cancel():
                continue
            try:
                text, day = job.payload
                appended = append_daily(ws.root, text, day=day or self.clock.today())
            except Exception as exc:
                logger.warning("append to %s failed: %s", ws.name, exc)
                job.future.set_exception(exc)
                continue
            written.append((job, appended))
        if not written:
            return
        try:
            self._sync(ws, None, only={appended.path for _, appended in written})
        except IndexError_ as exc:  # the text is on disk: say so, or a retry doubles it
            for job, appended in written:
                job.future.set_exception(
                    IndexError_(
                        f"append: the text is on disk in {appended.path} (lines "
                        f"{appended.start_line}-{appended.end_line}) but not searchable yet: {exc}"
                    )
                )
            return
        except Exception as exc:
            for job, _ in written:
                job.future.set_exception(exc)
            return
        for job, appended in written:
            job.future.set_result(appended)

    def _take_queued_appends(self, root: Path, limit: int = 256) -> list[_Job]:
        """Remove and return the appends queued for ``root``, oldest first."""
        with self._queue.mutex:
            heap = self._queue.queue
            mine = sorted(j for j in heap if j.kind == "append" and j.root == root)[:limit]
            if mine:
                taken = {id(j) for j in mine}
                heap[:] = [j for j in heap if id(j) not in taken]
                heapq.heapify(heap)
        return mine

    def _sync(self, ws: Workspace, job: _Job | None, only: set[str] | None = None) -> SyncReport:
        """Index the files the writer itself wrote (``only``), or the changed files: all of
        them when a rescan is among them, else at most SYNC_SLICE (the rest stay queued)."""
        with self._lock:
            state = self._states.setdefault(ws.root, _State())
            if job is not None and state.queued is job:
                state.queued = None
            if only is not None:
                taken = set(only)
                state.dirty -= taken
            elif state.dirty & RESCANS or len(state.dirty) <= SYNC_SLICE:
                taken, state.dirty = state.dirty, set()
            else:
                taken = set(itertools.islice(sorted(state.dirty), SYNC_SLICE))
                state.dirty -= taken
            everything = only is None and not state.dirty
            walk = only is None and (not taken or RESCAN_ALL in taken)
            # Pending until the sync below has committed them: a reply meanwhile must not
            # find them in neither place (a 7 MB daily log takes seconds).
            state.running |= taken
        started = time.time()
        try:
            # Only the paths the watcher or an append named, unless a rescan was asked for.
            report = ws.syncer.sync(embed=False, allow_rebuild=False, paths=taken or None)
        except BaseException:
            with self._lock:
                state.dirty |= taken
                state.running -= taken
            raise
        with self._lock:
            state.running -= taken
            if everything:
                state.sync_started_at = started
            if walk:
                state.walk_errors = list(report.errors)
                if not report.errors:
                    state.rescanned_at = max(state.rescanned_at, started)
        # "missing" after a sync means rows without an identity (an index from an older
        # memd): like a changed model, that takes a rebuild, or it would stay keyword-only.
        if ws.syncer.state()[0] in ("mismatched", "missing") and not ws.syncer.backing_off():
            self._start_rebuild(ws, None)
        return report

    def _workspace(self, root: Path) -> Workspace | None:
        for ws in self.workspaces.all():
            if ws.root == root:
                return ws
        return None

    @staticmethod
    def _may_embed(ws: Workspace) -> bool:
        """Whether the live index of ``ws`` has embedding to do now; not while a rebuild embeds
        the same texts (both at once went at a third of the speed; the swap catches up)."""
        s = ws.syncer
        return (
            bool(s.embedder)
            and not s.rebuilding
            and not s.backing_off()
            and not s.resting()
            and s.has_pending()
        )

    def _has_embedding_work(self) -> bool:
        return any(self._may_embed(ws) for ws in self.workspaces.all())

    def _embed_one(self) -> None:
        """Embed one pending file of one workspace (round-robin), if any."""
        workspaces = self.workspaces.all()
        for i in range(len(workspaces)):
            ws = workspaces[(self._embed_cursor + i) % len(workspaces)]
            if not self._may_embed(ws):
                continue
            self._embed_cursor = (self._embed_cursor + i + 1) % len(workspaces)
            # An embedder with a step of its own (a remote API: one wave of parallel requests)
            # takes the texts of as many files as the step holds.
            step = ws.syncer.embedder.step_chars if ws.syncer.embedder else 0
            ws.syncer.wake = self._nudge  # its wave, sent in the background, is back
            try:
                ws.syncer.embed_pending(
                    max_files=None if step else 1,
                    max_chars=EMBED_STEP_CHARS,
                    background=bool(step),
                )
            except Exception as exc:
                logger.warning("embedding in %s failed: %s", ws.name, exc)
            self._stepped()
            return

    def _nudge(self) -> None:
        """Wake the writer (a wave of embedding requests is back): a job that does nothing."""
        if not self._stopping.is_set():
            self._queue.put(_Job(RECONCILE, next(self._seq), "skip", Path("/"), Future()))

    def _join_rebuild(self, ws: Workspace, future: Future[SyncReport]) -> bool:
        """Make ``future`` wait for the rebuild of ``ws`` that runs, if one does."""
        with self._lock:
            state = self._states.get(ws.root)
            if state is None or state.waiters is None:
                return False
            state.waiters.append(future)
            return True

    def _start_rebuild(self, ws: Workspace, future: Future[SyncReport] | None) -> None:
        """Rebuild ``ws`` on a thread of its own; ``future`` (and whoever joins meanwhile)
        resolves with its report. One already running is joined instead."""
        if future is not None and self._join_rebuild(ws, future):
            return
        problem = ws.root_problem()
        if problem is not None:
            if future is not None:
                future.set_exception(PathRefused(problem))
            return
        reason = "forced" if future else ws.syncer.state()[1]

        def run() -> None:
            reads_first()
            report: SyncReport | None = None
            error: BaseException | None = None
            try:
                report = ws.syncer.rebuild(reason=reason, progress=self._rebuild_progress)
                # What the live index still lacks after the swap: the vectors of files that
                # changed while it was built (the writer embeds them next).
                with ws.index.reader() as store:
                    report.pending_files = store.pending_count()
            except _RebuildCancelled:
                logger.info("rebuild of %s abandoned: memd is stopping (old index kept)", ws.name)
                error = Busy("memd is shutting down: the rebuild was abandoned, old index kept")
            except BaseException as exc:
                logger.exception("rebuild of %s failed", ws.name)
                error = exc
            finally:
                with self._lock:
                    waiters, state.waiters = state.waiters or [], None
                for waiting in waiters:
                    if waiting.done() or not _claim(waiting):
                        continue
                    if error is not None or report is None:
                        waiting.set_exception(error or RuntimeError("the rebuild gave no report"))
                    else:
                        waiting.set_result(report)

        with self._lock:
            state = self._states.setdefault(ws.root, _State())
            if self._abandon.is_set():  # checked under the lock stop() collects threads with
                if future is not None:
                    future.set_exception(Busy("memd is shutting down"))
                return
            if state.waiters is not None:  # another started it meanwhile
                if future is not None:
                    state.waiters.append(future)
                return
            state.waiters = [future] if future is not None else []
            thread = threading.Thread(target=run, name=f"memd-rebuild-{ws.name}", daemon=True)
            state.rebuild = thread
        thread.start()

    def _rebuild_progress(self, phase: str, done: int, total: int) -> None:
        """Called by a rebuild between files and embedding steps: stop it when memd stops."""
        if self._abandon.is_set():
            raise _RebuildCancelled


def _claim(future: Future[Any]) -> bool:
    """Mark ``future`` running (a sync that goes on after its first slice already is); False
    when it was cancelled."""
    return future.running() or future.set_running_or_notify_cancel()


def _relay(source: Future[SyncReport], *, target: Future[SyncReport]) -> None:
    if target.done() or not _claim(target):
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
