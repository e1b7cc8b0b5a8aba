"""Streaming line windows over raw JSONL transcripts, for ``get`` on ``sessions/<file>`` paths.
The file is read line by line, never whole; over-long lines are skipped without being held."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import NamedTuple

from memd.markdown.lines import read_window

__all__ = ["JsonlWindow", "read_jsonl_lines"]

logger = logging.getLogger(__name__)

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class JsonlWindow(NamedTuple):
    """Raw JSONL lines from one transcript; ``next_from`` is set only when the budget cut it."""

    text: str
    lines: int
    truncated: bool
    next_from: int | None


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
        w = read_window(f, start, count, max_chars)
        return JsonlWindow(w.text, w.lines, w.truncated, w.next_from)
