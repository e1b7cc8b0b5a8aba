"""StoreAudit: what an index holds, counted and checked: the counts status shows, the logical
dump crash tests compare, and the integrity checks doctor and the tests run.

A mixin of Store (memd/index/store.py): these only read (the FTS5 check aside, written as an
INSERT), and none of them is on the path of a write or a search.
"""

from __future__ import annotations

import apsw

from memd.index.db import atomic
from memd.index.vector_table import VectorTable

__all__ = ["DumpRow", "StoreAudit"]


# One chunk of Store.dump: (path, start, end, chunk hash, FTS row?, vector row?, model,
# line vectors).
DumpRow = tuple[str, int, int, str, bool, bool, str, int]


class StoreAudit(VectorTable):
    """Counts and checks over a Store's connection."""

    def counts(self, *, vectors: bool = True) -> dict[str, int]:
        """Rows of each kind. ``vectors=False`` leaves out the vector table's count (reported
        as -1): its rows hold the vectors themselves, so counting them reads the whole table
        (22 ms at 10,000 chunks, over 90 ms at 100,000), which the writer's steps need not."""
        one = self.conn.execute(
            # Unembedded chunks are in a partial index; "embedded = 1" would read every row.
            "SELECT (SELECT count(*) FROM files), (SELECT count(*) FROM chunks), "
            "(SELECT count(*) FROM chunks WHERE embedded = 0), "
            "(SELECT count(*) FROM files WHERE pending > 0)"
        ).fetchone()
        assert one is not None
        files, chunks, unembedded, pending = (int(x) for x in one)
        embedded = chunks - unembedded
        table = self._vector_table() if vectors else None
        stored = 0 if vectors else -1
        if table is not None and self.table_exists(table):
            row = self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            stored = int(row[0]) if row else 0
        return {
            "files": files,
            "chunks": chunks,
            "embedded_chunks": embedded,
            "vectors": stored,
            "pending_files": pending,
        }

    def source_counts(self) -> dict[str, dict[str, int]]:
        """Files and chunks per source ("memory", "sessions")."""
        out: dict[str, dict[str, int]] = {}
        for source, files in self.conn.execute(
            "SELECT source, count(*) FROM files GROUP BY source"
        ):
            out[str(source)] = {"files": int(files), "chunks": 0}
        for source, chunks in self.conn.execute(
            "SELECT source, count(*) FROM chunks GROUP BY source"
        ):
            out.setdefault(str(source), {"files": 0, "chunks": 0})["chunks"] = int(chunks)
        return out

    def table_exists(self, name: str) -> bool:
        row = self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        return row is not None

    def vector_ids(self) -> set[int]:
        table = self._vector_table()
        if table is None or not self.table_exists(table):
            return set()
        key = "rowid" if table == "chunks_vec" else "id"
        return {int(r[0]) for r in self.conn.execute(f"SELECT {key} FROM {table}")}

    def fts_ids(self) -> set[int]:
        return {int(r[0]) for r in self.conn.execute("SELECT rowid FROM chunks_fts")}

    def line_counts(self) -> dict[int, int]:
        """How many line vectors each chunk that has any holds."""
        rows = self.conn.execute("SELECT id, length(vectors) FROM chunk_lines")
        return {int(r[0]): int(r[1]) // (2 * self.dims) for r in rows}

    def dump(self) -> list[DumpRow]:
        """The logical content, a DumpRow per chunk."""
        fts = self.fts_ids()
        vecs = self.vector_ids()
        lines = self.line_counts()
        rows = self.conn.execute(
            "SELECT id, path, start_line, end_line, hash, model FROM chunks "
            "ORDER BY path, start_line, end_line, hash"
        )
        return [
            (
                str(r[1]),
                int(r[2]),
                int(r[3]),
                str(r[4]),
                int(r[0]) in fts,
                int(r[0]) in vecs,
                str(r[5]),
                lines.get(int(r[0]), 0),
            )
            for r in rows
        ]

    def integrity(self) -> list[str]:
        """Problems found by SQLite's and FTS5's own checks plus row agreement; [] when sound.

        FTS5's check is written as an INSERT, so this needs the writer's store.
        """
        problems = [str(r[0]) for r in self.conn.execute("PRAGMA quick_check") if r[0] != "ok"]
        try:
            with atomic(self.conn):
                self.conn.execute("INSERT INTO chunks_fts (chunks_fts) VALUES ('integrity-check')")
        except apsw.Error as exc:
            problems.append(f"fts: {exc}")
        ids = {int(r[0]) for r in self.conn.execute("SELECT id FROM chunks")}
        embedded = {
            int(r[0]) for r in self.conn.execute("SELECT id FROM chunks WHERE embedded = 1")
        }
        if self.fts_ids() != ids:
            problems.append("fts rows differ from chunk rows")
        if self._vector_table() is not None and self.vector_ids() != embedded:
            problems.append("vector rows differ from embedded chunk rows")
        if not set(self.line_counts()) <= embedded:
            problems.append("line vectors of chunks that are not embedded")
        return problems
