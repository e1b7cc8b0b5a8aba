"""Store: every SQL statement on a workspace index (files, chunks, FTS, vectors, meta).

Every write of a file's rows is here (so a schema change has one place to look); its mixins hold
the meta rows (memd/index/meta.py), the vector table (vector_table.py) and the counts and checks
(audit.py). The reads a search makes are SearchReads (memd/index/reads.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apsw

from memd.embed.base import Vectors
from memd.index.audit import StoreAudit
from memd.index.db import atomic
from memd.index.keywords import KeywordRanker
from memd.index.meta import IndexMeta
from memd.index.reads import ChunkRow, SearchReads, VectorStore
from memd.index.sketch import Sketch
from memd.index.termcount import fts_columns
from memd.text import mmr_tokens

__all__ = ["ChunkKey", "ChunkRow", "FileRow", "NewChunk", "Resume", "Store", "VectorStore"]


@dataclass(frozen=True)
class FileRow:
    path: str
    source: str
    kind: str
    day: str | None
    hash: str
    mtime_ns: int
    size: int
    chunks: int
    pending: int
    error: str | None

    def same_stat(self, size: int, mtime_ns: int) -> bool:
        """Whether the file on disk still has the size and mtime it was indexed with (a file
        whose stat changed is read again; the content hash then decides)."""
        return (self.size, self.mtime_ns) == (size, mtime_ns)


@dataclass(frozen=True)
class NewChunk:
    start_line: int
    end_line: int
    text: str
    hash: str
    vector: Vectors | None
    # The vectors of its vector_lines, (n, dims); None when it has none. A chunk is embedded
    # only with both: ``vector`` is None until every line vector is there too.
    lines: Vectors | None = None


# A chunk as a file's rows name it: (start line, end line, hash of its text).
ChunkKey = tuple[int, int, str]


@dataclass(frozen=True)
class Resume:
    """Where a file that grew at its end is chunked again from: ``line`` starts at byte
    ``offset``, and the index holds the file's first ``length`` bytes (memd/index/tail.py)."""

    line: int
    offset: int
    length: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class Store(IndexMeta, StoreAudit):
    """SQL over one open connection. Writes must run inside :func:`atomic`."""

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
        self.reads = SearchReads(conn, vector_store, dims, sketch, keywords)

    # -- files and chunks -----------------------------------------------------------------------

    def files(self) -> dict[str, FileRow]:
        rows = self.conn.execute(
            "SELECT path, source, kind, day, hash, mtime_ns, size, chunks, pending, error FROM files"
        )
        return {r[0]: FileRow(*r) for r in rows}

    def file(self, path: str) -> FileRow | None:
        row = self.conn.execute(
            "SELECT path, source, kind, day, hash, mtime_ns, size, chunks, pending, error "
            "FROM files WHERE path = ?",
            (path,),
        ).fetchone()
        return None if row is None else FileRow(*row)

    def file_stats(self, paths: Iterable[str]) -> dict[str, tuple[int, int]]:
        """(size, mtime_ns) of each of ``paths`` that has a row, in one statement."""
        rows = self.conn.execute(
            "SELECT path, size, mtime_ns FROM files WHERE path IN (SELECT value FROM json_each(?))",
            (json.dumps(list(paths)),),
        )
        return {str(p): (int(size), int(mtime)) for p, size, mtime in rows}

    def touch_file(self, path: str, mtime_ns: int, size: int) -> None:
        """Record a new mtime/size for a file whose content hash did not change."""
        self.conn.execute(
            "UPDATE files SET mtime_ns = ?, size = ? WHERE path = ?", (mtime_ns, size, path)
        )

    def replace_file(
        self,
        *,
        path: str,
        source: str,
        kind: str,
        day: str | None,
        file_hash: str,
        mtime_ns: int,
        size: int,
        model: str,
        chunks: Sequence[NewChunk],
        resume: Resume | None = None,
    ) -> int:
        """Replace every row of ``path`` (chunks, FTS, vectors, file row); return pending count.

        Chunks that are already there unchanged (same lines, text and model) keep their rows,
        FTS entries and vectors: a file edited in one place rewrites only what changed.
        """
        # A key may be there more than once (a long line cut into equal pieces): each row
        # kept stands for one of the new chunks, as in a fresh index.
        wanted = Counter((c.start_line, c.end_line, c.hash) for c in chunks)
        kept: dict[ChunkKey, list[tuple[int, bool]]] = {}
        stale: list[int] = []
        for chunk_id, start, end, chunk_hash, row_model, row_embedded in self.conn.execute(
            "SELECT id, start_line, end_line, hash, model, embedded FROM chunks WHERE path = ? "
            "ORDER BY id",
            (path,),
        ):
            key = (int(start), int(end), str(chunk_hash))
            rows = kept.setdefault(key, [])
            if row_model == model and len(rows) < wanted[key]:
                rows.append((int(chunk_id), bool(row_embedded)))
            else:
                stale.append(int(chunk_id))
        self._delete_chunks(stale)
        self.conn.execute("DELETE FROM files WHERE path = ?", (path,))
        now = _now_ms()
        pending = 0
        new: list[NewChunk] = []
        for chunk in chunks:
            same = kept.get((chunk.start_line, chunk.end_line, chunk.hash))
            if same:
                chunk_id, embedded = same.pop(0)
                if not embedded and chunk.vector is not None and self.vector_store != "none":
                    self.conn.execute("UPDATE chunks SET embedded = 1 WHERE id = ?", (chunk_id,))
                    self._insert_vector(chunk_id, chunk.vector, chunk.lines)
                elif not embedded and self.vector_store != "none":
                    pending += 1
                continue
            new.append(chunk)
        pending += self._insert_chunks(path, source, model, new, now)
        self._write_file_row(
            path, source, kind, day, file_hash, mtime_ns, size, len(chunks), pending, now, resume
        )
        return pending

    def extend_file(
        self,
        *,
        path: str,
        file_hash: str,
        mtime_ns: int,
        size: int,
        model: str,
        remove: Sequence[ChunkKey],
        add: Sequence[NewChunk],
        resume: Resume,
    ) -> int | None:
        """Replace the rows ``remove`` names with ``add`` in a file that grew at its end; the
        other rows stay as they are. Return the pending count, or None (nothing written) when
        one of ``remove`` is missing or of another model: index it whole then.
        """
        row = self.conn.execute(
            "SELECT source, kind, day, chunks FROM files WHERE path = ?", (path,)
        ).fetchone()
        if row is None:
            return None
        source, kind, day, count = str(row[0]), str(row[1]), row[2], int(row[3])
        first = min((key[0] for key in remove), default=None)
        ids: dict[ChunkKey, list[int]] = {}
        if first is not None:
            for chunk_id, start, end, chunk_hash, row_model in self.conn.execute(
                "SELECT id, start_line, end_line, hash, model FROM chunks "
                "WHERE path = ? AND start_line >= ? ORDER BY id",
                (path, first),
            ):
                if row_model == model:
                    key = (int(start), int(end), str(chunk_hash))
                    ids.setdefault(key, []).append(int(chunk_id))
        stale: list[int] = []
        for key in remove:
            found = ids.get(key)
            if not found:
                return None
            stale.append(found.pop(0))
        self._delete_chunks(stale)
        now = _now_ms()
        self._insert_chunks(path, source, model, add, now)
        left = self.conn.execute(
            "SELECT count(*) FROM chunks WHERE path = ? AND embedded = 0", (path,)
        ).fetchone()
        pending = int(left[0]) if left and self.vector_store != "none" else 0
        count += len(add) - len(stale)
        self.conn.execute("DELETE FROM files WHERE path = ?", (path,))
        self._write_file_row(
            path, source, kind, day, file_hash, mtime_ns, size, count, pending, now, resume
        )
        return pending

    def resume_point(self, path: str) -> Resume | None:
        """Where ``path`` may be chunked again from when it grows (None: index it whole)."""
        row = self.conn.execute(
            "SELECT resume_line, resume_offset, indexed_bytes FROM files WHERE path = ?", (path,)
        ).fetchone()
        if row is None or None in row:
            return None
        return Resume(int(row[0]), int(row[1]), int(row[2]))

    def _write_file_row(
        self,
        path: str,
        source: str,
        kind: str,
        day: str | None,
        file_hash: str,
        mtime_ns: int,
        size: int,
        chunks: int,
        pending: int,
        now: int,
        resume: Resume | None,
    ) -> None:
        r = resume
        self.conn.execute(
            "INSERT INTO files (path, source, kind, day, hash, mtime_ns, size, chunks, pending, "
            "error, indexed_at, resume_line, resume_offset, indexed_bytes) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
            (
                path,
                source,
                kind,
                day,
                file_hash,
                mtime_ns,
                size,
                chunks,
                pending,
                now,
                r.line if r else None,
                r.offset if r else None,
                r.length if r else None,
            ),
        )

    def _insert_chunks(
        self, path: str, source: str, model: str, chunks: Sequence[NewChunk], now: int
    ) -> int:
        """Insert new chunk rows with their FTS rows (and vectors, when given); return how
        many still lack vectors."""
        pending = 0
        for chunk in chunks:
            embedded = chunk.vector is not None and self.vector_store != "none"
            row = self.conn.execute(
                "INSERT INTO chunks (path, source, start_line, end_line, hash, model, text, "
                "words, embedded, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    path,
                    source,
                    chunk.start_line,
                    chunk.end_line,
                    chunk.hash,
                    model,
                    chunk.text,
                    len(mmr_tokens(chunk.text)),
                    int(embedded),
                    now,
                ),
            ).fetchone()
            assert row is not None
            chunk_id = int(row[0])
            self.conn.execute(
                "INSERT INTO chunks_fts (rowid, body, uni, path) VALUES (?, ?, ?, ?)",
                (chunk_id, *fts_columns(path, chunk.text)),
            )
            self.conn.execute("INSERT INTO fts_log (id) VALUES (?)", (chunk_id,))
            if embedded:
                assert chunk.vector is not None
                self._insert_vector(chunk_id, chunk.vector, chunk.lines)
            elif self.vector_store != "none":
                pending += 1
        return pending

    def remove(self, path: str) -> None:
        """Delete every row of ``path`` in its own transaction and count a new generation."""
        with atomic(self.conn):
            self.delete_file(path)
            self.bump_generation()

    def delete_file(self, path: str) -> None:
        ids = [
            int(r[0]) for r in self.conn.execute("SELECT id FROM chunks WHERE path = ?", (path,))
        ]
        self._delete_chunks(ids)
        self.conn.execute("DELETE FROM files WHERE path = ?", (path,))

    def _delete_chunks(self, ids: Sequence[int]) -> None:
        """Delete chunk rows with their FTS entries and vectors."""
        if ids:
            self.conn.executemany("DELETE FROM chunks_fts WHERE rowid = ?", [(i,) for i in ids])
            self.conn.executemany("INSERT INTO fts_log (id) VALUES (?)", [(i,) for i in ids])
            self._delete_vectors(ids)
            self.conn.executemany("DELETE FROM chunks WHERE id = ?", [(i,) for i in ids])

    def unembedded(self, path: str) -> list[tuple[int, str, str]]:
        """(id, hash, text) of the chunks of ``path`` that still lack a vector."""
        rows = self.conn.execute(
            "SELECT id, hash, text FROM chunks WHERE path = ? AND embedded = 0 ORDER BY id", (path,)
        )
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def embedded_keys(self, path: str) -> set[tuple[int, int, str]]:
        """(start line, end line, hash) of the chunks of ``path`` that have their vectors."""
        rows = self.conn.execute(
            "SELECT start_line, end_line, hash FROM chunks WHERE path = ? AND embedded = 1",
            (path,),
        )
        return {(int(r[0]), int(r[1]), str(r[2])) for r in rows}

    def has_files(self) -> bool:
        return self.conn.execute("SELECT 1 FROM files LIMIT 1").fetchone() is not None

    def has_pending(self) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM files WHERE pending > 0 LIMIT 1").fetchone()
            is not None
        )

    def pending_count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM files WHERE pending > 0").fetchone()
        return int(row[0]) if row else 0

    def pending_paths(self, limit: int | None = None) -> list[str]:
        """Files still lacking vectors, the most recently changed first (what a person wrote
        last is what an agent asks about next), those whose embedding failed last."""
        rows = self.conn.execute(
            "SELECT path FROM files WHERE pending > 0"
            " ORDER BY error IS NOT NULL, mtime_ns DESC, path DESC LIMIT ?",
            (-1 if limit is None else limit,),
        )
        return [str(r[0]) for r in rows]

    def add_vectors(self, path: str, vectors: dict[int, tuple[Vectors, Vectors | None]]) -> int:
        """Store (chunk vector, line vectors) for chunks of ``path``; return how many of its
        chunks still lack them."""
        for chunk_id, (vector, lines) in vectors.items():
            updated = self.conn.execute(
                "UPDATE chunks SET embedded = 1 WHERE id = ? AND embedded = 0 RETURNING id",
                (chunk_id,),
            ).fetchone()
            if updated is not None:
                self._insert_vector(chunk_id, vector, lines)
        row = self.conn.execute(
            "SELECT count(*) FROM chunks WHERE path = ? AND embedded = 0", (path,)
        ).fetchone()
        left = int(row[0]) if row else 0
        self.conn.execute("UPDATE files SET pending = ?, error = NULL WHERE path = ?", (left, path))
        return left

    def set_file_error(self, path: str, error: str | None) -> None:
        self.conn.execute("UPDATE files SET error = ? WHERE path = ?", (error, path))
