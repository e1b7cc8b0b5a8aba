"""Appends to today's daily log: the one way memd writes an agent's text into its memory."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from memd.atomicfile import append_whole
from memd.flush import daily_log
from memd.markdown.modes import create_file_at, make_folder_at
from memd_client.errors import BadRequest, PathRefused

__all__ = ["Appended", "MAX_APPEND_CHARS", "append_daily"]

MAX_APPEND_CHARS = 64 * 1024


@dataclass(frozen=True)
class Appended:
    path: str  # workspace-relative
    start_line: int
    end_line: int


def append_daily(root: Path, text: str, *, day: dt.date) -> Appended:
    """Append ``text`` to ``day``'s ``memory/YYYY-MM-DD.md``, creating it if needed; never
    rewrite it.

    The entry goes out in one ``write`` on an ``O_APPEND`` descriptor (so a concurrent writer can
    never be overwritten), preceded by a newline when the file does not end with one, then
    fsynced. Only a regular file with one name, reached from the workspace folder without a
    symlink, is written: symlinks and hard links are refused (PathRefused says which). What is
    created gets the modes its folder gives (:mod:`memd.markdown.modes`). A write the disk
    refuses (full, read-only, I/O error) is undone, leaving the file as it was, and raised as
    PathRefused naming the cause.
    """
    if not isinstance(text, str):
        raise BadRequest("text must be a string")
    body = text.replace("\r\n", "\n").rstrip("\n")
    if not body.strip():
        raise BadRequest("text is empty")
    if len(body) > MAX_APPEND_CHARS:
        raise BadRequest(f"text is longer than {MAX_APPEND_CHARS} characters")
    if "\x00" in body:
        raise BadRequest("text contains a NUL byte")
    rel = daily_log(day)
    root_fd = _open_root(root)
    try:
        try:
            folder_fd = make_folder_at(root_fd, "memory")
        except NotADirectoryError:
            raise PathRefused("memory/ is not a directory (a symlink or a file)") from None
        except OSError as exc:
            raise PathRefused(f"cannot create memory/: {exc.strerror}") from None
    finally:
        os.close(root_fd)
    try:
        return _append_in(folder_fd, f"{day.isoformat()}.md", rel, body)
    finally:
        os.close(folder_fd)


def _open_root(root: Path) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PathRefused(f"cannot open the workspace folder: {exc.strerror}") from None


def _append_in(folder_fd: int, name: str, rel: str, body: str) -> Appended:
    fd, created = _open_log(folder_fd, name, rel)
    try:
        _check_target(os.fstat(fd), rel)
        existing_lines, ends_with_newline, size = _line_count(fd)
        prefix = "" if ends_with_newline else "\n"
        data = (prefix + body + "\n").encode("utf-8")
        try:
            append_whole(fd, data, size)
        except OSError as exc:
            _remove_if_created(fd, folder_fd, name, created)
            raise PathRefused(f"cannot append to {rel}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    start = existing_lines + 1
    return Appended(rel, start, start + body.count("\n"))


def _check_target(st: os.stat_result, rel: str) -> None:
    """Refuse to append to anything but a regular file with one name: a hard link would carry
    the entry into another file (MEMORY.md, or one outside the workspace)."""
    if not stat.S_ISREG(st.st_mode):
        raise PathRefused(f"{rel} is not a regular file")
    if st.st_nlink != 1:
        raise PathRefused(
            f"{rel} has {st.st_nlink} hard links: an append would change the other files too "
            "(memd appends only to a file with one name; copy it to undo the link)"
        )


def _open_log(folder_fd: int, name: str, rel: str) -> tuple[int, bool]:
    """Open the daily log to append to (and to count its lines); True when this call created
    it (with the mode its folder gives). Never through a symlink."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(name, flags, dir_fd=folder_fd), False
        except FileNotFoundError:
            pass
        try:
            return create_file_at(folder_fd, name, flags), True
        except FileExistsError:  # someone else created it just now
            return os.open(name, flags, dir_fd=folder_fd), False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{rel} is a symlink; memd does not append through it") from None
        raise PathRefused(f"cannot append to {rel}: {exc.strerror}") from None


def _remove_if_created(fd: int, folder_fd: int, name: str, created: bool) -> None:
    """After a failed append (already cut back): remove the file if this append created it."""
    with contextlib.suppress(OSError):
        st = os.fstat(fd)
        if created and st.st_size == 0 and os.lstat(name, dir_fd=folder_fd).st_ino == st.st_ino:
            os.unlink(name, dir_fd=folder_fd)


def _line_count(fd: int) -> tuple[int, bool, int]:
    """(number of lines, whether the file is empty or ends with a newline, its size in bytes)."""
    count = 0
    last = b"\n"
    offset = 0
    while block := os.pread(fd, 1 << 16, offset):
        count += block.count(b"\n")
        last = block[-1:]
        offset += len(block)
    if last != b"\n":
        count += 1  # a last line without its newline
    return count, last == b"\n", offset
