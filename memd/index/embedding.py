"""The vectors of chunks, the first layer of a Syncer: looked up in the embedding cache, or
embedded (each distinct text once) and cached; rows a provider got wrong are never kept. With
the model's token counts (remembered by digest) and the wait after a provider failure.

Its own module: everything that asks the embedder for something, under the file-by-file
sync (memd/index/files.py) and the backlog of pending vectors (memd/index/backlog.py).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import TypeVar

import numpy as np

from memd.config import IndexConfig
from memd.embed.base import BadVectors, Embedder, Vectors, check_vectors, document_jobs
from memd.index.cache import EmbeddingCache
from memd.index.chunk import vector_lines
from memd.index.index import Index
from memd.index.report import SyncReport, SyncStatus
from memd.index.store import Store

__all__ = ["BadTexts", "ChunkEmbedding"]


K = TypeVar("K")
TOKEN_COUNTS_KEPT = 200_000  # about 10 MB of digests and counts


class ChunkEmbedding:
    """The chunk-vector steps of a Syncer (memd/index/sync.py), which holds the state below."""

    index: Index
    config: IndexConfig
    embedder: Embedder | None
    cache: EmbeddingCache | None
    status: SyncStatus
    _embed_failures: int
    _retry_at: float
    _token_counts: dict[bytes, int]
    _token_owner: Embedder | None

    @property
    def line_vectors(self) -> bool:
        """Whether chunks get a vector per line besides their own (``index.line_vectors``)."""
        return self.config.line_vectors

    def _same_vectors(self, store: Store) -> bool:
        """True when ``store`` holds vectors of this syncer's embedder (so they may be added)."""
        identity = Index.stored_identity(store.conn)
        return (
            self.embedder is not None
            and identity is not None
            and store.vector_store != "none"
            and identity.settings_key == self.embedder.settings_key
        )

    def _texts_of(self, chunks: Iterable[tuple[object, str, str]]) -> dict[str, str]:
        """hash -> text of ``chunks`` (key, hash, text) and of their lines, when lines get
        vectors of their own."""
        texts: dict[str, str] = {}
        for _, h, text in chunks:
            texts.setdefault(h, text)
            if self.line_vectors:
                for line, lh in vector_lines(text):
                    texts.setdefault(lh, line)
        return texts

    def _chunk_vectors(
        self,
        e: Embedder,
        chunks: list[tuple[K, str, str]],
        report: SyncReport,
        *,
        embed: bool,
        max_chars: int | None = None,
    ) -> dict[K, tuple[Vectors, Vectors | None]]:
        """(vector, line vectors) of the chunks (key, hash, text): from the cache, and with
        ``embed`` the missing texts embedded (each distinct one once) and cached; without it,
        only the chunks whose vector and line vectors are all cached. ``max_chars`` (with a
        cache) stops the embedding after about that much text: the chunks it did not reach are
        left out."""
        per_line = self.line_vectors
        lines = {key: vector_lines(text) if per_line else [] for key, _, text in chunks}
        texts: dict[str, str] = {}
        for key, h, text in chunks:
            texts.setdefault(h, text)
            for line, lh in lines[key]:
                texts.setdefault(lh, line)
        by_hash: dict[str, Vectors] = {}
        if self.cache is not None:
            by_hash = self.cache.get_many(e.settings_key, texts, e.dims)
        report.cache_hits += sum(
            1 for key, h, _ in chunks if h in by_hash and all(lh in by_hash for _, lh in lines[key])
        )
        items = [(h, text) for h, text in texts.items() if h not in by_hash] if embed else []
        if max_chars is not None and self.cache is not None and items:
            items = items[: len(next(document_jobs([t for _, t in items], max_chars)))]
        by_hash.update(self._embed_texts(e, items, report))
        return {
            key: (by_hash[h], _stack([by_hash[lh] for _, lh in lines[key]]))
            for key, h, _ in chunks
            if h in by_hash and all(lh in by_hash for _, lh in lines[key])
        }

    def _embed_texts(
        self, e: Embedder, items: list[tuple[str, str]], report: SyncReport
    ) -> dict[str, Vectors]:
        """Embed ``items`` (hash, text) and cache their vectors; return them by hash."""
        by_hash: dict[str, Vectors] = {}
        for start in range(0, len(items), e.batch_size):
            batch = items[start : start + e.batch_size]
            vectors = e.embed_batch([t for _, t in batch], kind="document")
            # Whatever the provider: a NaN or zero row is a failed embedding, never cached.
            # The good rows of the same batch are kept: they may be other files' texts.
            bad = _bad_rows(vectors, len(batch), e.dims)
            fresh = {h: vectors[i] for i, (h, _) in enumerate(batch) if i not in bad}
            if self.cache is not None:
                self.cache.put_many(e.settings_key, e.provider, e.model, fresh)
            by_hash.update(fresh)
            report.embedded += len(fresh)
            report.embedded_chars += sum(len(t) for i, (_, t) in enumerate(batch) if i not in bad)
            if bad:
                try:
                    check_vectors(vectors, len(batch), e.dims)
                except BadVectors as exc:
                    raise BadTexts(str(exc), {batch[i][0] for i in bad}) from None
        return by_hash

    def backing_off(self) -> bool:
        """True while embedding waits after a failure."""
        return time.monotonic() < self._retry_at

    def reset_backoff(self) -> None:
        self._embed_failures = 0
        self._retry_at = 0.0

    def _failed(self, error: str) -> None:
        self.status.last_error = error
        self._embed_failures += 1
        self._retry_at = time.monotonic() + min(3600.0, 30.0 * 2 ** (self._embed_failures - 1))

    def _count_tokens(self, text: str) -> int:
        """The model's token count of ``text``, remembered by digest: re-chunking a grown daily
        log asks again for every chunk it had, and each ask is a round trip to the model."""
        assert self.embedder is not None
        key = _digest(text)
        count = self._token_memo().get(key)
        if count is None:
            count = self.embedder.count_tokens(text)
            self._remember_count(key, count)
        return count

    def _count_all(self, texts: list[str]) -> None:
        """Ask the model for the token counts of ``texts`` it was not asked before, in one
        round trip: a checkout of 1,000 files asked once per chunk, each ask waiting for the
        query the model was embedding."""
        assert self.embedder is not None
        memo = self._token_memo()
        keys = {_digest(t): t for t in texts}
        new = [k for k in keys if k not in memo]
        if len(new) < 2:
            return  # one text: the single ask is the same round trip
        for key, count in zip(
            new, self.embedder.count_tokens_many([keys[k] for k in new]), strict=True
        ):
            self._remember_count(key, count)

    def _token_memo(self) -> dict[bytes, int]:
        """The remembered token counts, emptied when the embedder changed (another model
        counts differently)."""
        if self._token_owner is not self.embedder:
            self._token_counts.clear()
            self._token_owner = self.embedder
        return self._token_counts

    def _remember_count(self, key: bytes, count: int) -> None:
        if len(self._token_counts) >= TOKEN_COUNTS_KEPT:
            self._token_counts.clear()
        self._token_counts[key] = count


class BadTexts(BadVectors):
    """Some texts of a batch got vectors no search can use; ``hashes`` names them (the other
    texts of the batch were kept)."""

    def __init__(self, message: str, hashes: set[str]) -> None:
        super().__init__(message)
        self.hashes = hashes


def _bad_rows(vectors: Vectors, rows: int, dims: int) -> set[int]:
    """The rows of ``vectors`` that are not finite or are all zero (all of them when the
    shape is wrong)."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape != (rows, dims):
        return set(range(rows))
    finite = np.isfinite(arr).all(axis=1)
    zero = np.linalg.norm(np.nan_to_num(arr).astype(np.float64), axis=1) < 1e-6
    return {int(i) for i in np.flatnonzero(~finite | zero)}


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _stack(vectors: list[Vectors]) -> Vectors | None:
    return np.stack(vectors).astype(np.float32) if vectors else None
