"""Line-based Markdown chunking under a CJK-aware size budget, and splitting to fit a model.

Each chunk knows its 1-based inclusive line range; its text is an exact slice of the file."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from memd.text import CHARS_PER_TOKEN, estimate_tokens, weighted_len

__all__ = [
    "CHUNKER_VERSION",
    "LINES_VERSION",
    "Chunk",
    "Restart",
    "chunk_markdown",
    "chunk_resumable",
    "chunk_text",
    "fit_to_model",
    "vector_lines",
]

# Goes into the index identity: bump whenever the chunks produced for some input change.
CHUNKER_VERSION = 1

# Goes into the index identity too: bump whenever the lines chosen by vector_lines change.
LINES_VERSION = 1

TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class Chunk:
    """A piece of a file: lines ``start_line``..``end_line`` (1-based, inclusive)."""

    start_line: int
    end_line: int
    text: str
    hash: str  # sha256 hex of text (utf-8)


@dataclass(frozen=True)
class Restart:
    """A line where chunking may start afresh and give the chunks that follow unchanged.

    A chunk begins at the start of ``line`` with nothing carried into it but whole lines from
    ``line`` on, so :func:`chunk_resumable` of the text from ``line`` gives the chunks from here
    on. The chunks before it were fixed once line ``sealed`` was read: a text that only grows
    after line ``sealed`` keeps them, and this restart.
    """

    line: int
    sealed: int


@dataclass(frozen=True, slots=True)
class _Segment:
    line: int
    text: str
    cost: int  # weighted size plus one for the newline
    whole: bool  # the whole line, not a piece of a longer one


def _sha256(text: str) -> str:
    # surrogatepass: identical to strict UTF-8 for valid text, and never raises on lone surrogates.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _make(start_line: int, end_line: int, text: str) -> Chunk:
    return Chunk(start_line, end_line, text, _sha256(text))


def _split_lines(content: str) -> list[str]:
    """Lines of ``content``: no phantom line after a final newline, one trailing CR removed."""
    if not content:
        return []
    lines = content.split("\n")
    if content.endswith("\n"):
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _segments(line: str, tokens: int, max_chars: int) -> Iterator[str]:
    """Pieces of one line, each weighing at most ``max_chars``."""
    if not line:
        yield ""
        return
    for i in range(0, len(line), max_chars):
        piece = line[i : i + max_chars]
        if weighted_len(piece) <= max_chars:
            yield piece
        else:  # CJK-heavy: `tokens` characters weigh at most 4 * tokens <= max_chars
            for j in range(0, len(piece), tokens):
                yield piece[j : j + tokens]


def _join(buffer: list[_Segment]) -> Chunk:
    """Join segments: pieces of one line are concatenated, different lines joined by newlines."""
    parts = [buffer[0].text]
    for prev, seg in zip(buffer, buffer[1:]):
        if seg.line != prev.line:
            parts.append("\n")
        parts.append(seg.text)
    return _make(buffer[0].line, buffer[-1].line, "".join(parts))


def _carry(buffer: list[_Segment], overlap_chars: int) -> list[_Segment]:
    """The tail of ``buffer`` to repeat in the next chunk: at least ``overlap_chars``, never all."""
    if overlap_chars <= 0:
        return []
    start, acc = len(buffer), 0
    while start > 0 and acc < overlap_chars:
        start -= 1
        acc += buffer[start].cost
    return buffer[max(start, 1) :]


def chunk_markdown(content: str, tokens: int = 400, overlap: int = 80) -> list[Chunk]:
    """Split ``content`` into line-based chunks of about ``tokens`` estimated tokens.

    Consecutive chunks share about ``overlap`` tokens of whole lines. Every chunk's text weighs
    (``weighted_len``) at most ``max(32, 4 * tokens)``; a line longer than that is cut into
    pieces that share its line number. Whitespace-only chunks are dropped.
    """
    return chunk_resumable(content, tokens, overlap)[0]


def chunk_resumable(
    content: str, tokens: int = 400, overlap: int = 80, *, first_line: int = 1
) -> tuple[list[Chunk], list[Restart]]:
    """:func:`chunk_markdown` of ``content`` (whose first line is line ``first_line`` of its
    file), and the lines where it could have started afresh (in order, ``first_line`` first).

    A daily log that grows at its end is chunked again from its last restart only: the chunks
    before it stay as they are (memd/index/files.py).
    """
    tokens = max(1, tokens)
    max_chars = max(32, tokens * CHARS_PER_TOKEN)
    overlap_chars = max(0, overlap * CHARS_PER_TOKEN)
    chunks: list[Chunk] = []
    restarts = [Restart(first_line, first_line - 1)]
    buffer: list[_Segment] = []
    current = 0
    for line_no, line in enumerate(_split_lines(content), start=first_line):
        pieces = list(_segments(line, tokens, max_chars))
        for piece in pieces:
            seg = _Segment(line_no, piece, weighted_len(piece) + 1, len(pieces) == 1)
            if buffer and current + seg.cost > max_chars:
                chunks.append(_join(buffer))
                buffer = _carry(buffer, overlap_chars)
                current = sum(s.cost for s in buffer)
                # The overlap gives way so the new chunk still respects the budget.
                while buffer and current + seg.cost > max_chars:
                    current -= buffer.pop(0).cost
                # The new chunk starts with whole lines (or with this one): chunking afresh
                # from its first line fills the same buffer, so every later chunk is the same.
                head = buffer[0] if buffer else seg
                if head.whole:
                    restarts.append(Restart(head.line, line_no))
            buffer.append(seg)
            current += seg.cost
    if buffer:
        chunks.append(_join(buffer))
    return [chunk for chunk in chunks if chunk.text.strip()], restarts


def _split_line(
    line_no: int, line: str, count_tokens: TokenCounter, max_tokens: int
) -> list[Chunk]:
    """Cut one line into consecutive pieces that each fit, by binary search on the prefix."""
    pieces: list[Chunk] = []
    rest = line
    while rest:
        if count_tokens(rest) <= max_tokens:
            size = len(rest)
        else:
            fits, too_long = 0, len(rest)  # rest[:fits] fits (or is empty); rest[:too_long] not
            while too_long - fits > 1:
                mid = (fits + too_long) // 2
                if count_tokens(rest[:mid]) <= max_tokens:
                    fits = mid
                else:
                    too_long = mid
            if fits == 0:
                raise ValueError(
                    f"line {line_no}: the character {rest[0]!r} alone is over {max_tokens} tokens"
                )
            size = fits
        piece, rest = rest[:size], rest[size:]
        if piece.strip():
            pieces.append(_make(line_no, line_no, piece))
    return pieces


def _fit_lines(
    start_line: int, lines: list[str], count_tokens: TokenCounter, max_tokens: int
) -> list[Chunk]:
    text = "\n".join(lines)
    if not text.strip():
        return []
    if count_tokens(text) <= max_tokens:
        return [_make(start_line, start_line + len(lines) - 1, text)]
    if len(lines) == 1:
        return _split_line(start_line, text, count_tokens, max_tokens)
    mid = len(lines) // 2
    return _fit_lines(start_line, lines[:mid], count_tokens, max_tokens) + _fit_lines(
        start_line + mid, lines[mid:], count_tokens, max_tokens
    )


def fit_to_model(chunks: list[Chunk], count_tokens: TokenCounter, max_tokens: int) -> list[Chunk]:
    """Split every chunk that ``count_tokens`` says is over ``max_tokens`` until all pieces fit.

    Oversized chunks are halved at line boundaries; a single line still too long is cut into
    consecutive pieces on that line. Text is never truncated (only whitespace-only pieces are
    dropped). Raises ValueError if one character alone is over the limit.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    out: list[Chunk] = []
    for chunk in chunks:
        if count_tokens(chunk.text) <= max_tokens:
            out.append(chunk)
            continue
        lines = chunk.text.split("\n")
        if len(lines) != chunk.end_line - chunk.start_line + 1:
            raise ValueError(
                f"chunk text has {len(lines)} lines but claims lines "
                f"{chunk.start_line}-{chunk.end_line}"
            )
        out.extend(_fit_lines(chunk.start_line, lines, count_tokens, max_tokens))
    return out


def chunk_text(
    content: str,
    tokens: int,
    overlap: int,
    count_tokens: TokenCounter | None = None,
    max_tokens: int | None = None,
) -> list[Chunk]:
    """:func:`chunk_markdown`, then :func:`fit_to_model` when ``max_tokens`` is given.

    Without ``count_tokens`` the limit is checked with :func:`memd.text.estimate_tokens`.
    """
    chunks = chunk_markdown(content, tokens, overlap)
    if max_tokens is None:
        return chunks
    return fit_to_model(chunks, count_tokens or estimate_tokens, max_tokens)


def vector_lines(text: str) -> list[tuple[str, str]]:
    """The lines of a chunk that get a vector of their own, as (text, hash), in order.

    A chunk of 15-20 conversation turns has one vector that averages them all, while a question
    is about one of them; search scores a chunk by its best line (or pair of adjacent lines) as
    well (docs/benchmarks.md). Every line of four or more characters that is not a heading
    qualifies. A chunk with fewer than two such lines gets none: its own vector is that line.
    """
    lines = [
        line
        for line in _split_lines(text)
        if len(line.strip()) > 3 and not line.lstrip().startswith("#")
    ]
    if len(lines) < 2:
        return []
    return [(line, _sha256(line)) for line in lines]
