"""Files and folders memd creates in a user's workspace get the modes the user's own have.

The daemon runs with umask 077 so that its state stays private; a daily log, ``memory/`` or
DREAMS.md is the user's file, and takes its permissions from the folder it is made in (a
folder of 0755 gets files of 0644, one of 0750 files of 0640, one of 0700 files of 0600).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from memd_client.errors import PathRefused

__all__ = ["create_file_at", "file_mode", "folder_mode", "make_folder_at", "open_append"]

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def file_mode(folder: os.stat_result) -> int:
    """The mode of a new file in ``folder``: its read and write bits."""
    return stat.S_IMODE(folder.st_mode) & 0o666


def folder_mode(parent: os.stat_result) -> int:
    """The mode of a new folder in ``parent``: its permission bits and its set-group-id bit
    (which keeps a shared folder's group on what is made in it)."""
    return stat.S_IMODE(parent.st_mode) & (0o777 | stat.S_ISGID)


def create_file_at(dir_fd: int, name: str, flags: int) -> int:
    """Create ``name`` in the folder open as ``dir_fd`` (it must not exist: FileExistsError)
    and give it :func:`file_mode`; return its descriptor, opened with ``flags``."""
    fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, file_mode(os.fstat(dir_fd)))
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_folder_at(dir_fd: int, name: str) -> int:
    """Make the folder ``name`` in the folder open as ``dir_fd`` if it is missing, with
    :func:`folder_mode` when this call made it; return it open. A symlink or a file of that
    name raises NotADirectoryError."""
    made = False
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        made = True
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _O_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder (a symlink or a file)") from None
        raise
    if made:
        try:
            os.fchmod(fd, folder_mode(os.fstat(dir_fd)))
        except BaseException:
            os.close(fd)
            raise
    return fd


def open_append(path: Path) -> int:
    """Open ``path`` to append to (read and write, O_APPEND), creating it with the mode its
    folder gives (:func:`file_mode`) when missing. A symlink is refused (PathRefused)."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return create_file_at(dir_fd, path.name, flags)
        except FileExistsError:  # someone else created it just now
            return os.open(path, flags)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{path} is a symlink; memd does not write through it") from exc
        raise
