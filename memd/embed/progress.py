"""A one-line download progress bar for terminals: percentage, megabytes and rate."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "progress_bar"]

# Called with (bytes done, total bytes or None when the server does not say).
Progress = Callable[[int, int | None], None]


def progress_bar(stream: TextIO | None = None, *, width: int = 30) -> Progress:
    """Return a progress callback drawing a one-line bar on ``stream`` (default stderr).

    On a terminal the bar is redrawn at most ten times a second; elsewhere only the final line
    is written, once the size is known to be reached.
    """
    out = sys.stderr if stream is None else stream
    tty = out.isatty()
    start, first, drawn, shown = -1.0, 0, 0.0, 0

    def draw(done: int, total: int | None) -> None:
        nonlocal start, first, drawn, shown
        now = time.monotonic()
        if start < 0:
            start, first = now, done  # a resumed download's first bytes do not count in the rate
        finished = total is not None and done >= total
        if not finished and (not tty or now - drawn < 0.1):
            return
        drawn = now
        rate = (done - first) / max(now - start, 1e-6) / 1e6
        if total:
            filled = min(width, width * done // total)
            bar = "#" * filled + "-" * (width - filled)
            percent = min(100, 100 * done // total)
            line = f"[{bar}] {percent:3d}%  {done / 1e6:.1f}/{total / 1e6:.1f} MB  {rate:.1f} MB/s"
        else:
            line = f"{done / 1e6:.1f} MB  {rate:.1f} MB/s"
        if tty:  # pad over the longer line drawn before, then return to the line's start
            line, shown = "\r" + line.ljust(shown), len(line)
        out.write(line + ("\n" if finished else ""))
        out.flush()

    return draw
