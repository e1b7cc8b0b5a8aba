"""Secrets laid out over lines: a Markdown table whose column or row names a secret, a value split
across two table rows, a long value wrapped onto the lines below it."""

from __future__ import annotations

import re

from memd.redact.base import MARK
from memd.redact.names import Tier, accepts, tier

_PIPE = re.compile(r"(?<!\\)\|")
_SEPARATOR = re.compile(r"[ \t]*:?-+:?[ \t]*")
# A lone word that can be the rest of a wrapped value, before an optional closing quote or comma.
_PIECE = re.compile(r"(?P<v>[A-Za-z0-9+/=_.~%-]{4,})[\"',]{0,3}")
_SQL_TYPE = re.compile(r"[A-Za-z]+(?:\(\d+(?:,[ \t]*\d+)?\))?(?:\[\])?")
_DECORATION = "`*\"' \t"


_MAX_CELLS = 64  # a wider "row" is not a table anyone reads


def _cells(line: str) -> list[tuple[int, int]] | None:
    """Spans of the cells of a Markdown table row, or None when `line` is not one."""
    if not line.lstrip().startswith("|") or line.count("|") > _MAX_CELLS + 1:
        return None
    pipes = [m.start() for m in _PIPE.finditer(line)]
    spans = [(a + 1, b) for a, b in zip(pipes, pipes[1:], strict=False)]
    if line[pipes[-1] + 1 :].strip():
        spans.append((pipes[-1] + 1, len(line)))
    return spans


def _core(cell: str) -> tuple[int, int]:
    """Span of a cell's value inside `cell`, without padding, backticks, bold or quotes."""
    start = len(cell) - len(cell.lstrip(_DECORATION))
    return start, max(start, len(cell.rstrip(_DECORATION)))


def _cell_secret(level: Tier, value: str) -> bool:
    if level is Tier.NONE or len(value.split()) != 1:
        return False
    if level is not Tier.ENTROPY and (value.isalpha() or _SQL_TYPE.fullmatch(value)):
        return False  # a word or a column type (`VARCHAR(255)`), as in a schema table
    return accepts(level, value, after="")


def redact_tables(text: str) -> tuple[str, int]:
    """Redact table cells under a column, or right of a cell, whose name says secret."""
    lines = text.split("\n")
    columns: list[Tier] = []
    count = 0
    for i, line in enumerate(lines):
        spans = _cells(line)
        if spans is None:
            columns = []
            continue
        texts = [line[a:b] for a, b in spans]
        if all(_SEPARATOR.fullmatch(t) for t in texts):
            continue
        following = _cells(lines[i + 1]) if i + 1 < len(lines) else None
        if following and all(_SEPARATOR.fullmatch(lines[i + 1][a:b]) for a, b in following):
            columns = [tier(t.strip(_DECORATION)) for t in texts]  # a header row
            continue
        for c in range(len(spans) - 1, -1, -1):  # right to left: spans stay valid
            level = columns[c] if c < len(columns) else Tier.NONE
            left = texts[c - 1].strip(_DECORATION) if c else ""
            if left and len(left) <= 40 and len(left.split()) <= 4:
                level = max(level, tier(left))
            start, end = _core(texts[c])
            if MARK not in texts[c] and _cell_secret(level, texts[c][start:end]):
                a = spans[c][0]
                line = line[: a + start] + MARK + line[a + end :]
                count += 1
        lines[i] = line
    return "\n".join(lines), count


def _removed(before: str, after: str) -> int:
    """How many characters the redactions on this line took away."""
    added = after.count(MARK) - before.count(MARK)
    return len(before) - len(after) + added * len(MARK)


def _piece(line: str) -> re.Match[str] | None:
    m = _PIECE.fullmatch(line.strip())
    if m is None:
        return None
    v = m.group("v")
    random_looking = any(c.isdigit() or c in "+/" for c in v) or any(c.isupper() for c in v[1:])
    return m if v.endswith("=") or (len(v) >= 8 and random_looking) else None


def _replace_piece(line: str, piece: re.Match[str]) -> str:
    lead = len(line) - len(line.lstrip())
    return line[: lead + piece.start("v")] + MARK + line[lead + piece.end("v") :]


def carry_over(before: str, after: str) -> tuple[str, int]:
    """Redact the rest of values that run on below a line a rule redacted: the next table row's
    cell under a redacted cell (its cells to the left empty), or the next line of a wrapped value.

    Args:
        before: the block as it was.
        after: the block after every other rule, with the same lines.
    """
    old, new = before.split("\n"), after.split("\n")
    count = 0
    for i in range(len(new) - 1):
        if new[i] == old[i]:
            continue
        here, below = _cells(new[i]), _cells(new[i + 1])
        if here is not None and below is not None:
            was = _cells(old[i]) or []
            for c, (a, b) in enumerate(here):
                if c >= len(below) or c >= len(was):
                    break
                cell, old_cell = new[i][a:b], old[i][was[c][0] : was[c][1]]
                if MARK not in cell or _removed(old_cell, cell) < 12:
                    continue
                if any(new[i + 1][x:y].strip() for x, y in below[:c]):
                    continue
                x, y = below[c]
                piece = _piece(new[i + 1][x:y])
                if piece is not None:
                    new[i + 1] = (
                        new[i + 1][:x] + _replace_piece(new[i + 1][x:y], piece) + new[i + 1][y:]
                    )
                    count += 1
        elif new[i].rstrip().endswith(MARK) and _removed(old[i], new[i]) >= 16:
            piece = _piece(new[i + 1])
            if piece is not None and MARK not in new[i + 1]:
                new[i + 1] = _replace_piece(new[i + 1], piece)
                count += 1
    return "\n".join(new), count
