"""Appending to a user's Markdown file so that a refused write leaves it as it was; keeping
memd's own state private. Whole-file replacement is memd.atomicfile."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from memd.atomicfile import fsync

__all__ = ["append_whole", "make_private", "not_private"]


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


def not_private(root: Path) -> list[Path]:
    """Directories and files under ``root`` (itself included, symlinks not followed) that
    users other than their owner may read, write or enter."""
    found: list[Path] = []
    if not root.is_dir() or root.is_symlink():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (".", *dirnames, *filenames):
            path = Path(dirpath) / name if name != "." else Path(dirpath)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                found.append(path)
    return found


def make_private(root: Path) -> int:
    """Take group and other permissions off everything under ``root`` (0700 directories, 0600
    files); return how many were changed. Files memd cannot change are left as they are."""
    changed = 0
    for path in not_private(root):
        with contextlib.suppress(OSError):
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            os.chmod(path, mode & 0o700)  # not a symlink: not_private skips them
            changed += 1
    return changed
