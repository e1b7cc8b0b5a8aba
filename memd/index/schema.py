"""Ordered schema migrations of a workspace index, each applied once in its own transaction."""

from __future__ import annotations

import time
from collections.abc import Callable

import apsw

from memd.index.db import atomic
from memd.text import mmr_tokens

__all__ = ["FTS_TOKENIZER", "MIGRATIONS", "migrate"]

# Part of the index identity: a change here means every FTS row must be rebuilt.
FTS_TOKENIZER = "memd-cjk2+porter-unicode61-v1"


def m001_create_tables(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE files (
            path TEXT PRIMARY KEY,
            source TEXT NOT NULL DEFAULT 'memory',
            kind TEXT NOT NULL,
            day TEXT,
            hash TEXT NOT NULL,
            mtime_ns INTEGER NOT NULL,
            size INTEGER NOT NULL,
            chunks INTEGER NOT NULL,
            pending INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            indexed_at INTEGER NOT NULL
        );
        CREATE TABLE chunks (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL,
            source TEXT NOT NULL DEFAULT 'memory',
            start_line INTEGER NOT NULL,
            end_line INTEGER NOT NULL,
            hash TEXT NOT NULL,
            model TEXT NOT NULL,
            text TEXT NOT NULL,
            embedded INTEGER NOT NULL DEFAULT 0,
            updated_at INTEGER NOT NULL
        );
        CREATE INDEX chunks_path ON chunks(path);
        CREATE INDEX chunks_source ON chunks(source);
        CREATE INDEX chunks_unembedded ON chunks(path) WHERE embedded = 0;
        """
    )


def m002_create_fts(conn: apsw.Connection) -> None:
    # Contentless: the text lives once, in chunks; FTS rows share the chunk's rowid.
    # body = words plus CJK bigrams, uni = CJK unigrams, path = the file path's words.
    conn.execute(
        """
        CREATE VIRTUAL TABLE chunks_fts USING fts5(
            body, uni, path,
            content='', contentless_delete=1,
            tokenize='porter unicode61 remove_diacritics 2'
        )
        """
    )


def m003_index_pending_files(conn: apsw.Connection) -> None:
    # The writer asks "is anything left to embed?" between every two jobs.
    conn.execute("CREATE INDEX files_pending ON files(path) WHERE pending > 0")


def m004_create_fts_vocab(conn: apsw.Connection) -> None:
    # Document frequencies of indexed terms, to leave near-universal terms out of queries.
    conn.execute("CREATE VIRTUAL TABLE chunks_fts_vocab USING fts5vocab(chunks_fts, 'row')")


def m005_chunk_word_counts(conn: apsw.Connection) -> None:
    # How many distinct tokens each chunk holds (the keyword boost's density denominator),
    # so a search need not tokenise its candidates' whole texts.
    conn.execute("ALTER TABLE chunks ADD COLUMN words INTEGER")
    last = 0
    while True:
        rows = [
            (int(r[0]), str(r[1]))
            for r in conn.execute(
                "SELECT id, text FROM chunks WHERE id > ? ORDER BY id LIMIT 2000", (last,)
            )
        ]
        if not rows:
            return
        conn.executemany(
            "UPDATE chunks SET words = ? WHERE id = ?",
            [(len(mmr_tokens(text)), chunk_id) for chunk_id, text in rows],
        )
        last = rows[-1][0]


def m006_line_vectors(conn: apsw.Connection) -> None:
    # The vectors of a chunk's lines (memd.index.chunk.vector_lines), float16, one row per chunk
    # that has them, sharing the chunk's id; written and deleted with the chunk's own vector.
    conn.execute("CREATE TABLE chunk_lines (id INTEGER PRIMARY KEY, vectors BLOB NOT NULL)")


def m007_vector_log(conn: apsw.Connection) -> None:
    # Every vector written to or deleted from the plain vector table, in the same transaction:
    # the in-memory sketch (memd/index/sketch.py) follows the file by it. AUTOINCREMENT: a seq
    # is never reused, so rows the sketch has applied can be deleted.
    conn.execute(
        "CREATE TABLE vector_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, id INTEGER NOT NULL, "
        "added INTEGER NOT NULL)"
    )


def m008_file_resume(conn: apsw.Connection) -> None:
    # Where a file that grows at its end is chunked again from (memd/index/tail.py): a line
    # where chunking may start afresh, its byte offset, and how many bytes were indexed. NULL:
    # unknown, and the next change of the file indexes it whole. The rows from that line on
    # are found by the index, not by reading all of a 7 MB log's rows (25 ms).
    conn.execute(
        """
        ALTER TABLE files ADD COLUMN resume_line INTEGER;
        ALTER TABLE files ADD COLUMN resume_offset INTEGER;
        ALTER TABLE files ADD COLUMN indexed_bytes INTEGER;
        CREATE INDEX chunks_path_line ON chunks(path, start_line);
        """
    )


def m009_fts_log(conn: apsw.Connection) -> None:
    # Every chunk row inserted or deleted (its FTS row with it), in the same transaction: the
    # in-memory keyword postings (memd/index/postings.py) follow the file by it, as the sketch
    # follows vector_log. An index from before starts with an empty log: the postings are built
    # from the chunks themselves.
    conn.execute(
        "CREATE TABLE fts_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, id INTEGER NOT NULL)"
    )


MIGRATIONS: list[Callable[[apsw.Connection], None]] = [
    m001_create_tables,
    m002_create_fts,
    m003_index_pending_files,
    m004_create_fts_vocab,
    m005_chunk_word_counts,
    m006_line_vectors,
    m007_vector_log,
    m008_file_resume,
    m009_fts_log,
]


def migrate(conn: apsw.Connection) -> list[str]:
    """Apply the migrations not yet recorded in ``_migrations``; return their names."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    applied = []
    for migration in MIGRATIONS:
        name = migration.__name__
        if name in done:
            continue
        with atomic(conn):
            migration(conn)
            conn.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)",
                (name, int(time.time() * 1000)),
            )
        applied.append(name)
    return applied
