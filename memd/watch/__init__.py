"""Watch workspaces' memory files and report changed paths, debounced."""

from memd.watch.debounce import Debouncer
from memd.watch.layout import RESCAN_ALL, RESCAN_SESSIONS, RESCANS
from memd.watch.watcher import Watchers, WorkspaceWatcher

__all__ = ["RESCANS", "RESCAN_ALL", "RESCAN_SESSIONS", "Debouncer", "Watchers", "WorkspaceWatcher"]
