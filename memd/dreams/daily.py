"""Snippets of a daily note for the Light phase of dreaming, cut as OpenClaw cuts them.

A list item is one snippet (with its continuation lines, prefixed by its heading and its
parent items: ``Heading: parent > child``); other text lines are merged, up to four, into one
snippet of at most 280 characters under their heading; snippets under 8 characters are
dropped. Generic headings ("Today", "Monday, March 3", "2026-03-03") and the blocks dreaming
itself writes into a daily note are not memory and are left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DAILY_SCORE", "DailySnippet", "daily_snippets"]

DAILY_SCORE = 0.62  # the score a snippet from a daily note is recorded with
MAX_CHARS = 280
MIN_CHARS = 8
MAX_CHUNK_LINES = 4

_DAILY_FILE = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:-[^/]+)?\.md$", re.IGNORECASE)
_MONTHS = (
    "jan|january|feb|february|mar|march|apr|april|may|jun|june|jul|july|aug|august|"
    "sep|sept|september|oct|october|nov|november|dec|december"
)
_WEEKDAYS = (
    "mon|monday|tue|tues|tuesday|wed|wednesday|thu|thur|thurs|thursday|fri|friday|"
    "sat|saturday|sun|sunday"
)
_GENERIC_DAY = re.compile(
    rf"^(?:(?:{_WEEKDAYS})(?:,\s+)?)?(?:(?:{_MONTHS})\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,\s*\d{{4}})?"
    r"|\d{1,2}[/-]\d{1,2}(?:[/-]\d{2,4})?|\d{4}[/-]\d{2}[/-]\d{2})$",
    re.IGNORECASE,
)
_GENERIC_WORDS = {"today", "yesterday", "tomorrow", "morning", "afternoon", "evening", "night"}
_HEADING = re.compile(r"^#{1,6}\s+(.+)$")
_LIST_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+\.)\s+(.+)$")
_MANAGED = {  # start marker -> heading: the blocks dreaming writes into a daily note
    "<!-- openclaw:dreaming:light:start -->": (
        "## Light Sleep",
        "<!-- openclaw:dreaming:light:end -->",
    ),
    "<!-- openclaw:dreaming:rem:start -->": ("## REM Sleep", "<!-- openclaw:dreaming:rem:end -->"),
}


@dataclass(frozen=True)
class DailySnippet:
    start_line: int
    end_line: int
    snippet: str


def _space(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _unmark(line: str) -> str:
    return re.sub(r"^[-*+]\s+", "", re.sub(r"^\d+\.\s+", "", line)).strip()


def _heading(line: str) -> str | None:
    m = _HEADING.match(line.strip())
    if m is None:
        return None
    heading = _unmark(m[1])
    generic = heading.lower() in _GENERIC_WORDS or _GENERIC_DAY.match(_space(heading)) is not None
    if not heading or _DAILY_FILE.match(heading) or generic:
        return None
    return _space(heading[:MAX_CHARS])


def _chunk(heading: str | None, lines: Sequence[str]) -> str:
    body = " ".join(lines).strip()
    text = f"{heading}: {body}" if heading else body
    return _space(text[:MAX_CHARS]).strip()


def _strip_managed(lines: list[str]) -> list[str]:
    out = list(lines)
    i = 0
    while i < len(out):
        block = _MANAGED.get(out[i].strip())
        if block is None:
            i += 1
            continue
        heading, end_marker = block
        until = -1
        for j in range(i + 1, len(out)):
            t = out[j].strip()
            if t == end_marker:
                until = j
                break
            if re.match(r"^#{1,6}\s+", t) or t in _MANAGED:
                until = j - 1
                break
        if until < i:
            i += 1
            continue
        start = i
        for k in range(i - 1, -1, -1):  # the block's own heading just above it goes too
            if lines[k].strip():
                start = k if lines[k].strip() == heading else i
                break
        for k in range(start, until + 1):
            out[k] = ""
        i = until + 1
    return out


def daily_snippets(lines: Sequence[str], limit: int = 100) -> list[DailySnippet]:
    """The snippets of a daily note's ``lines``, at most ``limit``, in file order."""
    text = _strip_managed(list(lines))
    chunks: list[DailySnippet] = []
    heading: str | None = None
    chunk: list[str] = []
    first = last = 0
    ancestors: list[tuple[int, str]] = []

    def flush() -> None:
        nonlocal chunk, first, last
        if chunk:
            snippet = _chunk(heading, chunk)
            if len(snippet) >= MIN_CHARS:
                chunks.append(DailySnippet(first, last, snippet))
        chunk, first, last = [], 0, 0

    i = 0
    while i < len(text) and len(chunks) < limit:
        line = text[i]
        new_heading = _heading(line)
        if new_heading:
            flush()
            heading, ancestors = new_heading, []
            i += 1
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("<!--"):
            flush()
            ancestors = []
            i += 1
            continue
        item = _LIST_ITEM.match(line)
        if item:
            flush()
            indent = len(item[1])
            body = _space(_unmark(stripped)[:MAX_CHARS])
            if not body:
                ancestors = []
                i += 1
                continue
            while ancestors and ancestors[-1][0] >= indent:
                ancestors.pop()
            more: list[str] = []
            end, nested, nested_at = i, False, None
            for j in range(i + 1, len(text)):
                t = text[j].strip()
                if not t:
                    k = j + 1
                    while k < len(text) and not text[k].strip():
                        k += 1
                    loose = _LIST_ITEM.match(text[k]) if k < len(text) else None
                    if loose and len(loose[1]) > indent:
                        nested, nested_at = True, k
                    break
                if t.startswith(("#", "<!--")):
                    break
                child = _LIST_ITEM.match(text[j])
                if child:
                    nested = len(child[1]) > indent
                    break
                more.append(_space(t))
                end = j
            claim = " ".join([body, *more])
            path = " > ".join([*(a for _, a in ancestors), claim]).replace(": > ", ": ")
            snippet = _chunk(heading, [path])
            label_only = nested and not more and body.endswith(":")
            if not label_only and len(snippet) >= MIN_CHARS:
                chunks.append(DailySnippet(i + 1, end + 1, snippet))
            ancestors.append((indent, claim))
            i = (end if nested_at is None else nested_at - 1) + 1
            continue
        ancestors = []
        if stripped.startswith("#") or len(_unmark(stripped)) < MIN_CHARS:
            flush()
            i += 1
            continue
        snippet = _space(_unmark(stripped)[:MAX_CHARS])
        if chunk and (
            len(chunk) >= MAX_CHUNK_LINES or len(_chunk(heading, [*chunk, snippet])) > MAX_CHARS
        ):
            flush()
        if not chunk:
            first = i + 1
        chunk.append(snippet)
        last = i + 1
        i += 1
    flush()
    return chunks[:limit]
