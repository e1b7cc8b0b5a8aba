"""Session-start context: what an agent should have read before its first turn.

As in OpenClaw, that is the curated long-term memory (MEMORY.md) and the daily logs of today and
yesterday. Here it comes under one character budget, with a citation for every part, so an agent
host needs no copy of these rules: long-term memory keeps its beginning when cut (the user wrote
the most important things first), a daily log keeps its end (the latest entries). Whole lines
only; the budget is shared in that order, long-term memory first, then today, then yesterday.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from memd.flush import daily_log
from memd.markdown.read import MAX_LINES, MemoryPath, locate, read_located
from memd_client.errors import PathRefused

__all__ = ["DEFAULT_CONTEXT_CHARS", "Section", "session_context"]

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_CHARS = 12_000
# A window read at a time; a file is read to its end at most once.
_WINDOW_CHARS = 256 * 1024


@dataclass(frozen=True)
class Section:
    """Lines ``start_line``..``end_line`` of one memory file (``total_lines`` in all)."""

    path: str
    title: str
    start_line: int
    end_line: int
    total_lines: int
    text: str

    @property
    def truncated(self) -> bool:
        return self.end_line - self.start_line + 1 < self.total_lines

    @property
    def citation(self) -> str:
        return f"{self.path}#L{self.start_line}-L{self.end_line}"


def _lines(t: MemoryPath) -> Iterator[str]:
    """Every line of a located file, without its newline; nothing when it does not exist."""
    start = 1
    while True:
        window = read_located(t, start, MAX_LINES, _WINDOW_CHARS)
        if window.missing or not window.text and not window.truncated:
            return
        yield from window.text.split("\n")[: window.lines]
        if not window.truncated or not window.next_from:
            return
        start = window.next_from


def _head(lines: Iterator[str], budget: int) -> tuple[list[str], int]:
    kept: list[str] = []
    used = total = 0
    for line in lines:
        total += 1
        if total == len(kept) + 1 and used + len(line) + 1 <= budget:
            kept.append(line)
            used += len(line) + 1
    return kept, total


def _tail(lines: Iterator[str], budget: int) -> tuple[list[str], int]:
    kept: deque[str] = deque()
    used = total = 0
    for line in lines:
        total += 1
        kept.append(line)
        used += len(line) + 1
        while kept and used > budget:
            used -= len(kept.popleft()) + 1
    return list(kept), total


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def session_context(
    root: Path,
    *,
    day: dt.date,
    max_chars: int = DEFAULT_CONTEXT_CHARS,
    longterm: bool = True,
    check: Callable[[MemoryPath], None] | None = None,
    extra_paths: Sequence[str] = (),
) -> list[Section]:
    """The sections of the session-start context of the workspace at ``root`` on ``day``.

    ``longterm`` False leaves MEMORY.md out (the caller's scope does not allow it); ``check`` is
    the caller's access decision on each resolved file and raises PathRefused to leave it out.
    Files that do not exist, are empty, or that ``get`` would refuse give no section.
    """
    wanted: list[tuple[str, str, bool]] = []  # (path, title, keep the head)
    if longterm:
        wanted.append(("MEMORY.md", "Long-term memory", True))
    yesterday = day - dt.timedelta(days=1)
    wanted.append((daily_log(day), f"Today ({day.isoformat()})", False))
    wanted.append((daily_log(yesterday), f"Yesterday ({yesterday.isoformat()})", False))
    sections: list[Section] = []
    left = max_chars
    for path, title, head in wanted:
        if left <= 0:
            break
        try:
            t = locate(root, path, extra_paths)
            if head and not Path(t.real).exists():
                t = locate(root, "memory.md", extra_paths)  # the legacy spelling
            if check is not None:
                check(t)
            kept, total = (_head if head else _tail)(_lines(t), left)
        except PathRefused as exc:  # e.g. a symlink leading out: left out, as get refuses it
            logger.info("session context leaves out %s: %s", path, exc)
            continue
        if head:
            kept = _trim(kept)
            start = 1
        else:
            start = total - len(kept) + 1
            while kept and not kept[0].strip():  # no blank lines at the cut
                kept.pop(0)
                start += 1
            kept = _trim(kept)
        if not kept or not "".join(kept).strip():
            continue
        text = "\n".join(kept)
        sections.append(Section(t.rel, title, start, start + len(kept) - 1, total, text))
        left -= len(text) + 1
    return sections
