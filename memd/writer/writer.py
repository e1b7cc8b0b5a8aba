"""The single writer: one thread applies every index write of every workspace.

Watcher batches, periodic reconciles, appends, promotions into MEMORY.md and read-your-writes
waits all become jobs on one priority queue. A write someone waits for indexes only the files
it wrote, and a sync of many changed files (a ``git checkout``) goes SYNC_SLICE files at a
time, so an append waits for one slice of a bulk edit, not all of it.

The Writer holds the thread, its queue and every request. Between jobs it embeds
(memd/writer/embedding.py); rebuilds run on threads of their own (memd/writer/rebuilds.py);
its jobs are memd/writer/jobs.py, what it knows of each workspace memd/writer/state.py.
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
from datetime import date
from pathlib import Path
from typing import TypeVar

from memd.changes import Changes
from memd.clock import Clock
from memd.index.index import reads_first
from memd.index.report import SyncReport
from memd.markdown.append import Appended, append_daily
from memd.registry import Workspaces
from memd.workspace import Workspace
from memd.writer.embedding import EmbeddingSteps
from memd.writer.jobs import URGENT, WATCH, Job, claim, refuse_left, relay
from memd.writer.rebuilds import REBUILD_STOP_S, Rebuilds
from memd.writer.state import StateQueries, WorkspaceState
from memd_client.errors import Busy, IndexError_, PathRefused, UnknownWorkspace

__all__ = ["Writer"]

logger = logging.getLogger(__name__)


T = TypeVar("T")

# Changed files one sync job indexes before the jobs queued behind it get a turn. A file takes
# a few milliseconds; 64 of them keep an append's wait during a bulk edit well under a second.
SYNC_SLICE = 64


class Writer(StateQueries, EmbeddingSteps, Rebuilds):
    def __init__(
        self,
        workspaces: Workspaces,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.clock = clock or Clock()  # today's date for appends (a reload sets a new one)
        self._queue: queue.PriorityQueue[Job] = queue.PriorityQueue()
        self._seq = itertools.count(1)
        self._states: dict[Path, WorkspaceState] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._abandon = threading.Event()  # rebuilds stop at their next step (memd stops)
        self._thread = threading.Thread(target=self._run, name="memd-writer", daemon=True)
        self._embed_cursor = 0
        self._wanted: dict[str, int] = {}
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
        self._queue.put(Job(-1, 0, "stop", Path("/"), Future()))
        self._thread.join(timeout)
        for ws in self.workspaces.all():  # a wave of requests in flight ends within its timeout
            ws.syncer.settle(timeout)
        with self._lock:  # none starts once stopping is set
            rebuilds = [s.rebuild for s in self._states.values() if s.rebuild is not None]
        for t in rebuilds:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive():
                logger.warning("%s did not stop within %g s", t.name, REBUILD_STOP_S)
        refuse_left(self._queue, Busy("memd is shutting down"))

    # -- requests -------------------------------------------------------------------------------

    def _state(self, root: Path) -> WorkspaceState:
        with self._lock:
            return self._states.setdefault(root, WorkspaceState())

    def request_sync(
        self, ws: Workspace, keys: Changes | None = None, *, priority: int = WATCH
    ) -> Future[SyncReport]:
        """Queue a sync of ``ws`` (joining one already queued) for ``keys``, what changed (none:
        a rescan of the whole workspace)."""
        with self._lock:
            state = self._states.setdefault(ws.root, WorkspaceState())
            state.dirty |= keys or Changes.everything()
            job = state.queued
            if job is not None and job.priority <= priority:
                return job.future
            job = Job(priority, next(self._seq), "sync", ws.root, Future())
            if state.queued is not None:
                # A more urgent request: the new job replaces the queued one, which then
                # resolves with the new job's report.
                older = state.queued
                job.future.add_done_callback(functools.partial(relay, target=older.future))
                older.kind = "skip"
            state.queued = job
        self._check_running()
        self._queue.put(job)
        return job.future

    def changes_of(self, ws: Workspace) -> Callable[[Changes], None]:
        """What a watcher of ``ws`` reports its changes to: a sync request."""

        def changed(keys: Changes) -> None:
            try:
                self.request_sync(ws, keys)
            except Busy:
                pass  # shutting down

        return changed

    def append(self, ws: Workspace, text: str, *, day: date | None = None) -> Future[Appended]:
        """Append ``text`` to the daily log of ``ws`` for ``day`` (today in the user's time zone
        when not given); resolves once it is searchable."""
        job = Job(URGENT, next(self._seq), "append", ws.root, Future(), payload=(text, day))
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
        job = Job(priority, next(self._seq), "work", ws.root, Future(), payload=(work, indexes))
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
            ws.syncer.compare_contents_next()  # not only each file's size and mtime
            return self.request_sync(ws, priority=URGENT)
        self._start_rebuild(ws, future)
        return future

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

    def _do(self, job: Job) -> None:
        if job.kind == "skip" or not claim(job.future):
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
                state = self._states.setdefault(ws.root, WorkspaceState())
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

    def _go_on(self, ws: Workspace, job: Job, report: SyncReport) -> bool:
        """Queue ``job`` again when changed files remain after its slice (True), behind the
        jobs already queued; a sync requested meanwhile takes the rest instead, and ``job``
        resolves with it."""
        with self._lock:
            state = self._states.setdefault(ws.root, WorkspaceState())
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
            newer.future.add_done_callback(functools.partial(relay, target=job.future))
        return True

    def _append_batch(self, ws: Workspace, first: Job) -> None:
        """Write ``first`` and every other append queued for the same workspace, then make
        them searchable with one sync: 60 queued appends cost one re-index of the daily log,
        not 60, and an edit in another workspace waits behind one batch, not all of them."""
        batch = [first, *self._take_queued_appends(ws.root)]
        written: list[tuple[Job, Appended]] = []
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

    def _take_queued_appends(self, root: Path, limit: int = 256) -> list[Job]:
        """Remove and return the appends queued for ``root``, oldest first."""
        with self._queue.mutex:
            heap = self._queue.queue
            mine = sorted(j for j in heap if j.kind == "append" and j.root == root)[:limit]
            if mine:
                taken = {id(j) for j in mine}
                heap[:] = [j for j in heap if id(j) not in taken]
                heapq.heapify(heap)
        return mine

    def _sync(self, ws: Workspace, job: Job | None, only: set[str] | None = None) -> SyncReport:
        """Index the files the writer itself wrote (``only``), or the changed files: all of
        them when a rescan is among them, else at most SYNC_SLICE (the rest stay queued)."""
        with self._lock:
            state = self._states.setdefault(ws.root, WorkspaceState())
            if job is not None and state.queued is job:
                state.queued = None
            if only is not None:
                taken = Changes.of(only)
                state.dirty -= taken
            elif state.dirty.rescans or len(state.dirty.paths) <= SYNC_SLICE:
                taken, state.dirty = state.dirty, Changes()
            else:
                taken = Changes.of(itertools.islice(sorted(state.dirty.paths), SYNC_SLICE))
                state.dirty -= taken
            everything = only is None and not state.dirty
            walk = only is None and (not taken or taken.rescan_all)
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
