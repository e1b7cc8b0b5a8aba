"""Writes that happen whole or not at all: files replaced in one rename, entries appended in
one piece, and the fsyncs that make a write or a rename durable."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["append_whole", "fsync", "fsync_dir", "write_atomic"]

# What a filesystem that cannot fsync a directory answers (some network and FUSE ones).
_NO_DIR_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def fsync(fd: int) -> None:
    """Flush ``fd`` to stable storage (on macOS plain fsync stops at the drive's cache)."""
    if sys.platform == "darwin":
        import fcntl

        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
    os.fsync(fd)


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` durable (after a rename or a new file). Filesystems
    that cannot fsync a directory are let be; any other error is raised."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` whole or not at all: a temp file beside it (named
    ``.NAME.tmp-XXXX``, removed again on failure), fsync, rename, fsync of the directory.

    The file gets ``mode`` whatever the umask; a missing directory is made private (0700).
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


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
