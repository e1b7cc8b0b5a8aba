"""Appends to today's daily log: the one way memd writes an agent's text into its memory."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from memd.atomicfile import append_whole
from memd.flush import daily_log
from memd_client.errors import BadRequest, PathRefused

__all__ = ["Appended", "MAX_APPEND_CHARS", "append_daily", "today"]

MAX_APPEND_CHARS = 64 * 1024


@dataclass(frozen=True)
class Appended:
    path: str  # workspace-relative
    start_line: int
    end_line: int


def today(timezone: str = "") -> dt.date:
    """Today's date in the user's time zone (the machine's when empty)."""
    if timezone:
        return dt.datetime.now(ZoneInfo(timezone)).date()
    return dt.datetime.now().astimezone().date()


def append_daily(
    root: Path, text: str, *, timezone: str = "", day: dt.date | None = None
) -> Appended:
    """Append ``text`` to ``memory/YYYY-MM-DD.md``, creating it if needed; never rewrite it.

    The entry goes out in one ``write`` on an ``O_APPEND`` descriptor (so a concurrent writer can
    never be overwritten), preceded by a newline when the file does not end with one, then
    fsynced. Symlinks are refused for the folder and the file alike. A write the disk refuses
    (full, read-only, I/O error) is undone, leaving the file as it was, and raised as PathRefused
    naming the cause.
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
    day = day or today(timezone)
    rel = daily_log(day)
    folder = root / "memory"
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            raise PathRefused("memory/ is not a directory (a symlink or a file)")
    except FileNotFoundError:
        try:
            folder.mkdir(mode=0o755)
        except OSError as exc:
            raise PathRefused(f"cannot create memory/: {exc.strerror}") from None
    target = folder / f"{day.isoformat()}.md"
    fd, created = _open_log(target, rel)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"{rel} is not a regular file")
        existing_lines, ends_with_newline, size = _line_count(fd)
        prefix = "" if ends_with_newline else "\n"
        data = (prefix + body + "\n").encode("utf-8")
        try:
            append_whole(fd, data, size)
        except OSError as exc:
            _remove_if_created(fd, target, created)
            raise PathRefused(f"cannot append to {rel}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    start = existing_lines + 1
    return Appended(rel, start, start + body.count("\n"))


def _open_log(path: Path, rel: str) -> tuple[int, bool]:
    """Open the daily log to append to (and to count its lines); True when this call created it."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags), False
        except FileNotFoundError:
            pass
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:  # someone else created it just now
            return os.open(path, flags), False
    except OSError as exc:
        raise PathRefused(f"cannot append to {rel}: {exc.strerror}") from None


def _remove_if_created(fd: int, path: Path, created: bool) -> None:
    """After a failed append (already cut back): remove the file if this append created it."""
    with contextlib.suppress(OSError):
        st = os.fstat(fd)
        if created and st.st_size == 0 and os.lstat(path).st_ino == st.st_ino:
            os.unlink(path)


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
