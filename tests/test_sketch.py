"""The in-memory vector sketch: the same nearest chunks as an exact scan, and in step with the
file through every write, rollback, rebuild and restart (real SQLite files, real Index)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memd.index import sketch as sketch_module
from memd.index.db import atomic
from memd.index.identity import Identity
from memd.index.index import Index
from memd.index.sketch import Sketch, first_pass
from memd.index.store import Store

DIMS = 384


def _vectors(n: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Clustered unit vectors (notes come in topics): 60 centres, each point near one."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(60, DIMS))
    points = centres[rng.integers(0, 60, n)] + rng.normal(scale=0.6, size=(n, DIMS))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def _open(path: Path) -> Index:
    index = Index(path, use_vec=False)
    index.open()
    writer = index.writer()
    identity = Identity("fake", "m", "k", DIMS, "plain", 400, 80, 512, True)
    with atomic(writer.conn):
        writer.set_identity(identity.to_dict())
    with atomic(index.writer().conn):
        index.writer().ensure_vector_table()
    return index


def _add(index: Index, ids: range | list[int], vectors: np.ndarray[Any, Any]) -> None:
    store = index.writer()
    with atomic(store.conn):
        for chunk_id, v in zip(ids, vectors, strict=True):
            store.conn.execute(
                "INSERT INTO chunks (id, path, start_line, end_line, hash, model, text, "
                "embedded, updated_at) VALUES (?, ?, 1, 1, '', 'm', ?, 1, 0)",
                (chunk_id, f"memory/n{chunk_id % 7}.md", f"chunk {chunk_id}"),
            )
            store._insert_vector(chunk_id, v, None)


def _delete(index: Index, ids: list[int]) -> None:
    store = index.writer()
    with atomic(store.conn):
        store._delete_vectors(ids)
        store.conn.executemany("DELETE FROM chunks WHERE id = ?", [(i,) for i in ids])


def _nearest(index: Index, query: np.ndarray[Any, Any], k: int = 10) -> list[int]:
    with index.reader() as store:
        assert store.reads.sketch is not None
        return [r.id for r in store.reads.vector_candidates(query, None, k)]


@pytest.fixture
def index(tmp_path: Path) -> Any:
    idx = _open(tmp_path / "i.sqlite")
    yield idx
    idx.close()


def test_the_sketch_finds_the_exact_top_ten(index: Index) -> None:
    vectors = _vectors(6000)
    _add(index, range(1, 6001), vectors)
    rng = np.random.default_rng(1)  # questions about what was written: near stored chunks
    queries = vectors[rng.integers(0, 6000, 50)] + rng.normal(scale=0.04, size=(50, DIMS))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    hits = 0
    for q in queries:
        exact = vectors @ q
        tenth = np.sort(exact)[-10]
        found = _nearest(index, q)
        assert len(found) == 10
        hits += sum(exact[i - 1] >= tenth - 1e-6 for i in found)
    assert hits / (10 * len(queries)) >= 0.99
    # And its scores are the exact cosines, best first.
    with index.reader() as store:
        rows = store.reads.vector_candidates(queries[0], None, 5)
    assert [round(r.score, 5) for r in rows] == sorted(
        (round(float(vectors[r.id - 1] @ queries[0]), 5) for r in rows), reverse=True
    )


def test_the_sketch_follows_writes_rollbacks_and_deletes(index: Index) -> None:
    vectors = _vectors(3000)
    _add(index, range(1, 3001), vectors)
    probe = _vectors(1, seed=7)[0]
    assert 9001 not in _nearest(index, probe)  # loads the sketch
    _add(index, [9001], probe[None, :])
    assert _nearest(index, probe)[0] == 9001  # a new vector is found at once
    store = index.writer()
    with pytest.raises(RuntimeError), atomic(store.conn):  # a write rolled back: never seen
        store._insert_vector(9002, probe, None)
        raise RuntimeError("abandoned")
    _delete(index, [9001])
    assert 9001 not in _nearest(index, probe) and 9002 not in _nearest(index, probe)
    _delete(index, list(range(1, 2001)))  # most of it: the sketch compacts
    left = _nearest(index, vectors[2500], k=3)
    assert left[0] == 2501 and all(i > 2000 for i in left)
    with index.reader() as reader:
        assert reader.reads.sketch is not None and len(reader.reads.sketch) == 1000


def test_the_log_is_trimmed_and_a_new_sketch_starts_from_the_file(
    index: Index, tmp_path: Path
) -> None:
    vectors = _vectors(500)
    _add(index, range(1, 501), vectors)
    index.tend_sketch()  # what the writer does after a sync: load, then trim
    with index.reader() as store:
        assert store.conn.execute("SELECT count(*) FROM vector_log").fetchone()[0] == 0
    _add(index, [777], vectors[:1] * -1)
    assert _nearest(index, -vectors[0], k=1) == [777]
    index.close()
    again = Index(tmp_path / "i.sqlite", use_vec=False)  # a restart: loaded from the file
    again.open()
    try:
        assert _nearest(again, -vectors[0], k=1) == [777]
        assert _nearest(again, vectors[41], k=1) == [42]
    finally:
        again.close()
    index.open()  # the fixture closes it


def test_a_rebuilt_file_gets_a_new_sketch(index: Index, tmp_path: Path) -> None:
    vectors = _vectors(300)
    _add(index, range(1, 301), vectors)
    assert _nearest(index, vectors[9], k=1) == [10]
    temp = index.temp_path()
    conn = index.open_temp(temp)
    fresh = Store(conn, "plain", DIMS)
    with atomic(conn):
        fresh.set_identity(Identity("fake", "m", "k", DIMS, "plain", 400, 80, 512, True).to_dict())
        fresh.ensure_vector_table()
        conn.execute(
            "INSERT INTO chunks (id, path, start_line, end_line, hash, model, text, embedded, "
            "updated_at) VALUES (5000, 'memory/x.md', 1, 1, '', 'm', 'x', 1, 0)"
        )
        fresh._insert_vector(5000, vectors[9], None)
    conn.close()
    index.swap_in(temp)
    assert _nearest(index, vectors[9], k=3) == [5000]


def test_first_pass_is_one_percent_within_bounds() -> None:
    assert first_pass(1_000) == 400 and first_pass(60_000) == 600 and first_pass(10**6) == 1000


def test_an_empty_sketch_finds_nothing(index: Index) -> None:
    assert _nearest(index, _vectors(1)[0]) == []
    sketch = Sketch(DIMS)
    assert sketch.candidates(_vectors(1)[0], 10) == []


def test_a_source_filter_keeps_the_best_chunks_of_that_source(index: Index) -> None:
    # Transcript chunks crowd the query's neighbourhood: the memory chunks behind them must
    # still come back, best first, even when the first candidates read are all transcripts.
    vectors = _vectors(3000, seed=3)
    _add(index, range(1, 3001), vectors)
    q = vectors[0]
    exact = vectors @ q
    nearest = [int(i) + 1 for i in np.argsort(-exact)]
    sessions = nearest[:40]  # the 40 nearest chunks become transcript chunks
    with atomic(index.writer().conn):
        index.writer().conn.executemany(
            "UPDATE chunks SET source = 'sessions' WHERE id = ?", [(i,) for i in sessions]
        )
    with index.reader() as store:
        rows = store.reads.vector_candidates(q, ("memory",), 6)
        both = store.reads.vector_candidates(q, ("memory", "sessions"), 6)
    assert [r.id for r in rows] == [i for i in nearest if i not in sessions][:6]
    assert {r.source for r in rows} == {"memory"}
    assert [r.id for r in both] == nearest[:6]


@pytest.mark.parametrize("size", [390, 3000])
def test_a_rare_source_is_found_past_the_chunks_scored_exactly(index: Index, size: int) -> None:
    """Five memory chunks among transcript chunks, none of them near the query: the exact
    scoring widens past its first RESCORED (and, with all of those from other sources, past
    the first pass) until the best three memory chunks are found, by exact score."""
    vectors = _vectors(size, seed=4)
    _add(index, range(1, size + 1), vectors)
    q = vectors[0]
    exact = vectors @ q
    far = [int(i) + 1 for i in np.argsort(exact)[:5]]  # the five farthest from the query
    with atomic(index.writer().conn):
        index.writer().conn.execute("UPDATE chunks SET source = 'sessions'")
        index.writer().conn.executemany(
            "UPDATE chunks SET source = 'memory' WHERE id = ?", [(i,) for i in far]
        )
    with index.reader() as store:
        assert store.reads.sketch is not None
        store.reads.sketch.refresh(store.conn)
        assert store.reads.sketch.basis_from >= DIMS  # the 8-bit ranking is in use
        rows = store.reads.vector_candidates(q, ("memory",), 3)
    assert [r.id for r in rows] == sorted(far, key=lambda i: -exact[i - 1])[:3]


def test_the_residuals_rank_as_the_exact_cosines(index: Index) -> None:
    """Projection plus 8-bit residual orders candidates within about a thousandth of
    their exact cosines: the best RESCORED of them by it hold the exact best ten."""
    vectors = _vectors(4000, seed=6)
    _add(index, range(1, 4001), vectors)
    rng = np.random.default_rng(3)
    with index.reader() as store:
        sketch = store.reads.sketch
        assert sketch is not None
        sketch.refresh(store.conn)
        for i in rng.integers(0, 4000, 20):
            q = vectors[i] + rng.normal(scale=0.05, size=DIMS).astype(np.float32)
            q = (q / np.linalg.norm(q)).astype(np.float32)
            groups = sketch.candidates(q, 1000)
            shuffled = [groups[j] for j in rng.permutation(len(groups))]  # not by projection
            best = {g[0] for g in sketch.closest(q, shuffled, sketch_module.RESCORED)}
            exact = vectors @ q
            assert {int(j) + 1 for j in np.argsort(-exact)[:10]} <= best
            rows = sketch.row_of[[g[0] for g in groups]]
            near = sketch.rows[rows] @ (q @ sketch.basis) + sketch.resid[rows].astype(
                np.float32
            ) @ ((q @ sketch.rest) * sketch.scale)
            centred = exact[[g[0] - 1 for g in groups]] - float(sketch.mean @ q)
            assert np.abs(near - centred).max() < 0.01


def test_copies_of_one_vector_do_not_crowd_out_the_others(index: Index) -> None:
    # 100 texts written 100 times each (the same vector 100 times): the first pass must
    # still reach many distinct vectors, each group holding its copies, so the exact top
    # ten distinct vectors are all among the candidates.
    distinct = _vectors(100, seed=5)
    copies = np.repeat(distinct, 100, axis=0)  # ids 1..100 are copies of vector 0, ...
    _add(index, range(1, 10_001), copies)
    q = distinct[7] + np.random.default_rng(2).normal(scale=0.3, size=DIMS).astype(np.float32)
    q = (q / np.linalg.norm(q)).astype(np.float32)
    with index.reader() as store:
        sketch = store.reads.sketch
        assert sketch is not None
        sketch.refresh(store.conn)
        groups = sketch.candidates(q, first_pass(len(sketch)))
        assert len(groups) >= 50  # a flat top 400 would hold four vectors' copies
        for group in groups:
            assert len(group) == 100 and len({(i - 1) // 100 for i in group}) == 1
        found = {(g[0] - 1) // 100 for g in groups}
        assert set(np.argsort(-(distinct @ q))[:10].tolist()) <= found
        rows = store.reads.vector_candidates(q, None, 24)
    best = int(np.argmax(distinct @ q))
    assert {(r.id - 1) // 100 for r in rows} == {best}
    assert rows[0].score == pytest.approx(float(distinct[best] @ q), abs=1e-5)


def test_an_index_of_copies_is_searched_by_its_distinct_vectors(index: Index) -> None:
    """An index that is mostly copies keeps one row per distinct vector: the groups it gives
    are the flat pass's, in its order, and they follow deletes (a whole group, a group's
    first copy) and new copies at once."""
    distinct = _vectors(60, seed=11)
    _add(index, range(1, 3001), np.repeat(distinct, 50, axis=0))  # ids 1..50: vector 0, ...
    q = distinct[4] + np.random.default_rng(3).normal(scale=0.4, size=DIMS).astype(np.float32)
    q = (q / np.linalg.norm(q)).astype(np.float32)

    def of(group: list[int]) -> int:
        return (group[0] - 1) // 50

    with index.reader() as store:
        sketch = store.reads.sketch
        assert sketch is not None
        sketch.refresh(store.conn)
        flat = sketch.candidates(q, 40)  # the flat pass, which meets the copies and widens
        grouped = sketch.candidates(q, 40)  # by the distinct vectors from now
        assert sketch._copies is not None and len(sketch._copies.groups) == 60
    # the flat pass's vectors in its order, then more: it stopped widening at 16 x 40 rows,
    # 13 vectors' copies; and every copy in its group (the flat pass holds only the copies
    # among the rows it picked)
    assert len(flat) < 40 == len(grouped)
    assert [of(g) for g in grouped][: len(flat)] == [of(g) for g in flat]
    assert all(g == list(range(50 * of(g) + 1, 50 * of(g) + 51)) for g in grouped)
    projected = (distinct - sketch.mean) @ sketch.basis @ (q @ sketch.basis)
    assert np.all(np.diff(projected[[of(g) for g in grouped]]) <= 1e-5)  # best first

    _delete(index, [*range(151, 201), 201])  # all of vector 3, the first copy of vector 4
    _add(index, range(3001, 3004), np.repeat(q[np.newaxis], 3, axis=0))  # the query, 3 times
    with index.reader() as store:
        sketch.refresh(store.conn)
        after = sketch.candidates(q, 40)
    assert after[0] == [3001, 3002, 3003]
    ids = {i for g in after for i in g}
    assert not ids & {*range(151, 202)}
    assert [202 + i for i in range(49)] in after  # vector 4's copies but the first
    assert len(after) == 40 and len(sketch._copies.groups) == 60  # 59 old, 1 new


def test_an_index_of_distinct_vectors_keeps_no_groups(index: Index) -> None:
    vectors = _vectors(3000, seed=12)
    _add(index, range(1, 2001), np.vstack([vectors[:1500], vectors[:500]]))  # a quarter copies
    with index.reader() as store:
        sketch = store.reads.sketch
        assert sketch is not None
        sketch.refresh(store.conn)
        for q in vectors[:5]:
            exact = {int(i) + 1 for i in np.argsort(-(vectors[:1500] @ q))[:10]}
            groups = sketch.candidates(q, 400)
            assert exact <= {g[0] for g in groups[:40]}
        # a quarter of the vectors repeat another: not most of the index, the flat pass goes on
        assert sketch._copies is not None and not sketch._copies.groups


def test_copies_are_grouped_by_their_bytes_not_by_equal_floats(index: Index) -> None:
    """A BLAS product gives equal rows different last bits by where they fall in a kernel's
    tile (AVX2 and AVX-512 differ, ../cpu-notes): copies whose projections differ by an ulp
    are still one group, and two different vectors with equal projections are two."""
    distinct = _vectors(20, seed=9)
    _add(index, range(1, 201), np.repeat(distinct, 10, axis=0))  # ids 1..10: vector 0, ...
    with index.reader() as store:
        sketch = store.reads.sketch
        assert sketch is not None
        sketch.refresh(store.conn)
        live = sketch.rows[: sketch.count]
        # every other copy one ulp off, as a kernel's tile edge would leave it
        live[::2] = np.nextafter(live[::2], np.float32(np.inf))
        groups = sketch.candidates(distinct[3], 20)
    assert len(groups) == 20
    assert sorted(sorted(g) for g in groups) == [
        list(range(1 + 10 * i, 11 + 10 * i)) for i in range(20)
    ]
    assert set(groups[0]) == set(range(31, 41))  # the query is vector 3


def test_a_sketch_loaded_before_the_vectors_finds_them(index: Index) -> None:
    """The daemon's first sync writes keyword rows and loads the sketch before any vector is
    embedded: its principal directions, computed from no vectors, must not stay zero."""
    assert _nearest(index, _vectors(1, seed=3)[0]) == []  # loaded on an empty table
    vectors = _vectors(600)
    _add(index, range(1, 601), vectors)
    rng = np.random.default_rng(2)
    for i in rng.integers(0, 600, 20):
        exact = np.argsort(-(vectors @ vectors[i]))[:10] + 1
        assert _nearest(index, vectors[i]) == exact.tolist()
    with index.reader() as store:
        sketch = store.reads.sketch
        assert sketch is not None and sketch.basis_from >= 300  # directions from the vectors


def test_a_sketch_loaded_at_the_trim_point_writes_nothing(index: Index, tmp_path: Path) -> None:
    """Each start loads the sketch where the last trim left the log: trimming again there
    wrote the file (and its WAL) for nothing at every start."""
    _add(index, range(1, 101), _vectors(100))
    index.tend_sketch()  # loads, then trims the log
    index.close()
    again = Index(tmp_path / "i.sqlite", use_vec=False)
    again.open()
    try:
        writer = again.writer().conn
        before = writer.total_changes()
        again.tend_sketch()
        assert writer.total_changes() == before
        assert _nearest(again, _vectors(100)[5], k=1) == [6]
    finally:
        again.close()
    index.open()  # the fixture closes it
