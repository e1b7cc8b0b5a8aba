"""Appending to a user's Markdown file so that a refused write leaves it as it was."""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["append_whole", "fsync"]


def fsync(fd: int) -> None:
    """Flush ``fd`` to stable storage (on macOS plain fsync stops at the drive's cache)."""
    if sys.platform == "darwin":
        import fcntl

        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
    os.fsync(fd)


def append_whole(fd: int, data: bytes, size: int) -> None:
    """Write ``data`` to the end of ``fd`` (opened with O_APPEND; ``size`` bytes long before)
    and fsync it, all or nothing.

    A full disk takes what fits and refuses the rest: then the part that was written is cut
    off again (unless someone else wrote after it, which only they can undo) and the
    OSError is raised, so a file never ends in half an entry.
    """
    view = memoryview(data)
    written = 0
    try:
        while written < len(data):
            written += os.write(fd, view[written:])
        fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            if written and os.fstat(fd).st_size == size + written:
                os.ftruncate(fd, size)
        raise
