"""A check that no edit is still on its way to the watcher: an inotify instance of memd's own on
the directories the watcher watches, read without blocking by each reply that claims freshness.

watchdog hands an event through a reader thread, a queue per watch, an emitter thread and the
observer's dispatch before memd sees it, and drops what the kernel's queue could not hold: a
reply a moment after an edit, or during a burst of thousands of files, found nothing pending
and said fresh. The kernel queues an inotify event before the write that caused it returns, so
a reply that reads this instance first knows every edit made before it started. Linux only;
elsewhere, and where the watcher polls, there is no probe (memd/freshness.py says what then).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memd.changes import Changes
from memd.markdown.discover import is_ignored
from memd.watch.layout import WatchLayout

__all__ = ["ChangeProbe", "ProbeView"]

logger = logging.getLogger(__name__)

# <sys/inotify.h>
_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_UNMOUNT = 0x2000
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_EXCL_UNLINK = 0x04000000
_IN_ISDIR = 0x40000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC

_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
    | _IN_EXCL_UNLINK
)
_STRUCTURE = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class ProbeView:
    """What the probe knows at the moment it was read.

    ``keys``: workspace-relative paths changed since the probe last found them indexed.
    ``rescan_after``: the wall-clock time after which a full rescan must have started to cover
    what the probe cannot name: edits before it was armed, files in a folder made before its
    watch, events the kernel dropped.
    """

    keys: frozenset[str]
    rescan_after: float


class _Inotify:
    """The three libc calls, through ctypes (the standard library has no inotify)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes, self.init1.restype = [ctypes.c_int], ctypes.c_int
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int


_api: _Inotify | None = None
_api_lock = threading.Lock()


def _inotify() -> _Inotify:
    global _api
    with _api_lock:
        if _api is None:
            if not sys.platform.startswith("linux"):
                raise OSError(errno.ENOSYS, "inotify is Linux only")
            _api = _Inotify()
        return _api


class ChangeProbe:
    """Watch one workspace's memory directories with an inotify instance read on demand.

    ``on_change`` gets the changes each read found (a rescan when events were lost or a folder
    appeared), so what watchdog missed still reaches the writer. Thread-safe.
    """

    def __init__(self, layout: WatchLayout, on_change: Callable[[Changes], None]) -> None:
        self._layout = layout
        self._on_change = on_change
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self._root_wd = -1
        self._touched: set[str] = set()
        self._rescan_after = 0.0
        self.dead: str | None = "not started"
        """Why the probe cannot vouch for anything (None while it can)."""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> bool:
        """Make the instance and its watches; False (and ``dead`` says why) when it cannot."""
        with self._lock:
            try:
                api = _inotify()
                fd = api.init1(_IN_NONBLOCK | _IN_CLOEXEC)
                if fd < 0:
                    raise _error("inotify_init1")
                self._fd = fd
                self._watch_all()
            except OSError as exc:
                self._close()
                self.dead = f"no change probe: {exc.strerror or exc}"
                logger.debug("workspace %s: %s", self._layout.root, self.dead)
                return False
            # Only now does every edit reach the probe: earlier ones need a rescan after this.
            self._rescan_after = time.time()
            self.dead = None
            return True

    def close(self) -> None:
        with self._lock:
            self._close()
            self.dead = "stopped"

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the kernel removes the watches with the instance
            self._fd = None
        self._dirs.clear()
        self._root_wd = -1

    # -- reading --------------------------------------------------------------------------------

    def view(self) -> ProbeView | None:
        """Read every event queued so far; None when the probe cannot vouch for the workspace."""
        with self._lock:
            if self.dead is None:
                self._drain()
            if self.dead is not None:
                return None
            return ProbeView(frozenset(self._touched), self._rescan_after)

    def settle(self, clean: Iterable[str]) -> None:
        """Forget changed keys found indexed as they are on disk (stat'ed after the read that
        reported them: a later edit is queued again, so nothing newer is forgotten)."""
        with self._lock:
            self._touched.difference_update(clean)

    def _drain(self) -> None:
        assert self._fd is not None
        keys = Changes()
        rescan = False
        while self._fd is not None:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                self._lost(f"the change probe failed: {exc.strerror or exc}")
                break
            if not data:
                break
            for wd, mask, name in _events(data):
                found = self._event(wd, mask, name)
                if found is not None and found.rescan_all:
                    rescan = True
                elif found is not None:
                    keys |= found
        if self.dead is not None:
            self._on_change(Changes.everything())  # what it saw is moot: the watcher rescans
            return
        if rescan:
            try:
                self._watch_all()  # folders made or replaced since: watched before the rescan
            except OSError as exc:
                self._lost(f"the change probe cannot add watches: {exc.strerror or exc}")
                return
            self._rescan_after = time.time()
            keys |= Changes.everything()
        self._touched |= keys.paths
        if keys:
            self._on_change(keys)

    def _event(self, wd: int, mask: int, name: bytes) -> Changes | None:
        """The change one event means (a path, or a rescan), or None (not a memory file)."""
        if mask & _IN_Q_OVERFLOW:
            logger.warning("workspace %s: inotify dropped events; rescanning", self._layout.root)
            return Changes.everything()
        directory = self._dirs.get(wd)
        if mask & _IN_IGNORED:
            self._dirs.pop(wd, None)
            if wd == self._root_wd:
                self._lost("the workspace directory was moved, removed or unmounted")
            return Changes.everything() if directory is not None else None
        if directory is None:
            return None
        if mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT):
            if wd == self._root_wd:
                self._lost("the workspace directory was moved, removed or unmounted")
            return Changes.everything()
        path = os.path.join(directory, os.fsdecode(name)) if name else directory
        is_dir = bool(mask & _IN_ISDIR)
        key = self._layout.key_for(path, is_dir=is_dir)
        if is_dir and mask & _STRUCTURE and key is not None:
            return Changes.everything()
        return key

    def _lost(self, why: str) -> None:
        self._close()
        self.dead = why
        # The watcher's health check starts a new probe; until a rescan after that, the
        # replies of this workspace are not fresh.
        logger.info("workspace %s: %s", self._layout.root, why)

    # -- watches --------------------------------------------------------------------------------

    def _watch_all(self) -> None:
        """Watch every directory the watcher wants (recursively where it does) not yet watched."""
        watched = set(self._dirs.values())
        for top, recursive in self._layout.desired().items():
            if not recursive:
                self._add(top, watched)
                continue
            for path, dirnames, _files in os.walk(top):  # symlinked folders are not followed
                below = os.path.relpath(path, top)
                if below != "." and is_ignored(below):
                    dirnames[:] = []
                    continue
                self._add(path, watched)

    def _add(self, path: str, watched: set[str]) -> None:
        if path in watched:
            return
        assert self._fd is not None
        wd = _inotify().add_watch(self._fd, os.fsencode(path), _MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                return  # gone since the walk: its parent's event asks for a rescan
            raise OSError(err, f"{os.strerror(err)}: {path}")
        self._dirs[wd] = path
        watched.add(path)
        if path == self._layout.root:
            self._root_wd = wd


def _events(data: bytes) -> Iterable[tuple[int, int, bytes]]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        yield wd, mask, data[start : start + length].rstrip(b"\0")
        offset = start + length


def _error(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call}: {os.strerror(err)}")
