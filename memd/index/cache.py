"""The embedding cache shared by every workspace: (settings key, chunk hash) -> vector."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from memd.embed.base import Embedder, Vectors
from memd.index.db import atomic, connect, translate_errors

__all__ = ["EmbeddingCache", "cached_vectors"]


class EmbeddingCache:
    """A small SQLite database of vectors keyed by what produced them and the text's hash.

    The key includes the embedder's settings hash, so vectors of different models, dims or
    prefixes never mix; a renamed file or a rebuilt index embeds nothing again.
    """

    def __init__(self, path: Path, *, max_entries: int = 0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._conn = connect(path, load_vec=False)
        with self._lock, translate_errors("embedding cache"), atomic(self._conn):
            self._conn.execute(
                """
                CREATE TABLE IF NOT EXISTS embedding_cache (
                    settings_key TEXT NOT NULL,
                    hash TEXT NOT NULL,
                    provider TEXT NOT NULL,
                    model TEXT NOT NULL,
                    dims INTEGER NOT NULL,
                    embedding BLOB NOT NULL,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (settings_key, hash)
                ) WITHOUT ROWID;
                CREATE INDEX IF NOT EXISTS embedding_cache_updated ON embedding_cache(updated_at);
                """
            )

    def get_many(self, settings_key: str, hashes: Iterable[str], dims: int) -> dict[str, Vectors]:
        """Cached vectors for those of ``hashes`` that have one."""
        wanted = list(dict.fromkeys(hashes))
        out: dict[str, Vectors] = {}
        with self._lock, translate_errors("embedding cache"):
            for start in range(0, len(wanted), 500):
                part = wanted[start : start + 500]
                rows = self._conn.execute(
                    "SELECT hash, embedding FROM embedding_cache WHERE settings_key = ? AND dims = ? "
                    f"AND hash IN ({','.join('?' * len(part))})",
                    [settings_key, dims, *part],
                )
                for h, blob in rows:
                    out[str(h)] = np.frombuffer(bytes(blob), dtype=np.float32).copy()
        return out

    def known(self, settings_key: str, hashes: Iterable[str], dims: int) -> set[str]:
        """Those of ``hashes`` that have a vector here (without reading the vectors)."""
        wanted = list(dict.fromkeys(hashes))
        out: set[str] = set()
        with self._lock, translate_errors("embedding cache"):
            for start in range(0, len(wanted), 500):
                part = wanted[start : start + 500]
                rows = self._conn.execute(
                    "SELECT hash FROM embedding_cache WHERE settings_key = ? AND dims = ? "
                    f"AND hash IN ({','.join('?' * len(part))})",
                    [settings_key, dims, *part],
                )
                out.update(str(r[0]) for r in rows)
        return out

    def put_many(
        self, settings_key: str, provider: str, model: str, vectors: Mapping[str, Vectors]
    ) -> None:
        if not vectors:
            return
        now = int(time.time() * 1000)
        rows = [
            (
                settings_key,
                h,
                provider,
                model,
                int(v.shape[0]),
                np.ascontiguousarray(v, dtype=np.float32).tobytes(),
                now,
            )
            for h, v in vectors.items()
        ]
        with self._lock, translate_errors("embedding cache"), atomic(self._conn):
            self._conn.executemany(
                "INSERT INTO embedding_cache (settings_key, hash, provider, model, dims, embedding, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (settings_key, hash) "
                "DO UPDATE SET embedding = excluded.embedding, dims = excluded.dims, "
                "updated_at = excluded.updated_at",
                rows,
            )
            if self.max_entries:
                self._prune()

    def _prune(self) -> None:
        row = self._conn.execute("SELECT count(*) FROM embedding_cache").fetchone()
        excess = (int(row[0]) if row else 0) - self.max_entries
        if excess > 0:
            self._conn.execute(
                "DELETE FROM embedding_cache WHERE (settings_key, hash) IN (SELECT settings_key, "
                "hash FROM embedding_cache ORDER BY updated_at LIMIT ?)",
                (excess,),
            )

    def count(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT count(*) FROM embedding_cache").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def cached_vectors(
    embedder: Embedder, cache: EmbeddingCache | None
) -> Callable[[Sequence[str]], list[Vectors | None]]:
    """Vectors of texts as the index has them: from the cache by the text's hash (an indexed
    line or chunk costs no model call), the rest embedded as documents and cached."""

    def vectors(texts: Sequence[str]) -> list[Vectors | None]:
        hashes = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        found = cache.get_many(embedder.settings_key, hashes, embedder.dims) if cache else {}
        todo = list({h: t for h, t in zip(hashes, texts, strict=True) if h not in found}.items())
        for start in range(0, len(todo), embedder.batch_size):
            batch = todo[start : start + embedder.batch_size]
            fresh = embedder.embed_batch([t for _, t in batch], kind="document")
            made = {h: fresh[i] for i, (h, _) in enumerate(batch)}
            if cache is not None:
                cache.put_many(embedder.settings_key, embedder.provider, embedder.model, made)
            found.update(made)
        return [found.get(h) for h in hashes]

    return vectors
