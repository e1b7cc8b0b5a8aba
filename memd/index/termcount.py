"""Each chunk's FTS5 terms and their counts, as the index's own tokenizer makes them, counted
with numpy instead of a Python step per word: the in-memory keyword postings
(memd/index/postings.py) are built from chunk texts with it.

The text is cut into words at ASCII bytes that are neither letters nor digits. Every such byte
separates tokens for unicode61 (only letters, digits and private-use characters make tokens),
so the tokens of a text are the tokens of its words, one after the other. Each distinct word is
given to SQLite's tokenizer once (porter over unicode61, the table's, through apsw) and its
tokens kept; a word's every other occurrence is looked up by its bytes (a word of at most 16
bytes is its own 128-bit key, a longer one is looked up by its text). ASCII letters are
lower-cased first, as unicode61 folds them itself. What FTS5 stores for a chunk is fixed by
:func:`fts_columns`, which the store writes with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import numpy as np

from memd.text import fts_body, fts_unigrams, word_tokens

__all__ = ["TOKENIZER", "Counts", "TermCounter", "fts_columns", "tokenizer"]

# The table's tokenizer (memd/index/schema.py: tokenize='porter unicode61 remove_diacritics 2').
TOKENIZER = ("porter", ["unicode61", "remove_diacritics", "2"])
# bm25()'s weight of each column in quarters: body 1, uni 1, path 0.25 (memd/index/bm25.py).
QUARTERS = np.array([4, 4, 1], dtype=np.int64)
SHORT = 16  # bytes: a word this long or shorter is looked up by its bytes as two integers

_I64 = np.int64
_TOKEN_BYTE = np.zeros(256, dtype=bool)  # bytes that can be part of a token
_TOKEN_BYTE[[*range(48, 58), *range(65, 91), *range(97, 123), *range(128, 256)]] = True
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[65:91] += 32
# _MASKS[n]: the low n bytes of an integer
_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)


def fts_columns(path: str, text: str) -> tuple[str, str, str]:
    """What the FTS row of a chunk holds: (body, uni, path)."""
    return fts_body(text), fts_unigrams(text), " ".join(word_tokens(path))


def tokenizer(conn: apsw.Connection) -> apsw.FTS5Tokenizer:
    return conn.fts5_tokenizer(*TOKENIZER)


@dataclass
class Counts:
    """The terms of a batch of chunks: for each (term, row) pair, sorted by term then row, the
    term's count weighted as bm25() weighs the columns, in quarters; the same for the uni column
    alone (a phrase searched in it); and each row's length in tokens (every column)."""

    terms: np.ndarray[Any, np.dtype[np.int32]]
    rows: np.ndarray[Any, np.dtype[np.int32]]
    weights: np.ndarray[Any, np.dtype[np.int64]]
    uni_terms: np.ndarray[Any, np.dtype[np.int32]]
    uni_rows: np.ndarray[Any, np.dtype[np.int32]]
    uni_weights: np.ndarray[Any, np.dtype[np.int64]]
    lengths: np.ndarray[Any, np.dtype[np.int64]]


class TermCounter:
    """Counts the terms of chunks; ``vocab`` maps each token to its term id (new tokens get the
    next id). Not thread-safe: one caller at a time."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self._short: dict[tuple[int, int], int] = {}  # a short word's two integers -> word id
        self._long: dict[str, int] = {}  # a longer word -> word id
        self._wtoks: list[int] = []  # every word's term ids, one after another
        self._wstart: list[int] = [0]  # where each word's run of ids starts in _wtoks
        self._arrays: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None
        self._paths: dict[str, str] = {}

    def forget_words(self) -> None:
        """Drop the word memo (kept only while a whole index is counted)."""
        self._short.clear()
        self._long.clear()
        self._wtoks.clear()
        self._wstart[:] = [0]
        self._arrays = None
        self._paths.clear()

    def count(self, tok: apsw.FTS5Tokenizer, chunks: Sequence[tuple[str, str]]) -> Counts:
        """The counts of ``chunks`` ((path, text) each; row i is chunks[i])."""
        segments: list[bytes] = []
        for path, text in chunks:
            words = self._paths.get(path)
            if words is None:
                words = self._paths[path] = " ".join(word_tokens(path))
            if text.isascii():
                segments += (text.encode(), b"", words.encode())
            else:
                body, uni, _ = fts_columns("", text)
                segments += (body.encode(), uni.encode(), words.encode())
        nrows = len(chunks)
        sizes = np.fromiter(map(len, segments), dtype=_I64, count=len(segments))
        seg_start = np.cumsum(sizes + 1) - (sizes + 1)  # each segment then one separator byte
        raw = np.frombuffer(b"\x00".join(segments) + b"\x00", dtype=np.uint8)
        edge = np.diff(_TOKEN_BYTE[raw].view(np.int8), prepend=np.int8(0), append=np.int8(0))
        starts = np.flatnonzero(edge == 1)
        ends = np.flatnonzero(edge == -1)
        seg = np.searchsorted(seg_start, starts, side="right") - 1
        wids = self._word_ids(tok, _LOWER[raw], starts, ends)
        wtoks, wstart = self._word_arrays()
        ntok = wstart[wids + 1] - wstart[wids]
        first = np.repeat(wstart[wids], ntok)
        within = np.arange(int(ntok.sum()), dtype=_I64) - np.repeat(np.cumsum(ntok) - ntok, ntok)
        term = wtoks[first + within]
        seg_of = np.repeat(seg, ntok)
        row, col = seg_of // 3, seg_of % 3
        lengths = np.bincount(row, minlength=nrows).astype(_I64)
        terms, rows, weights = _aggregate(term, row, QUARTERS[col], nrows)
        uni = col == 1
        uni_terms, uni_rows, uni_weights = _aggregate(
            term[uni], row[uni], QUARTERS[col[uni]], nrows
        )
        return Counts(terms, rows, weights, uni_terms, uni_rows, uni_weights, lengths)

    def _word_ids(
        self,
        tok: apsw.FTS5Tokenizer,
        low: np.ndarray[Any, np.dtype[np.uint8]],
        starts: np.ndarray[Any, np.dtype[np.int64]],
        ends: np.ndarray[Any, np.dtype[np.int64]],
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The word id of each word ``low[starts[i]:ends[i]]``; a new word is tokenised."""
        lens = ends - starts
        wids = np.empty(len(starts), dtype=_I64)
        short = np.flatnonzero(lens <= SHORT)
        at, size = starts[short], lens[short]
        # the bytes at every offset read as a little-endian integer, eight at a time
        padded = np.concatenate([low, np.zeros(SHORT + 8, dtype=np.uint8)])
        eights = np.ndarray(buffer=padded, dtype="<u8", shape=(len(padded) - 7,), strides=(1,))
        lo = eights[at] & _MASKS[np.minimum(size, 8)]
        hi = eights[at + 8] & _MASKS[np.clip(size - 8, 0, 8)]
        # sorted by a hash of the two (its high bits) with each word's index in the low bits:
        # one in-place sort, no argsort (several times slower); equal hashes whose words
        # differ are found below and looked up by their text
        bits = max(1, len(short).bit_length())
        mixed = (lo * np.uint64(0x9E3779B97F4A7C15) ^ hi) >> np.uint64(bits) << np.uint64(bits)
        mixed |= np.arange(len(short), dtype=np.uint64)
        mixed.sort()
        order = (mixed & np.uint64((1 << bits) - 1)).astype(_I64)
        ordered = mixed >> np.uint64(bits)
        new_group = np.diff(ordered, prepend=ordered[:1] + np.uint64(1)) != 0
        group = np.cumsum(new_group) - 1
        heads = order[new_group]  # one word of each group
        inverse = np.empty(len(order), dtype=_I64)
        inverse[order] = group
        member = heads[inverse]
        clash = np.flatnonzero((lo[member] != lo) | (hi[member] != hi))
        ids = np.fromiter(
            (
                self._short_id(tok, key, low, int(at[h]), int(size[h]))
                for key, h in zip(
                    zip(lo[heads].tolist(), hi[heads].tolist(), strict=True),
                    heads.tolist(),
                    strict=True,
                )
            ),
            dtype=_I64,
            count=len(heads),
        )
        wids[short] = ids[inverse]
        # a longer word, or the rare short one whose mixed key another shares: by its text
        slow = np.concatenate([np.flatnonzero(lens > SHORT), short[clash]])
        for i in slow.tolist():
            word = low[starts[i] : ends[i]].tobytes().decode()
            wid = self._long.get(word)
            if wid is None:
                wid = self._long[word] = self._new_word(tok, word)
            wids[i] = wid
        return wids

    def _short_id(
        self,
        tok: apsw.FTS5Tokenizer,
        key: tuple[int, int],
        low: np.ndarray[Any, np.dtype[np.uint8]],
        at: int,
        size: int,
    ) -> int:
        wid = self._short.get(key)
        if wid is None:
            wid = self._short[key] = self._new_word(tok, low[at : at + size].tobytes().decode())
        return wid

    def _new_word(self, tok: apsw.FTS5Tokenizer, word: str) -> int:
        tokens = tok(
            word.encode(),
            apsw.FTS5_TOKENIZE_DOCUMENT,
            None,
            include_offsets=False,
            include_colocated=False,
        )
        vocab = self.vocab
        self._wtoks.extend(vocab.setdefault(str(t), len(vocab)) for t in tokens)
        self._wstart.append(len(self._wtoks))
        self._arrays = None
        return len(self._wstart) - 2

    def _word_arrays(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        if self._arrays is None:
            self._arrays = (
                np.asarray(self._wtoks, dtype=np.int32),
                np.asarray(self._wstart, dtype=_I64),
            )
        return self._arrays


def _aggregate(
    term: np.ndarray[Any, Any], row: np.ndarray[Any, Any], weight: np.ndarray[Any, Any], nrows: int
) -> tuple[
    np.ndarray[Any, np.dtype[np.int32]],
    np.ndarray[Any, np.dtype[np.int32]],
    np.ndarray[Any, np.dtype[np.int64]],
]:
    """One entry per distinct (term, row), sorted by term then row, its weights summed. The
    weight rides in the key's low bits, so one in-place sort orders all three."""
    width = max(1, nrows)
    key = (term.astype(_I64) * width + row) << 3 | weight
    key.sort()
    pair = key >> 3
    first = np.flatnonzero(np.diff(pair, prepend=np.int64(-1)))
    summed = np.add.reduceat(key & 7, first) if len(first) else key[:0]
    pair = pair[first]
    return (pair // width).astype(np.int32), (pair % width).astype(np.int32), summed
