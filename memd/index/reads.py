"""The reads a search makes: FTS5 candidates, nearest vectors, term frequencies, chunk rows."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import apsw
import numpy as np

from memd.embed.base import Vectors
from memd.index.bm25 import top_ranked
from memd.index.db import select_in
from memd.index.keywords import KeywordRanker
from memd.index.sketch import RESCORED, Sketch, first_pass, stacked
from memd.index.termcount import tokenizer

__all__ = ["ChunkRow", "SearchReads"]

VectorStore = Literal["vec0", "plain", "none"]


@dataclass(frozen=True)
class ChunkRow:
    id: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    score: float  # bm25 rank for keyword hits (lower is better), cosine similarity for vectors
    words: int  # distinct tokens in text (memd.text.mmr_tokens), the boost's density base


@dataclass
class _FreqMemo:
    version: tuple[int, int]
    docs: dict[str, int]
    total: int | None = None
    embedded: int | None = None
    sources: frozenset[str] | None = None


_memos: weakref.WeakKeyDictionary[apsw.Connection, _FreqMemo] = weakref.WeakKeyDictionary()
_memos_lock = threading.Lock()


def _freq_memo(conn: apsw.Connection) -> _FreqMemo:
    """The document-frequency memo of ``conn``, emptied when the database has changed since.

    ``data_version`` moves when another connection commits, ``total_changes`` when this one
    writes; a connection is used by one thread at a time, so its memo needs no lock of its own.
    """
    row = conn.execute("PRAGMA data_version").fetchone()
    version = (int(row[0]) if row else 0, conn.total_changes())
    with _memos_lock:
        memo = _memos.get(conn)
        if memo is None or memo.version != version:
            memo = _memos[conn] = _FreqMemo(version, {})
    return memo


class SearchReads:
    """Read-only SQL for search over one connection; every Store holds one as ``reads``."""

    def __init__(
        self,
        conn: apsw.Connection,
        vector_store: VectorStore,
        dims: int,
        sketch: Sketch | None = None,
        keywords: KeywordRanker | None = None,
    ) -> None:
        self.conn = conn
        self.vector_store = vector_store
        self.dims = dims
        self.sketch = sketch  # the plain store's vectors in memory (memd/index/sketch.py)
        self.keywords = keywords  # the FTS index's terms in memory (memd/index/keywords.py)

    def doc_freqs(self, terms: list[str]) -> tuple[dict[str, int], int]:
        """How many chunks hold each term (after the index's own stemming), and the chunk count.

        The keyword postings count them in memory. Without them, fts5vocab counts a term by
        walking its whole doclist (0.3 ms for a term in half of 10,000 chunks, 1 to 10 ms at
        100,000), so its counts are kept per connection until the index changes.
        """
        if self.keywords is not None and self.keywords.ready:
            counted = self.keywords.doc_freqs(self.conn, terms)
            if counted is not None:
                return counted
        memo = _freq_memo(self.conn)
        tok = tokenizer(self.conn)
        stems: dict[str, str] = {}
        for term in terms:
            tokens: list[Any] = list(tok(term.encode("utf-8"), apsw.FTS5_TOKENIZE_QUERY, None))
            if tokens:
                stems[term] = str(tokens[0][2])
        missing = list({stem for stem in stems.values() if stem not in memo.docs})
        if missing:
            rows = self.conn.execute(
                "SELECT term, doc FROM chunks_fts_vocab "
                f"WHERE term IN ({','.join('?' * len(missing))})",
                missing,
            )
            memo.docs.update(dict.fromkeys(missing, 0))
            memo.docs.update((str(r[0]), int(r[1])) for r in rows)
        if memo.total is None:
            row = self.conn.execute("SELECT count(*) FROM chunks").fetchone()
            memo.total = int(row[0]) if row else 0
        return {term: memo.docs[stem] for term, stem in stems.items()}, memo.total

    def sources_present(self) -> frozenset[str]:
        """The sources the index's chunks come from, found by seeking the source index once
        per distinct value (a few microseconds), kept until the index changes."""
        memo = _freq_memo(self.conn)
        if memo.sources is None:
            found: set[str] = set()
            row = self.conn.execute("SELECT min(source) FROM chunks").fetchone()
            while row and row[0] is not None:
                found.add(str(row[0]))
                row = self.conn.execute(
                    "SELECT min(source) FROM chunks WHERE source > ?", (row[0],)
                ).fetchone()
            memo.sources = frozenset(found)
        return memo.sources

    def _embedded_count(self) -> int:
        """Chunks with a vector. Counted as all chunks less the unembedded ones, which a
        partial index holds: ``WHERE embedded = 1`` read every row (8 ms at 10,000 chunks)."""
        memo = _freq_memo(self.conn)
        if memo.embedded is None:
            row = self.conn.execute(
                "SELECT (SELECT count(*) FROM chunks) - "
                "(SELECT count(*) FROM chunks WHERE embedded = 0)"
            ).fetchone()
            memo.embedded = int(row[0]) if row else 0
        return memo.embedded

    def keyword_candidates(
        self, match: str, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        """Run an FTS5 MATCH expression (phrases OR-ed); rows come best first with their bm25
        rank. The keyword postings rank them in memory (memd/index/keywords.py); without them
        FTS5 does, without ranking every match where a bound allows it (memd/index/bm25.py).
        Only the best rows are read from ``chunks``."""
        if sources and self.sources_present() <= set(sources):
            sources = None  # the filter would keep every row: rank only as many as wanted
        inner = limit if not sources else limit * 4
        ranked = None
        if self.keywords is not None and self.keywords.ready:
            ranked = self.keywords.top(self.conn, match, inner)
        found = self.chunks_by_id(dict(ranked)) if ranked is not None else []
        if ranked is None or len(found) < len(ranked):
            # not built, a phrase they cannot answer, or a chunk written after this search's
            # snapshot began (the postings follow the newest): FTS5, in this snapshot
            ranked = top_ranked(self.conn, match, inner, self.doc_freqs)
            found = self.chunks_by_id(dict(ranked))
        rank = dict(ranked)
        rows = [r for r in found if not sources or r.source in sources]
        rows.sort(key=lambda r: (rank[r.id], r.id))
        return [dataclasses.replace(r, score=rank[r.id]) for r in rows[:limit]]

    def vector_candidates(
        self, query: Vectors, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        """Nearest chunks by cosine similarity, best first (score = 1 - cosine distance)."""
        if self.vector_store == "vec0":
            return self._knn_vec0(query, sources, limit)
        if self.vector_store == "plain":
            return self._knn_sketch(query, sources, limit)
        return []

    def _knn_vec0(
        self, query: Vectors, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        blob = np.ascontiguousarray(query, dtype=np.float32).tobytes()
        total = self._embedded_count()
        if total == 0:
            return []
        k = min(total, limit, 4096)
        while True:
            sql = (
                "SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, 1.0 - v.distance, "
                "c.words "
                "FROM (SELECT rowid, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ?) v "
                "JOIN chunks c ON c.id = v.rowid"
            )
            params: list[object] = [blob, k]
            if sources:
                sql += f" WHERE c.source IN ({','.join('?' * len(sources))})"
                params.extend(sources)
            sql += " ORDER BY v.distance"
            rows = [ChunkRow(*r) for r in self.conn.execute(sql, params)]
            if len(rows) >= limit or k >= min(total, 4096):
                return rows[:limit]
            k = min(total, k * 8, 4096)

    def _knn_sketch(
        self, query: Vectors, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        """The projected pass picks the best few hundred chunks, the 8-bit residuals the best
        RESCORED of those, their stored vectors decide; when a source filter leaves fewer than
        ``limit``, four times as many, and so on."""
        if self.sketch is None:  # a store not opened through an Index: a sketch of its own
            self.sketch = Sketch(self.dims)
        self.sketch.refresh(self.conn)
        q = np.asarray(query, dtype=np.float32)
        n = max(first_pass(len(self.sketch)), limit * 4)
        m = max(RESCORED, 2 * limit)
        while True:
            found = self.sketch.candidates(q, n)
            groups = narrowed = self.sketch.closest(q, found, m)
            # one stored vector per group decides for its copies
            vectors = self.chunk_vectors([g[0] for g in groups])
            groups = [g for g in groups if g[0] in vectors]
            if not groups:
                return []
            exact = np.stack([vectors[g[0]] for g in groups]) @ q
            ranked = [(groups[j], float(exact[j])) for j in np.argsort(-exact, kind="stable")]
            picked = self._picked(ranked, sources, limit)
            if len(picked) >= limit or len(narrowed) == len(found) < n:
                return picked  # (or every vector was scored exactly)
            m, n = 4 * m, (4 * n if len(narrowed) == len(found) else n)

    def _picked(
        self, ranked: list[tuple[list[int], float]], sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        """The rows of the first ``limit`` chunks of ``ranked`` (groups of copies with their
        score, best first) from ``sources``, read a few at a time: most chunks pass a source
        filter, so reading 2 x limit beats filtering every candidate."""
        picked: list[ChunkRow] = []
        step = 2 * limit if sources else limit
        chunks = ((i, value) for group, value in ranked for i in group)
        while batch := list(itertools.islice(chunks, step)):
            rows = {r.id: r for r in self.chunks_by_id([i for i, _ in batch])}
            for i, value in batch:
                row = rows.get(i)
                if row is not None and (not sources or row.source in sources):
                    picked.append(dataclasses.replace(row, score=value))
                    if len(picked) == limit:
                        return picked
        return picked

    def chunk_vectors(self, ids: Sequence[int]) -> dict[int, Vectors]:
        """The stored vectors of the chunks ``ids`` that have one."""
        if not ids or self.vector_store == "none":
            return {}
        table, key = (
            ("chunks_vec", "rowid") if self.vector_store == "vec0" else ("chunks_vec_plain", "id")
        )
        sql = f"SELECT {key}, embedding FROM {table} WHERE {key} IN ({{ids}})"
        # in key order: neighbouring pages, fewer B-tree descents
        found, vectors = stacked(select_in(self.conn, sql, sorted(ids)), self.dims)
        return dict(zip(found.tolist(), vectors, strict=True))

    def line_vectors(self, ids: Sequence[int]) -> dict[int, np.ndarray[Any, np.dtype[np.float16]]]:
        """The line vectors (n, dims) of the chunks ``ids`` that have them, as stored (float16)."""
        if not ids:
            return {}
        rows = self.conn.execute(
            f"SELECT id, vectors FROM chunk_lines WHERE id IN ({','.join('?' * len(ids))})",
            list(ids),
        )
        return {
            int(r[0]): np.frombuffer(bytes(r[1]), dtype=np.float16).reshape(-1, self.dims)
            for r in rows
        }

    def chunks_by_id(self, ids: Iterable[int]) -> list[ChunkRow]:
        sql = (
            "SELECT id, path, source, start_line, end_line, text, 0.0, words FROM chunks "
            "WHERE id IN ({ids})"
        )
        return [ChunkRow(*r) for r in select_in(self.conn, sql, list(ids))]

    def file_ages(self, paths: Iterable[str]) -> dict[str, tuple[str, str | None, int]]:
        """(kind, day, mtime_ns) of each path, for temporal decay."""
        paths = list(set(paths))
        if not paths:
            return {}
        rows = self.conn.execute(
            f"SELECT path, kind, day, mtime_ns FROM files WHERE path IN ({','.join('?' * len(paths))})",
            paths,
        )
        return {str(r[0]): (str(r[1]), r[2], int(r[3])) for r in rows}
