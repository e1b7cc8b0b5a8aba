"""Appends to today's daily log: the one way memd writes an agent's text into its memory."""

from __future__ import annotations

import datetime as dt
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

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
    fsynced. Symlinks are refused for the folder and the file alike.
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
    rel = f"memory/{day.isoformat()}.md"
    folder = root / "memory"
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            raise PathRefused("memory/ is not a directory (a symlink or a file)")
    except FileNotFoundError:
        folder.mkdir(mode=0o755)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(folder / f"{day.isoformat()}.md", flags, 0o644)
    except OSError as exc:
        raise PathRefused(f"cannot append to {rel}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"{rel} is not a regular file")
        existing_lines, ends_with_newline = _line_count(folder / f"{day.isoformat()}.md")
        prefix = "" if ends_with_newline else "\n"
        data = (prefix + body + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    start = existing_lines + 1
    return Appended(rel, start, start + body.count("\n"))


def _line_count(path: Path) -> tuple[int, bool]:
    """(number of lines, whether the file is empty or ends with a newline)."""
    count = 0
    last = b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 16):
            count += block.count(b"\n")
            last = block[-1:]
    if last != b"\n":
        count += 1  # a last line without its newline
    return count, last == b"\n"
