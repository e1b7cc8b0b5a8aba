"""The event handler of one watchdog observer: events to changes for the debouncer, and keeping
watches current."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler, FileSystemMovedEvent
from watchdog.observers.api import BaseObserver

from memd.changes import Changes
from memd.watch.layout import WatchLayout
from memd.watch.observers import observer_lock

__all__ = ["WATCH_PRESSURE", "ObserverHandler"]

logger = logging.getLogger(__name__)

WATCH_PRESSURE = {
    errno.ENOSPC: "inotify watch limit reached (ENOSPC): raise fs.inotify.max_user_watches",
    errno.EMFILE: "inotify instance limit reached (EMFILE): raise fs.inotify.max_user_instances",
}
"""The OSErrors that mean "the kernel refuses more watches", with the fix to show the user."""

_FILE_EVENTS = frozenset({"created", "deleted", "modified", "moved", "closed", "attrib"})
# A directory's modified/attrib events only echo the file events inside it.
_DIR_EVENTS = frozenset({"created", "deleted", "moved"})


class ObserverHandler(FileSystemEventHandler):
    """Bound to one observer: reports relevant paths and re-schedules watches when dirs change.

    ``sync_watches`` runs under the observer's own lock, which the observer also holds while it
    dispatches an event to this handler, so the handler (observer thread) and the health check
    (daemon thread) never interleave a check-then-schedule.
    """

    def __init__(
        self,
        layout: WatchLayout,
        observer: BaseObserver,
        push: Callable[[Changes], None],
        touched: Callable[[], None],
    ) -> None:
        super().__init__()
        self._layout = layout
        self._observer = observer
        self._push = push
        self._touched = touched
        # (st_dev, st_ino) of each watched directory when its watch was made, to notice a
        # directory replaced under the same name (rm -rf memory && mkdir memory).
        self._idents: dict[str, tuple[int, int]] = {}
        self.failure: str | None = None
        """Set when a re-schedule hit the watch limits; the health check then restarts."""

    def schedule_initial(self) -> None:
        """Schedule the watches the layout wants, before the observer starts."""
        for path, recursive in self._layout.desired().items():
            self._add(path, recursive=recursive)

    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            self._handle(event)
        except Exception:
            # watchdog #427: an exception escaping a handler kills the observer thread.
            logger.exception("file watcher could not handle %r; asking for a rescan", event)
            with contextlib.suppress(Exception):
                self._push(Changes.everything())

    def _handle(self, event: FileSystemEvent) -> None:
        kinds = _DIR_EVENTS if event.is_directory else _FILE_EVENTS
        if event.event_type not in kinds:
            return
        self._touched()
        paths = [event.src_path]
        if isinstance(event, FileSystemMovedEvent):
            # An atomic save is a move of a temp file onto the target: the key is the dest.
            paths.append(event.dest_path)
        keys: list[Changes] = []
        structural = False
        for raw in paths:
            if not raw:
                continue
            path = os.fsdecode(raw)
            key = self._layout.key_for(path, is_dir=event.is_directory)
            if key is not None:
                logger.debug("watch: %s %s -> %s", event.event_type, path, key)
                keys.append(key)
            structural = structural or (event.is_directory and self._layout.is_structural(path))
        if structural:
            # Watch first, then report (key_for asked for a rescan): the rescan that follows finds
            # the files made before the new watch existed.
            self.sync_watches()
        for key in keys:
            self._push(key)

    def crashed_emitters(self) -> list[str]:
        """Return the watched directories whose emitter thread died although the dir is still there.

        An emitter also ends on its own when its directory is deleted; that is not a crash, and
        ``sync_watches`` replaces such watches.
        """
        with observer_lock(self._observer):
            return [
                str(e.watch.path)
                for e in self._observer.emitters
                if not e.is_alive()
                and self._idents.get(str(e.watch.path)) == _ident(str(e.watch.path))
            ]

    def sync_watches(self) -> bool:
        """Make this observer's watches match the disk; return True if a watch changed."""
        changed = False
        try:
            with observer_lock(self._observer):
                if self._observer.stopped_event.is_set():
                    return False  # stop() clears the emitters after taking this lock
                want = self._layout.desired()
                for emitter in list(self._observer.emitters):
                    path = str(emitter.watch.path)
                    if (
                        want.get(path) != emitter.watch.is_recursive
                        or not emitter.is_alive()
                        or self._idents.get(path) != _ident(path)
                    ):
                        logger.info("watch: dropping the watch on %s", path)
                        self._observer.unschedule(emitter.watch)
                        self._idents.pop(path, None)
                        changed = True
                scheduled = {str(e.watch.path) for e in self._observer.emitters}
                for path, recursive in want.items():
                    if path not in scheduled and self._add(path, recursive=recursive):
                        logger.info("watch: now watching %s", path)
                        changed = True
        except OSError as exc:
            if exc.errno in WATCH_PRESSURE:
                self.failure = WATCH_PRESSURE[exc.errno]
            logger.warning("watch: could not update the watches: %s", exc)
        return changed

    def _add(self, path: str, *, recursive: bool) -> bool:
        ident = _ident(path)
        if ident is None:  # vanished since desired() looked
            return False
        self._observer.schedule(self, path, recursive=recursive)
        self._idents[path] = ident
        return True


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
