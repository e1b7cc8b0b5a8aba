"""Vector search that does not scan the file: a small copy of every vector, held in memory.

Each vector is kept as its projection on the index's top principal directions (96 float32
numbers instead of 384: 38 MB for 100,000 chunks). A query is projected the same way, every
chunk is scored against it with one matrix-vector product (a few milliseconds at 100,000
chunks), and the best 1% (400 to 1,000) are scored exactly with their stored vectors, read
by id from the index's plain vector table. Measured against the exact scan (docs/benchmarks.md):
recall of the top ten ≥ 0.99. Copies of one vector (a text written again and again) count
once in that 1%: otherwise 250 copies of four texts filled it, and the best text was not
among them for one question in five; an index that is mostly copies is scored by its distinct
vectors (memd/index/copies.py).

Reading a stored vector costs about 6 µs, and the 1% is most of a search's vector time. So
each vector's other coordinates (on the remaining principal directions, 288 of 384) are kept
too, as 8-bit integers (a scale per direction): the 1% is ranked again by projection plus
residual, within about a thousandth of the true cosine, and only the best RESCORED (96) are
read and scored exactly (:meth:`Sketch.closest`). 29 MB more at 100,000 chunks.

The copy follows the file through ``vector_log``: every vector written or deleted adds a row in
the same transaction (memd/index/vector_table.py), and before a search the sketch applies the rows
past the last one it saw, in the snapshot the search reads. A rollback takes its rows with it;
a crash loses nothing the file kept; a rebuilt file (a new Index epoch) starts a new sketch. The
projection is computed when the sketch is first loaded and kept while it lives: vectors
added later are projected on the same directions.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import apsw
import numpy as np

from memd.heap import release_memory
from memd.index.copies import Copies, by_print, fingerprints, grouped
from memd.index.db import atomic, select_in

__all__ = ["PROJECTED_DIMS", "RESCORED", "Sketch", "first_pass", "stacked"]

logger = logging.getLogger(__name__)

PROJECTED_DIMS = 96
# Chunks scored exactly after the projected pass: 1% of the index, from 400 to 1,000. Reading
# a vector by id costs about 6 µs, so 1,000 is 6 ms; at 100,000 near-duplicate-rich chunks 400
# missed a whole cluster for one query in 200 (bench/vector_bench.py).
FIRST_PASS_MIN, FIRST_PASS_MAX = 400, 1000
# How far the first pass widens to find its distinct vectors among copies: 16 x n rows at most
# (a corpus of 250 copies of every text still yields n / 16 distinct candidates, not 4), in
# an index not mostly copies (one that is scores its distinct vectors, memd/index/copies.py).
WIDEN_MAX = 16
# Candidates read and scored exactly after the 8-bit ranking: at 100,000 noisy near-duplicate
# vectors 24 lost part of the top ten for one question in four, 96 for one in 300 (one of ten).
RESCORED = 96


def first_pass(live: int) -> int:
    return min(FIRST_PASS_MAX, max(FIRST_PASS_MIN, live // 100))


TRIMMED_KEY = "vector_log_trimmed"  # meta: the last vector-log row a trim deleted
SAMPLE = 8192  # vectors the principal directions are computed from
BY_ID = "SELECT id, embedding FROM chunks_vec_plain WHERE id IN ({ids})"
RELEASE_AFTER = 10_000  # a load of this many vectors or more hands the freed heap back
_F32 = np.float32


class Sketch:
    """The projected vectors of one index file (a plain vector table, ``chunks_vec_plain``)."""

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self.width = min(PROJECTED_DIMS, dims)
        self._lock = threading.Lock()
        self._loaded = False
        self.seq = 0  # the last vector_log row applied
        self.trimmed = 0  # the last vector_log row deleted
        self.mean = np.zeros(dims, dtype=_F32)
        self.basis = np.zeros((dims, self.width), dtype=_F32)
        self.rows = np.zeros((0, self.width), dtype=_F32)
        # the other principal directions, each row's coordinates on them as int8 times scale
        self.rest = np.zeros((dims, dims - self.width), dtype=_F32)
        self.scale = np.ones(dims - self.width, dtype=_F32)
        self.resid = np.zeros((0, dims - self.width), dtype=np.int8)
        # a hash of each stored vector's bytes, equal for its copies (memd/index/copies.py)
        self.prints = np.zeros(0, dtype=np.uint64)
        self.ids = np.zeros(0, dtype=np.int64)
        self.live = np.zeros(0, dtype=bool)
        self.count = 0  # rows in use (live or dead)
        # chunk id -> row (-1: none), a dense array: chunk ids are small and mostly used; a
        # dict of 100,000 Python ints cost 15 MB, this 0.4 MB
        self.row_of = np.full(0, -1, dtype=np.int32)
        self.alive = 0
        self.basis_from = 0  # vectors the principal directions were computed from
        self.loaded_with = 0  # vectors at the last load
        self._widened = 1.0  # how far the last first pass widened, as a multiple of its n
        self._version = 0  # moves with every change to the rows
        self._copies: Copies | None = None

    # -- keeping up with the file --------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._loaded

    def refresh(self, conn: apsw.Connection) -> None:
        """Load the vectors (first use, or the log was trimmed past this sketch), or apply
        the writes logged since the last refresh."""
        with self._lock:
            if self._loaded and _trimmed(conn) > self.seq:
                logger.info("vector log trimmed past this sketch (row %d): loading again", self.seq)
                self._loaded = False
            if not self._loaded:
                self._load(conn)
                return
            changes = list(
                conn.execute(
                    "SELECT seq, id, added FROM vector_log WHERE seq > ? ORDER BY seq", (self.seq,)
                )
            )
            if not changes:
                return
            added = [int(i) for _s, i, a in changes if a]
            ids, vectors = stacked(select_in(conn, BY_ID, added), self.dims)
            found = dict(zip(ids.tolist(), vectors, strict=True))
            for seq, chunk_id, was_added in changes:
                self._drop(int(chunk_id))
                vector = found.get(int(chunk_id)) if was_added else None
                if vector is not None:
                    self._add(int(chunk_id), vector)
                self.seq = int(seq)
            if self.basis_from < SAMPLE and self.alive > 2 * self.loaded_with + 1:
                # Directions computed from few vectors (none, when the sketch was loaded before
                # the first embedding) project most new ones on next to nothing: compute them
                # again from the file each time the vectors have doubled, a load each time.
                self._load(conn)
                return
            if self.count - self.alive > max(1024, self.count // 4):
                self._compact()

    def _load(self, conn: apsw.Connection) -> None:
        """Read the vectors twice in one snapshot: a sample for the principal directions, then
        all of them a batch at a time, projected as they come. The whole float matrix (150 MB
        at 100,000 chunks) is never held, so the daemon does not keep its high-water mark."""
        conn.execute("BEGIN")
        try:
            row = conn.execute("SELECT max(seq) FROM vector_log").fetchone()
            # the log may be empty, trimmed: the vectors read now are those of the trim point
            trimmed = _trimmed(conn)
            seq = max(int(row[0]) if row and row[0] is not None else 0, trimmed)
            row = conn.execute("SELECT count(*) FROM chunks_vec_plain").fetchone()
            total = int(row[0]) if row else 0
            step = max(1, total // SAMPLE)
            sample = stacked(
                conn.execute(
                    "SELECT id, embedding FROM chunks_vec_plain WHERE id % ? = 0", (step,)
                ),
                self.dims,
            )[1]
            if len(sample) < 2:  # ids not spread out: take the first rows instead
                sample = stacked(
                    conn.execute("SELECT id, embedding FROM chunks_vec_plain LIMIT ?", (SAMPLE,)),
                    self.dims,
                )[1]
            if len(sample):
                self.mean, directions = _principal(sample, self.dims)
                self.basis = np.ascontiguousarray(directions[:, : self.width])
                self.rest = np.ascontiguousarray(directions[:, self.width :])
                self.scale = _scales((sample - self.mean) @ self.rest)
            self.basis_from = len(sample)
            rows = np.zeros((total, self.width), dtype=_F32)
            resid = np.zeros((total, self.dims - self.width), dtype=np.int8)
            prints = np.zeros(total, dtype=np.uint64)
            ids = np.zeros(total, dtype=np.int64)
            count = 0
            cursor = conn.execute("SELECT id, embedding FROM chunks_vec_plain")
            while True:
                batch_ids, batch = stacked(itertools.islice(cursor, 4096), self.dims)
                if not len(batch_ids):
                    break
                end = count + len(batch_ids)
                if end > len(rows):  # written meanwhile by no one (one snapshot), but be safe
                    rows = np.resize(rows, (end, self.width))
                    resid = np.resize(resid, (end, self.dims - self.width))
                    prints = np.resize(prints, end)
                    ids = np.resize(ids, end)
                rows[count:end] = (batch - self.mean) @ self.basis
                resid[count:end] = self._residual(batch)
                prints[count:end] = fingerprints(batch)
                ids[count:end] = batch_ids
                count = end
        finally:
            conn.execute("COMMIT")
        self.rows, self.ids, self.prints = rows[:count], ids[:count], prints[:count]
        self.resid = resid[:count]
        self.live = np.ones(count, dtype=bool)
        self.count = self.loaded_with = count
        self._index_rows()
        self.seq = seq
        self.trimmed = trimmed  # a trim to where it stands would write for nothing
        self._loaded = True
        self._version += 1
        if count >= RELEASE_AFTER:  # the batches and the covariance are garbage: give them back
            release_memory()
        logger.debug("vector sketch: %d vectors, %d dims projected", count, self.width)

    def _add(self, chunk_id: int, vector: np.ndarray[Any, np.dtype[np.float32]]) -> None:
        if self.count == len(self.rows):  # grow by half again: amortised O(1) appends
            size = max(1024, len(self.rows) + len(self.rows) // 2)
            self.rows = np.resize(self.rows, (size, self.width))
            self.resid = np.resize(self.resid, (size, self.dims - self.width))
            self.prints = np.resize(self.prints, size)
            self.ids = np.resize(self.ids, size)
            self.live = np.concatenate([self.live[: self.count], np.zeros(size - self.count, bool)])
        self.rows[self.count] = (vector - self.mean) @ self.basis
        self.resid[self.count] = self._residual(vector[np.newaxis])[0]
        self.prints[self.count] = fingerprints(vector[np.newaxis])[0]
        self.ids[self.count] = chunk_id
        self.live[self.count] = True
        self._map(chunk_id, self.count)
        self.alive += 1
        self.count += 1
        self._version += 1

    def _residual(self, vectors: np.ndarray[Any, np.dtype[np.float32]]) -> np.ndarray[Any, Any]:
        """The vectors' coordinates on the other principal directions, as 8-bit integers."""
        coords = ((vectors - self.mean) @ self.rest) / self.scale
        return np.clip(np.rint(coords), -127, 127).astype(np.int8)

    def _drop(self, chunk_id: int) -> None:
        row = int(self.row_of[chunk_id]) if 0 <= chunk_id < len(self.row_of) else -1
        if row >= 0:
            self.row_of[chunk_id] = -1
            self.live[row] = False
            self.alive -= 1
            self._version += 1

    def _map(self, chunk_id: int, row: int) -> None:
        if chunk_id >= len(self.row_of):
            grown = np.full(max(chunk_id + 1, len(self.row_of) * 3 // 2), -1, dtype=np.int32)
            grown[: len(self.row_of)] = self.row_of
            self.row_of = grown
        self.row_of[chunk_id] = row

    def _index_rows(self) -> None:
        """Rebuild the id -> row map from ``ids`` (every row live)."""
        ids = self.ids[: self.count]
        self.row_of = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, dtype=np.int32)
        self.row_of[ids] = np.arange(len(ids), dtype=np.int32)
        self.alive = len(ids)

    def _compact(self) -> None:
        keep = np.flatnonzero(self.live[: self.count])
        self.rows = np.ascontiguousarray(self.rows[keep])
        self.resid = np.ascontiguousarray(self.resid[keep])
        self.prints = self.prints[keep]
        self.ids = self.ids[keep]
        self.live = np.ones(len(keep), dtype=bool)
        self.count = len(keep)
        self._version += 1
        self._index_rows()

    # -- searching -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.alive

    def candidates(self, query: np.ndarray[Any, Any], n: int) -> list[list[int]]:
        """The chunks whose projections score best against ``query``'s, as up to ``n`` groups
        of ids, best first: chunks with the same vector (the same text, written again) form
        one group, found by the vector's bytes, so copies cannot crowd the other candidates
        out of the ``n`` that are scored exactly. An index that is mostly copies is scored by
        its distinct vectors alone (:class:`Copies`, built when a pass has met copies). The
        product runs outside the lock (numpy lets go of the GIL there): rows below ``count``
        are never changed in place, only replaced whole by a compaction."""
        q = np.asarray(query, dtype=_F32) @ self.basis
        with self._lock:
            count = self.count
            rows, ids, prints = self.rows[:count], self.ids[:count], self.prints[:count]
            live = self.live[:count].copy()
            version, copies, alive = self._version, self._copies, self.alive
        if count == 0:
            return []
        if copies is None or not copies.holds(version, alive):
            copies = None
            if self._widened > 1:  # the last pass met copies: are they most of the index?
                copies = Copies.of(version, rows, ids, prints, live)
                with self._lock:
                    self._copies = copies
        if copies is not None and copies.groups:
            return copies.best(q, n)
        scores = rows @ q
        scores[~live] = -np.inf
        # Start as wide as the last search had to go: the share of copies is the index's.
        take = min(n * WIDEN_MAX, max(n, int(n * self._widened)))
        while True:  # widen until the best ``take`` hold n distinct vectors (or enough tries)
            if alive <= take:
                picked = np.flatnonzero(live)
            else:
                picked = np.argpartition(-scores, take)[:take]
            # one group per distinct vector: the picked rows in order of their bytes' hash
            # (copies in row order: the same answer whatever order argpartition left)
            picked.sort()
            order, starts = by_print(prints, picked)
            distinct = len(starts)
            if distinct >= n or alive <= take or take >= n * WIDEN_MAX:
                break
            # as many rows as this share of copies needs for n distinct ones, in one step
            take = min(alive, n * WIDEN_MAX, max(take * 2, take * n // max(1, distinct)))
        self._widened = take / n
        # groups ranked by their best-scoring copy, best first
        best = np.maximum.reduceat(scores[order], starts)
        return grouped(ids, order, starts, np.argsort(-best, kind="stable")[:n].tolist())

    def closest(
        self, query: np.ndarray[Any, Any], groups: list[list[int]], m: int
    ) -> list[list[int]]:
        """The ``m`` of ``groups`` (from :meth:`candidates`) whose first chunk scores best
        against ``query`` by projection and 8-bit residual together, best first; all of them
        when there are no more than ``m``."""
        if len(groups) <= m or self.basis_from < self.dims:
            return groups  # (directions from fewer vectors than dims: residuals not to be trusted)
        q = np.asarray(query, dtype=_F32)
        with self._lock:
            rows, resid, row_of = self.rows, self.resid, self.row_of
        first = np.fromiter((g[0] for g in groups), dtype=np.int64, count=len(groups))
        at = np.full(len(first), -1, dtype=np.int64)  # -1: deleted since (a compaction)
        inside = first < len(row_of)
        at[inside] = row_of[first[inside]]
        near = rows[at] @ (q @ self.basis) + resid[at].astype(_F32) @ ((q @ self.rest) * self.scale)
        near[at < 0] = -np.inf
        best = np.argpartition(-near, m)[:m]
        return [groups[i] for i in best[np.argsort(-near[best], kind="stable")]]

    def trim_log(self, conn: apsw.Connection, upto: int | None = None) -> None:
        """Delete the log rows this sketch has applied, or those up to ``upto`` if fewer (the
        other sketches of the file, in reader processes, have applied no more). The writer
        calls it after a sync, and between embedding batches: nothing to delete costs no
        write. The last row deleted is kept in ``meta``, so a sketch further behind knows."""
        with self._lock:
            upto = self.seq if upto is None else min(upto, self.seq)
            if self._loaded and upto > self.trimmed:
                with atomic(conn):
                    conn.execute("DELETE FROM vector_log WHERE seq <= ?", (upto,))
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (TRIMMED_KEY, str(upto)),
                    )
                self.trimmed = upto


def _trimmed(conn: apsw.Connection) -> int:
    """The last vector-log row deleted by a trim (0: none)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (TRIMMED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def stacked(
    rows: Any, dims: int
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.float32]]]:
    """(ids, vectors) of (id, float32 blob) rows, the blobs joined into one matrix: a
    frombuffer per row costs more than reading it."""
    got = list(rows)
    if not got:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dims), dtype=_F32)
    ids = np.fromiter((int(r[0]) for r in got), dtype=np.int64, count=len(got))
    matrix = np.frombuffer(b"".join(r[1] for r in got), dtype=_F32).reshape(len(got), dims)
    return ids, matrix


def _scales(coords: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A scale per direction that maps a quarter more than the sample's widest coordinate on it
    to 127 (vectors written later may reach a little further)."""
    widest = np.abs(coords).max(axis=0) if len(coords) else np.zeros(coords.shape[1])
    return np.where(widest > 0, 1.25 * widest / 127, 1.0).astype(_F32)


def _principal(
    sample: np.ndarray[Any, np.dtype[np.float32]], width: int
) -> tuple[np.ndarray[Any, np.dtype[np.float32]], np.ndarray[Any, np.dtype[np.float32]]]:
    """The mean of ``sample`` and its ``width`` principal directions (as columns), most
    variance first: the eigenvectors of its covariance, a dims × dims matrix (an SVD of the
    sample itself would need workspace the size of the sample, which the allocator then
    keeps)."""
    mean = sample.mean(axis=0, dtype=np.float64)
    centred = sample.astype(np.float64) - mean
    values, vectors = np.linalg.eigh(centred.T @ centred)  # ascending eigenvalues
    take = min(width, len(values))
    basis = np.zeros((sample.shape[1], width), dtype=_F32)
    basis[:, :take] = vectors[:, ::-1][:, :take]
    return mean.astype(_F32), basis
