"""VectorTable: where a Store keeps chunk vectors: the sqlite-vec ``vec0`` table or the plain
one, and the line vectors beside them.

A mixin of Store (memd/index/store.py): which table holds the vectors depends on the vector
store the index was opened with, and only these methods need to know it; Store's writes call
them to add and remove a chunk's vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import apsw
import numpy as np

from memd.embed.base import Vectors
from memd.index.reads import VectorStore

__all__ = ["VectorTable"]


class VectorTable:
    """The vector table of a Store's connection, for its vector store kind and dims."""

    conn: apsw.Connection
    vector_store: VectorStore
    dims: int

    def ensure_vector_table(self) -> None:
        """Create the vector table for this store's kind and dims (idempotent)."""
        if self.vector_store == "vec0":
            self.conn.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_vec USING vec0("
                f"embedding float[{int(self.dims)}] distance_metric=cosine)"
            )
        elif self.vector_store == "plain":
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS chunks_vec_plain "
                "(id INTEGER PRIMARY KEY, embedding BLOB NOT NULL)"
            )

    def _vector_table(self) -> str | None:
        return {"vec0": "chunks_vec", "plain": "chunks_vec_plain"}.get(self.vector_store)

    def _insert_vector(self, chunk_id: int, vector: Vectors, lines: Vectors | None) -> None:
        blob = np.ascontiguousarray(vector, dtype=np.float32).tobytes()
        if len(blob) != 4 * self.dims:
            raise ValueError(f"vector has {len(blob) // 4} dims, the index has {self.dims}")
        if lines is not None and len(lines):
            if lines.ndim != 2 or lines.shape[1] != self.dims:
                raise ValueError(
                    f"line vectors have shape {lines.shape}, the index has {self.dims}"
                )
            # float16: half the size, and cosines agree with float32 to about 1e-3.
            self.conn.execute(
                "INSERT INTO chunk_lines (id, vectors) VALUES (?, ?)",
                (chunk_id, np.ascontiguousarray(lines, dtype=np.float16).tobytes()),
            )
        table = self._vector_table()
        if table == "chunks_vec":
            self.conn.execute(
                "INSERT INTO chunks_vec (rowid, embedding) VALUES (?, ?)", (chunk_id, blob)
            )
        elif table == "chunks_vec_plain":
            self.conn.execute(
                "INSERT INTO chunks_vec_plain (id, embedding) VALUES (?, ?)", (chunk_id, blob)
            )
            self.conn.execute("INSERT INTO vector_log (id, added) VALUES (?, 1)", (chunk_id,))

    def _delete_vectors(self, ids: Sequence[int]) -> None:
        table = self._vector_table()
        if table is None or not ids:
            return
        key = "rowid" if table == "chunks_vec" else "id"
        self.conn.executemany(f"DELETE FROM {table} WHERE {key} = ?", [(i,) for i in ids])
        self.conn.executemany("DELETE FROM chunk_lines WHERE id = ?", [(i,) for i in ids])
        if table == "chunks_vec_plain":
            self.conn.executemany(
                "INSERT INTO vector_log (id, added) VALUES (?, 0)", [(i,) for i in ids]
            )
