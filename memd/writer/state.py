"""What the writer knows of each workspace: the changes queued and being indexed, its rebuild,
when it last synced and walked it; and the questions freshness and status ask of it.

Its own module: the writer's per-workspace state and its read-only queries, apart from the
thread that changes it (memd/writer/writer.py).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from memd.changes import Changes
from memd.index.report import SyncReport
from memd.workspace import Workspace
from memd.writer.jobs import Job

__all__ = ["StateQueries", "WorkspaceState"]


@dataclass
class WorkspaceState:
    """What the writer knows of one workspace."""

    dirty: Changes = Changes()
    queued: Job | None = None  # the not yet started sync job, which later requests join
    running: Changes = Changes()  # the changes the running sync took
    rebuild: threading.Thread | None = None
    # Who waits for the running rebuild's report (None: no rebuild runs).
    waiters: list[Future[SyncReport]] | None = None
    sync_started_at: float = 0.0  # wall-clock start of the last sync that completed
    rescanned_at: float = 0.0  # wall-clock start of the last complete walk without errors
    walk_errors: list[tuple[str, str]] = field(default_factory=list)  # of the last walk


class StateQueries:
    """The Writer's (memd/writer/writer.py) answers about its workspaces' state."""

    _lock: threading.Lock
    _states: dict[Path, WorkspaceState]

    def dirty_keys(self, ws: Workspace) -> Changes:
        """The changes not yet indexed in ``ws``: queued for the next sync, or being indexed by
        the running one."""
        queued, running = self.pending_keys(ws)
        return queued | running

    def pending_keys(self, ws: Workspace) -> tuple[Changes, Changes]:
        """(the changes queued for the next sync of ``ws``, those the running sync is indexing
        now); either may ask for a rescan."""
        with self._lock:
            state = self._states.get(ws.root)
            return (state.dirty, state.running) if state else (Changes(), Changes())

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
