"""The writer's rebuilds: a rebuild runs on a thread of its own, building a new file while the
live index serves; a reindex asked for meanwhile waits for it and gets its report, and
shutdown abandons it (the old index stays).

Its own module: the one write that does not run on the writer thread.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from memd.index.index import reads_first
from memd.index.report import SyncReport
from memd.workspace import Workspace
from memd.writer.jobs import claim
from memd.writer.state import WorkspaceState
from memd_client.errors import Busy, PathRefused

__all__ = ["REBUILD_STOP_S", "Rebuilds"]

logger = logging.getLogger(__name__)


# How long shutdown waits for a rebuild to stop: it stops between two files or two embedding
# steps (memd/index/rebuild.py), and its temporary file is removed.
REBUILD_STOP_S = 5.0


class _RebuildCancelled(BaseException):
    """Raised inside a rebuild (from its progress callback) when memd stops. A BaseException:
    no ``except Exception`` on the way may take it for a provider failure."""


class Rebuilds:
    """The rebuild threads of the Writer (memd/writer/writer.py), which holds the state below."""

    _lock: threading.Lock
    _states: dict[Path, WorkspaceState]
    _abandon: threading.Event

    def abandon_rebuilds(self) -> None:
        """Stop every rebuild at its next file or embedding step (its temporary file goes, the
        old index stays) and answer whoever waits for one (Busy): the first step of shutdown,
        before the connections waiting for those answers are closed."""
        self._abandon.set()

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
                    if waiting.done() or not claim(waiting):
                        continue
                    if error is not None or report is None:
                        waiting.set_exception(error or RuntimeError("the rebuild gave no report"))
                    else:
                        waiting.set_result(report)

        with self._lock:
            state = self._states.setdefault(ws.root, WorkspaceState())
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
