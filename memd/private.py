"""memd's own state kept private: what memd creates is its user's alone whatever the umask, a
directory others could write to is refused (as ssh refuses one), and what an earlier install
left readable is tightened."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from memd_client.errors import PathRefused

__all__ = [
    "keep_private",
    "make_private",
    "not_private",
    "open_private_file",
    "private_directory",
]


def keep_private() -> int:
    """Make everything this process creates from now on its user's alone (umask 077: 0700
    directories, 0600 files); return the umask it had."""
    return os.umask(0o077)


def private_directory(path: Path, what: str) -> Path:
    """Create ``path`` and its missing parents 0700, or check the one there; return it.

    Refused (PathRefused, naming the cause and the fix): a directory (symlinks followed) that
    belongs to another user or that group or others may write to, and one inside a directory
    others may write to without the sticky bit (they could put another in its place). A
    directory only readable by others is accepted: make_private() tightens it.
    """
    old = os.umask(0o077)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise PathRefused(f"{what} {path} is not a directory") from None
    except OSError as exc:
        raise PathRefused(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except OSError as exc:
        raise PathRefused(f"cannot use {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PathRefused(f"{what} {path} is not a directory")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise PathRefused(
            f"{what} {real} belongs to uid {st.st_uid}, not to you (uid {uid}): memd keeps "
            "its state only in a directory of your own"
        )
    if st.st_mode & 0o022:
        raise PathRefused(
            f"{what} {real} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"check what they left in it, then run: chmod 700 {real}"
        )
    for parent in real.parents:
        try:
            pst = os.stat(parent)
        except OSError:
            continue
        if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
            raise PathRefused(
                f"{what} {real} is inside {parent}, which every user may write to (mode "
                f"{stat.S_IMODE(pst.st_mode):04o}, no sticky bit): they could replace it"
            )
    return path


def open_private_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """Open (creating it 0600) the file memd keeps at ``path``: never through a symlink, and
    only a regular file of this user's; the descriptor is the caller's to close."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{path} is a symlink; memd does not follow one there") from None
        raise PathRefused(f"cannot open {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PathRefused(f"{path} is not a regular file of yours")
    return fd


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
