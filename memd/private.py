"""memd's own state kept private: what others may read, and taking that away."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = ["make_private", "not_private"]


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
