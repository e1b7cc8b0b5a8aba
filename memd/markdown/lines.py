"""Reading a window of lines from a file under a character budget, without reading it whole."""

from __future__ import annotations

from typing import BinaryIO, NamedTuple

__all__ = ["Window", "read_window"]

_SKIP_CHUNK = 1 << 16


class Window(NamedTuple):
    """Lines ``start..`` of a file; ``next_from`` is set only when the budget cut the window."""

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


def read_window(f: BinaryIO, start: int, count: int, max_chars: int) -> Window:
    """Return up to ``count`` lines from 1-based line ``start`` within ``max_chars`` characters.

    Lines past the budget are dropped from the end; a single over-long first line is hard-cut.
    CRLF endings are stripped; bytes are decoded as UTF-8 with replacement.
    """
    for _ in range(start - 1):
        if _read_line(f, _SKIP_CHUNK) is None:
            return Window("", 0, False, None)
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
    return Window("\n".join(out), len(out), truncated, next_from)
