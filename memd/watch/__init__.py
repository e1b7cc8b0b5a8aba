"""Watch workspaces' memory files and report changed paths, debounced."""

from memd.watch.debounce import Debouncer
from memd.watch.watcher import Watchers, WorkspaceWatcher

__all__ = ["Debouncer", "Watchers", "WorkspaceWatcher"]
