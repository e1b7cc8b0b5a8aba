"""The reads a search makes: FTS5 candidates, nearest vectors, term frequencies, chunk rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import apsw
import numpy as np

from memd.embed.base import Vectors

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


class SearchReads:
    """Read-only SQL for search, mixed into Store (which sets these attributes)."""

    conn: apsw.Connection
    vector_store: VectorStore
    dims: int

    def doc_freqs(self, terms: list[str]) -> tuple[dict[str, int], int]:
        """How many chunks hold each term (after the index's own stemming), and the chunk count."""
        tokenizer = self.conn.fts5_tokenizer("porter", ["unicode61", "remove_diacritics", "2"])
        stems: dict[str, str] = {}
        for term in terms:
            tokens: list[Any] = list(
                tokenizer(term.encode("utf-8"), apsw.FTS5_TOKENIZE_QUERY, None)
            )
            if tokens:
                stems[term] = str(tokens[0][2])
        freqs: dict[str, int] = {}
        if stems:
            unique = list(set(stems.values()))
            rows = self.conn.execute(
                "SELECT term, doc FROM chunks_fts_vocab "
                f"WHERE term IN ({','.join('?' * len(unique))})",
                unique,
            )
            by_stem = {str(r[0]): int(r[1]) for r in rows}
            freqs = {term: by_stem.get(stem, 0) for term, stem in stems.items()}
        row = self.conn.execute("SELECT max(id) FROM chunks").fetchone()
        total = (
            self.conn.execute("SELECT count(*) FROM chunks").fetchone() if row and row[0] else None
        )
        return freqs, int(total[0]) if total else 0

    def keyword_candidates(
        self, match: str, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        """Run an FTS5 MATCH expression; rows come best first with their bm25 rank.

        FTS5 ranks in a subquery and only the best ``limit`` rows are joined to their text:
        joining every match before the sort cost twice as much at 10,000 chunks.
        """
        inner = limit if not sources else limit * 4
        sql = (
            "SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, f.rank FROM "
            "(SELECT rowid, bm25(chunks_fts, 1.0, 1.0, 0.25) AS rank FROM chunks_fts "
            "WHERE chunks_fts MATCH ? ORDER BY rank LIMIT ?) f "
            "JOIN chunks c ON c.id = f.rowid"
        )
        params: list[object] = [match, inner]
        if sources:
            sql += f" WHERE c.source IN ({','.join('?' * len(sources))})"
            params.extend(sources)
        sql += " ORDER BY f.rank LIMIT ?"
        params.append(limit)
        return [ChunkRow(*r) for r in self.conn.execute(sql, params)]

    def vector_candidates(
        self, query: Vectors, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        """Nearest chunks by cosine similarity, best first (score = 1 - cosine distance)."""
        if self.vector_store == "vec0":
            return self._knn_vec0(query, sources, limit)
        if self.vector_store == "plain":
            return self._knn_plain(query, sources, limit)
        return []

    def _knn_vec0(
        self, query: Vectors, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        blob = np.ascontiguousarray(query, dtype=np.float32).tobytes()
        total_row = self.conn.execute("SELECT count(*) FROM chunks WHERE embedded = 1").fetchone()
        total = int(total_row[0]) if total_row else 0
        if total == 0:
            return []
        k = min(total, limit, 4096)
        while True:
            sql = (
                "SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, 1.0 - v.distance "
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

    def _knn_plain(
        self, query: Vectors, sources: Sequence[str] | None, limit: int
    ) -> list[ChunkRow]:
        ids, matrix = self.plain_vectors()
        if not ids:
            return []
        sims = matrix @ np.asarray(query, dtype=np.float32)
        order = np.argsort(-sims)
        picked: list[ChunkRow] = []
        wanted = set(sources) if sources else None
        for start in range(0, len(order), max(limit * 4, 64)):
            batch = [ids[i] for i in order[start : start + max(limit * 4, 64)]]
            by_id = {r.id: r for r in self.chunks_by_id(batch)}
            for i in order[start : start + max(limit * 4, 64)]:
                row = by_id.get(ids[i])
                if row is None or (wanted is not None and row.source not in wanted):
                    continue
                picked.append(
                    ChunkRow(
                        row.id,
                        row.path,
                        row.source,
                        row.start_line,
                        row.end_line,
                        row.text,
                        float(sims[i]),
                    )
                )
                if len(picked) >= limit:
                    return picked
        return picked

    def plain_vectors(self) -> tuple[list[int], Vectors]:
        """Every stored vector of a numpy-scanned index, as (ids, matrix)."""
        ids: list[int] = []
        blobs: list[bytes] = []
        for chunk_id, blob in self.conn.execute("SELECT id, embedding FROM chunks_vec_plain"):
            ids.append(int(chunk_id))
            blobs.append(bytes(blob))
        if not ids:
            return [], np.zeros((0, self.dims), dtype=np.float32)
        matrix = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(ids), self.dims)
        return ids, matrix

    def chunks_by_id(self, ids: Iterable[int]) -> list[ChunkRow]:
        ids = list(ids)
        if not ids:
            return []
        rows = self.conn.execute(
            "SELECT id, path, source, start_line, end_line, text, 0.0 FROM chunks "
            f"WHERE id IN ({','.join('?' * len(ids))})",
            ids,
        )
        return [ChunkRow(*r) for r in rows]

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
