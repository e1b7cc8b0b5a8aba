"""Streaming line windows over raw JSONL transcripts, for ``get`` on ``sessions/<file>`` paths.
The file is read line by line, never whole; over-long lines are skipped without being held."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO, NamedTuple

__all__ = ["JsonlWindow", "read_jsonl_lines"]

logger = logging.getLogger(__name__)

_SKIP_CHUNK = 1 << 16
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class JsonlWindow(NamedTuple):
    """Raw JSONL lines from one transcript; ``next_from`` is set only when the budget cut it."""

    text: str
    lines: int
    truncated: bool
    next_from: int | None


def _read_line(f: BinaryIO, cap: int) -> tuple[bytes, bool] | None:
    """Read one line of at most ``cap`` bytes, skipping the rest; None at end of file."""
    raw = f.readline(cap)
    if not raw:
        return None
    if raw.endswith(b"\n"):
        return raw, True
    while True:  # skip the remainder of an over-long line without holding it
        more = f.readline(_SKIP_CHUNK)
        if not more or more.endswith(b"\n"):
            return raw, False


def read_jsonl_lines(path: Path, start: int, count: int, max_chars: int) -> JsonlWindow:
    """Return raw JSONL lines ``start..start+count-1`` (1-based) within ``max_chars`` characters.

    Lines past the budget are dropped from the end; a single over-long first line is hard-cut.
    Raises ValueError for bad arguments or a non-regular file, OSError when it cannot be opened
    (symlinks are not followed).
    """
    for name, value in (("start", start), ("count", count), ("max_chars", max_chars)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    fd = os.open(path, _FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"not a regular file: {path}")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return _window(f, start, count, max_chars)


def _window(f: BinaryIO, start: int, count: int, max_chars: int) -> JsonlWindow:
    for _ in range(start - 1):
        if _read_line(f, _SKIP_CHUNK) is None:
            return JsonlWindow("", 0, False, None)
    # A line of more than 4 * (max_chars + 1) bytes has more than max_chars characters.
    cap = 4 * (max_chars + 1)
    out: list[str] = []
    used = 0
    truncated = False
    while len(out) < count and (got := _read_line(f, cap)) is not None:
        raw, complete = got
        if complete:
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        line = raw.decode("utf-8", errors="replace")
        used += len(line) + (1 if out else 0)
        if used > max_chars:
            truncated = True
            if not out:  # a single over-long line is hard-cut
                out.append(line[:max_chars])
            break
        out.append(line)
    next_from = start + len(out) if truncated else None
    return JsonlWindow("\n".join(out), len(out), truncated, next_from)
