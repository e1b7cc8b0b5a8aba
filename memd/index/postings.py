"""The FTS index's terms in memory: for each term, the chunks holding it and how often, as
bm25() weighs the columns (body and CJK unigrams 1, path 0.25; held in quarters, so exactly).

A term's postings are its rows (one row per chunk) in row order, 4 bytes each, and its
weighted counts, 2 bytes: about 135 postings a LoCoMo chunk, 78 MB at 97,501 chunks, plus 17
bytes a row. They are built from the chunks' texts in one snapshot (counted by
memd/index/termcount.py, a thousand chunks at a time) and checked against FTS5's own count of
each term's rows (fts5vocab): a difference means the counting does not match the index, and
the build is refused (Mismatch). They follow the file through ``fts_log``: every chunk row
inserted or deleted adds a row in the same transaction (memd/index/store.py), and
:meth:`Postings.apply_log` drops each chunk logged since and adds it again as the snapshot
holds it. Rows added since the build sit in a sorted tail; when it, or the deleted rows, grow
large, the postings are built again (:meth:`Postings.worn`). memd/index/keywords.py keeps them
for an index file and ranks with them (memd/index/bm25.py).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw
import numpy as np

from memd.index.db import select_in, snapshot
from memd.index.termcount import Counts, TermCounter, tokenizer

__all__ = ["LOG_TRIMMED_KEY", "Mismatch", "Postings", "Stopped", "trimmed"]

LOG_TRIMMED_KEY = "fts_log_trimmed"  # meta: the last fts_log row a trim deleted
BATCH = 1024  # chunks counted at a time while building (about 40 MB of work arrays)
# Built again when the rows added since exceed this share of the postings, or the deleted rows
# this share of all rows: each query merges the tail's runs with the built ones.
TAIL_SHARE, DEAD_SHARE = 0.125, 0.25
TAIL_MIN, DEAD_MIN = 65_536, 1024

_I32, _I64, _F64 = np.int32, np.int64, np.float64


class Mismatch(Exception):
    """The counted terms differ from what FTS5 holds."""


class Stopped(Exception):
    """A build was asked to stop (its index is closing or being replaced)."""


@dataclass
class _Sorted:
    """Postings kept sorted by (term, row), as one key each (term << 32 | row): a term's run is
    found by a binary search, and new postings are inserted, not sorted in."""

    keys: np.ndarray[Any, np.dtype[np.int64]] = field(default_factory=lambda: np.zeros(0, _I64))
    weights: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, np.uint32))

    def run(self, term: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        a, b = np.searchsorted(self.keys, [term << 32, (term + 1) << 32])
        return (self.keys[a:b] & 0xFFFFFFFF).astype(_I32), self.weights[a:b]

    def merged(self, terms: Any, rows: Any, weights: Any) -> _Sorted:
        """With postings added, each in its place."""
        new = terms.astype(_I64) << 32 | rows.astype(_I64)
        order = np.argsort(new)
        new, weights = new[order], np.asarray(weights)[order]
        at = np.searchsorted(self.keys, new)
        return _Sorted(np.insert(self.keys, at, new), np.insert(self.weights, at, weights))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.weights.nbytes)


class Postings:
    """One build of the postings of a file, and the rows applied since (see the module doc).
    Not thread-safe: memd/index/keywords.py holds a lock around every use."""

    def __init__(self, vocab: dict[str, int], seq: int) -> None:
        self.vocab = vocab
        self.counter = TermCounter(vocab)
        self.seq = seq
        self.start = np.zeros(
            1, dtype=_I64
        )  # the built postings: term t's run is [start[t], start[t+1])
        self.rows = np.zeros(0, dtype=_I32)
        self.weights: np.ndarray[Any, Any] = np.zeros(0, dtype=np.uint16)
        self.tail = _Sorted()  # rows added since the build
        self.uni = _Sorted()  # the uni column alone (a CJK character searched on its own)
        self.fmax = np.zeros(0, dtype=_F64)  # per term: its largest weight, and the shortest
        self.dmin = np.zeros(0, dtype=_F64)  # row holding it (the most it can add to a score)
        self.ids = np.zeros(0, dtype=_I64)  # per row: its chunk id, length in tokens, liveness
        self.lengths = np.zeros(0, dtype=_F64)
        self.live = np.zeros(0, dtype=bool)
        self.row_of = np.full(0, -1, dtype=_I32)  # chunk id -> row (-1: none)
        self.count = 0  # rows in use, live or deleted
        self.alive = 0
        self.total = 0.0  # tokens in the live rows
        self.dead = 0

    # -- rows ------------------------------------------------------------------------------------

    def add(self, ids: Sequence[int], counts: Counts) -> None:
        """Append the rows of ``ids`` (counted as ``counts``, row i being ids[i]) to the tail."""
        n = len(ids)
        first = self.count
        self.grow(first + n)
        self.ids[first : first + n] = ids
        self.lengths[first : first + n] = counts.lengths
        self.live[first : first + n] = True
        self.map_rows(np.asarray(ids, dtype=_I64), np.arange(first, first + n, dtype=_I32))
        self.count += n
        self.alive += n
        self.total += float(counts.lengths.sum())
        rows = counts.rows.astype(_I32) + first
        self.bound(counts.terms, counts.weights, self.lengths[rows])
        self.tail = self.tail.merged(counts.terms, rows, counts.weights.astype(np.uint32))
        self.uni = self.uni.merged(
            counts.uni_terms, counts.uni_rows + first, counts.uni_weights.astype(np.uint32)
        )

    def drop(self, chunk_id: int) -> None:
        row = int(self.row_of[chunk_id]) if 0 <= chunk_id < len(self.row_of) else -1
        if row >= 0:
            self.row_of[chunk_id] = -1
            self.live[row] = False
            self.alive -= 1
            self.total -= float(self.lengths[row])
            self.dead += 1

    def grow(self, size: int) -> None:
        if size > len(self.ids):
            cap = max(size, len(self.ids) * 3 // 2, 1024)
            self.ids = np.resize(self.ids, cap)
            self.lengths = np.resize(self.lengths, cap)
            live = np.zeros(cap, dtype=bool)
            live[: self.count] = self.live[: self.count]
            self.live = live

    def map_rows(self, ids: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> None:
        if len(ids) and int(ids.max()) >= len(self.row_of):
            grown = np.full(max(int(ids.max()) + 1, len(self.row_of) * 3 // 2), -1, dtype=_I32)
            grown[: len(self.row_of)] = self.row_of
            self.row_of = grown
        self.row_of[ids] = rows

    def bound(self, terms: Any, weights: Any, lengths: Any) -> None:
        """Raise the per-term maxima to cover new postings."""
        size = len(self.vocab)
        if size > len(self.fmax):
            self.fmax = np.concatenate([self.fmax, np.zeros(size - len(self.fmax))])
            self.dmin = np.concatenate([self.dmin, np.full(size - len(self.dmin), np.inf)])
        np.maximum.at(self.fmax, terms, weights)
        np.minimum.at(self.dmin, terms, lengths)

    # -- reading ---------------------------------------------------------------------------------

    def run(self, kind: str | None, term: int) -> tuple[np.ndarray[Any, Any], Any]:
        """(rows, weights) of a term, live rows only, rows ascending."""
        if kind == "uni":
            rows, weights = self.uni.run(term)
        else:
            a, b = (
                (self.start[term], self.start[term + 1]) if term + 1 < len(self.start) else (0, 0)
            )
            rows, weights = self.rows[a:b], self.weights[a:b]
            if len(self.tail):
                more, extra = self.tail.run(term)
                if len(more):
                    rows, weights = np.concatenate([rows, more]), np.concatenate([weights, extra])
        if self.dead:
            keep = self.live[rows]
            rows, weights = rows[keep], weights[keep]
        return rows, weights

    @property
    def nbytes(self) -> int:
        arrays = (self.start, self.rows, self.weights, self.fmax, self.dmin, self.ids)
        rows = sum(a.nbytes for a in arrays) + self.lengths.nbytes + self.live.nbytes
        return int(rows + self.row_of.nbytes + self.tail.nbytes + self.uni.nbytes)

    def worn(self) -> bool:
        """Whether the tail or the deleted rows have grown enough to build again."""
        return len(self.tail) > max(TAIL_MIN, TAIL_SHARE * len(self.rows)) or self.dead > max(
            DEAD_MIN, DEAD_SHARE * self.count
        )

    def apply_log(self, conn: apsw.Connection) -> None:
        """Come up to ``conn``'s snapshot: each chunk logged since is dropped, and added again
        as the snapshot holds it, if it does."""
        with snapshot(conn):
            changes: list[tuple[int, int]] = [
                (int(seq), int(i))
                for seq, i in conn.execute(
                    "SELECT seq, id FROM fts_log WHERE seq > ? ORDER BY seq", (self.seq,)
                )
            ]
            if not changes:
                return
            ids = sorted({i for _, i in changes})
            rows = [
                (int(r[0]), str(r[1]), str(r[2]))
                for r in select_in(
                    conn, "SELECT id, path, text FROM chunks WHERE id IN ({ids})", ids
                )
            ]
        for chunk_id in ids:
            self.drop(chunk_id)
        rows.sort()
        if rows:
            counts = self.counter.count(tokenizer(conn), [(p, t) for _, p, t in rows])
            self.counter.forget_words()
            self.add([i for i, _, _ in rows], counts)
        self.seq = changes[-1][0]

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """A fresh build's arrays (no rows added or dropped since), for another process."""
        n = self.count
        return {
            "start": self.start,
            "rows": self.rows,
            "weights": self.weights,
            "fmax": self.fmax,
            "dmin": self.dmin,
            "ids": self.ids[:n],
            "lengths": self.lengths[:n],
            "uni_keys": self.uni.keys,
            "uni_weights": self.uni.weights,
        }

    @classmethod
    def from_arrays(
        cls, vocab: list[str], seq: int, arrays: dict[str, np.ndarray[Any, Any]]
    ) -> Postings:
        """The build another process made (:meth:`arrays`)."""
        state = cls({term: i for i, term in enumerate(vocab)}, seq)
        state.start, state.rows, state.weights = arrays["start"], arrays["rows"], arrays["weights"]
        state.fmax, state.dmin = arrays["fmax"].copy(), arrays["dmin"].copy()
        state.uni = _Sorted(arrays["uni_keys"], arrays["uni_weights"])
        n = len(arrays["ids"])
        state.grow(n)
        state.ids[:n], state.lengths[:n] = arrays["ids"], arrays["lengths"]
        state.count = state.alive = n
        state.live[:n] = True
        state.map_rows(state.ids[:n], np.arange(n, dtype=_I32))
        state.total = float(state.lengths[:n].sum())
        return state

    @classmethod
    def build(cls, conn: apsw.Connection, stop: threading.Event) -> Postings:
        """Count every chunk's terms in one snapshot and lay them out term by term; each term's
        row count must equal FTS5's own (fts5vocab), or Mismatch."""
        with snapshot(conn):
            row = conn.execute("SELECT max(seq) FROM fts_log").fetchone()
            seq = max(int(row[0]) if row and row[0] is not None else 0, trimmed(conn))
            vocab_rows = [
                (str(term), int(doc))
                for term, doc in conn.execute("SELECT term, doc FROM chunks_fts_vocab")
            ]
            vocab = {term: i for i, (term, _) in enumerate(vocab_rows)}
            docs = np.fromiter((d for _, d in vocab_rows), dtype=_I64, count=len(vocab_rows))
            state = cls(vocab, seq)
            start = np.concatenate([[0], np.cumsum(docs)]).astype(_I64)
            rows = np.zeros(int(start[-1]), dtype=_I32)
            weights: np.ndarray[Any, Any] = np.zeros(int(start[-1]), dtype=np.uint16)
            fill = start[:-1].copy()
            uni: list[tuple[Any, Any, Any]] = []
            tok = tokenizer(conn)
            cursor = conn.execute("SELECT id, path, text FROM chunks ORDER BY id")
            while batch := list(itertools.islice(cursor, BATCH)):
                if stop.is_set():
                    raise Stopped
                counts = state.counter.count(tok, [(str(r[1]), str(r[2])) for r in batch])
                first = state.count
                ids = [int(r[0]) for r in batch]
                state.grow(first + len(ids))
                state.ids[first : first + len(ids)] = ids
                state.lengths[first : first + len(ids)] = counts.lengths
                state.count += len(ids)
                terms = counts.terms
                if len(terms) and int(terms.max()) >= len(docs):
                    raise Mismatch(f"a term FTS5 does not hold: {_name(vocab, int(terms.max()))!r}")
                heads = np.flatnonzero(np.diff(terms, prepend=-1))
                sizes = np.diff(np.append(heads, len(terms)))
                slot = fill[terms] + (np.arange(len(terms)) - np.repeat(heads, sizes))
                over = slot >= start[terms + 1]
                if over.any():
                    term = int(terms[np.flatnonzero(over)[0]])
                    raise Mismatch(f"more rows hold {_name(vocab, term)!r} than FTS5 counts")
                if (
                    weights.dtype == np.uint16
                    and len(counts.weights)
                    and counts.weights.max() > 65535
                ):
                    weights = weights.astype(np.uint32)
                rows[slot] = counts.rows + first
                weights[slot] = counts.weights
                fill[terms[heads]] += sizes
                state.bound(terms, counts.weights, counts.lengths[counts.rows])
                uni.append((counts.uni_terms, counts.uni_rows + first, counts.uni_weights))
        short = np.flatnonzero(fill != start[1:])
        if len(short):
            raise Mismatch(f"fewer rows hold {_name(vocab, int(short[0]))!r} than FTS5 counts")
        state.counter.forget_words()
        state.start, state.rows, state.weights = start, rows, weights
        n = state.count
        state.live[:n] = True
        state.map_rows(state.ids[:n], np.arange(n, dtype=_I32))
        state.alive = n
        state.total = float(state.lengths[:n].sum())
        if uni:
            state.uni = _Sorted().merged(
                np.concatenate([u[0] for u in uni]),
                np.concatenate([u[1] for u in uni]).astype(_I32),
                np.concatenate([u[2] for u in uni]).astype(np.uint32),
            )
        return state


def trimmed(conn: apsw.Connection) -> int:
    """The last fts_log row a trim deleted (0: none)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (LOG_TRIMMED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def _name(vocab: dict[str, int], term: int) -> str:
    return next((t for t, i in vocab.items() if i == term), f"#{term}")
