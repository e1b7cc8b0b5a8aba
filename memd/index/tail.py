"""What of a memory file is indexed, and how a file that grew at its end is indexed again.

A file over ``index.max_file_bytes`` is indexed in part: its first bytes up to that cap, cut
after their last whole line. A daily log only grows, so its head is what was searchable before
it crossed the cap; keeping the head keeps all of that searchable, and its appends beyond the
cap change nothing in the index. Status names the file and the cap (its newest text is not
searchable).

A daily log takes appends all day, and redacting, chunking and writing all of a 7 MB log again
for each took over 5 s. The chunker says where it could have started afresh (``Restart``,
memd/index/chunk.py); the index keeps one such point per file (``Resume``: its line, its byte
offset, and how many bytes were indexed). When the bytes indexed before are still the file's
first bytes (the hash of that length matches the file's row), only the text from that point is
decoded, redacted and chunked, as it was and as it is now, and the chunks that differ are
replaced: the rows are those a fresh index of the whole file would have. Redaction goes block
by block (a line and the lines that continue it, memd/redact/engine.py) except for private
keys, so the point must start a block, and a file that may hold a private key is indexed
whole.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from memd.index.chunk import Chunk, Restart
from memd.index.store import ChunkKey, Resume
from memd.redact import starts_block

__all__ = ["changed_chunks", "digests", "indexed_part", "resume_at"]

_BOMS = (b"\xff\xfe", b"\xfe\xff")  # UTF-16: its lines do not start after a b"\n" byte


def indexed_part(data: bytes, cap: int) -> bytes:
    """The bytes of a file that are indexed: all of them, or of a file over ``cap`` bytes its
    first ``cap`` bytes up to the end of their last whole line (with no line end among them,
    up to the last character that fits)."""
    if len(data) <= cap:
        return data
    end = data.rfind(b"\n", 0, cap)
    if end >= 0:
        return data[: end + 1]
    cut = cap
    while cut > 0 and data[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
        cut -= 1
    return data[:cut]


def digests(raw: bytes, point: Resume | None) -> tuple[str, str | None]:
    """The SHA-256 of ``raw`` and, when it is longer than the ``point.length`` bytes indexed
    before (and not UTF-16), of those first bytes: one pass over a 7 MB log, not two."""
    h = hashlib.sha256()
    if point is None or len(raw) <= point.length or raw.startswith(_BOMS):
        h.update(raw)
        return h.hexdigest(), None
    view = memoryview(raw)
    h.update(view[: point.length])
    before = h.hexdigest()
    h.update(view[point.length :])
    return h.hexdigest(), before


def resume_at(raw: bytes, restarts: Sequence[Restart], base: Resume | None = None) -> Resume | None:
    """The last of ``restarts`` that text appended to ``raw`` keeps: the chunks before it were
    sealed by whole lines, and its line starts a block of redaction.

    ``raw`` is the file's indexed bytes; the restarts are lines of the file, in order, found by
    chunking it from ``base`` (None: from its start).
    """
    if raw.startswith(_BOMS):
        return None
    first, start = (base.line, base.offset) if base is not None else (1, 0)
    complete = first - 1 + raw.count(b"\n", start)  # the lines that end with a b"\n"
    starts = _line_starts_backward(raw, first, start)
    line, pos = next(starts)
    for restart in reversed(restarts):
        if restart.sealed > complete or restart.line < first:
            continue
        while line > restart.line:
            line, pos = next(starts)
        if _starts_block(raw, pos):
            return Resume(restart.line, pos, len(raw))
    return None


def _starts_block(raw: bytes, pos: int) -> bool:
    """Whether the line at byte ``pos`` of ``raw`` starts a block of redaction."""
    end = raw.find(b"\n", pos)
    line = raw[pos : len(raw) if end < 0 else end].decode("utf-8", "replace")
    if pos == 0:
        return starts_block(None, line)
    previous = raw[raw.rfind(b"\n", 0, pos - 1) + 1 : pos - 1].decode("utf-8", "replace")
    return starts_block(previous, line)


def _line_starts_backward(raw: bytes, first: int, start: int) -> Iterator[tuple[int, int]]:
    """(line, byte offset of its start) from the line after the last b"\n" back to line
    ``first``, which starts at ``start``: a restart is near the end, so this reads little."""
    line = first + raw.count(b"\n", start)
    pos = raw.rfind(b"\n", start) + 1 if line > first else start
    yield line, pos
    while line > first:
        end = raw.rfind(b"\n", start, pos - 1)  # the line end before the one at pos - 1
        pos = end + 1 if end >= 0 else start
        line -= 1
        yield line, pos


def changed_chunks(
    old: Iterable[Chunk], new: Iterable[Chunk]
) -> tuple[list[ChunkKey], list[Chunk]]:
    """The keys of the rows of ``old`` that ``new`` has not (each as often as it lacks it),
    and the chunks of ``new`` that ``old`` has not."""
    have = Counter((c.start_line, c.end_line, c.hash) for c in old)
    added: list[Chunk] = []
    for c in new:
        key = (c.start_line, c.end_line, c.hash)
        if have[key] > 0:
            have[key] -= 1
        else:
            added.append(c)
    removed = [key for key, n in have.items() for _ in range(n)]
    return removed, added
