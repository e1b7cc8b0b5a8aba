"""Watch workspaces' memory files and report changed paths, debounced."""

from memd.watch.debounce import Debouncer
from memd.watch.layout import RESCAN_ALL
from memd.watch.watcher import WorkspaceWatcher

__all__ = ["RESCAN_ALL", "Debouncer", "WorkspaceWatcher"]
