"""IndexMeta: the ``meta`` table of an index: key/value rows, the embedding identity the index
was built with, and its generation (moved on by each change of a file's rows).

A mixin of Store (memd/index/store.py), apart from the files and chunks it writes: the meta rows
are the index's description of itself, read on their own (status, freshness, the writer).
"""

from __future__ import annotations

import json

import apsw

__all__ = ["IDENTITY_KEY", "IndexMeta"]


IDENTITY_KEY = "identity"


class IndexMeta:
    """The meta rows of a Store's connection."""

    conn: apsw.Connection

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def identity(self) -> dict[str, object] | None:
        raw = self.get_meta(IDENTITY_KEY)
        return None if raw is None else dict(json.loads(raw))

    def set_identity(self, identity: dict[str, object]) -> None:
        self.set_meta(IDENTITY_KEY, json.dumps(identity, sort_keys=True))

    def generation(self) -> int:
        value = self.get_meta("generation")
        return int(value) if value else 0

    def bump_generation(self) -> int:
        gen = self.generation() + 1
        self.set_meta("generation", str(gen))
        return gen
