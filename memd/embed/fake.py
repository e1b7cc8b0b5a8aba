"""FakeEmbedder: deterministic hashed bag-of-words vectors for tests and ``provider = "fake"``.

Texts that share words get similar vectors, so vector and hybrid search behave sensibly in tests
without a model. It counts every call, so tests can assert that nothing was embedded twice.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence

import numpy as np

from memd.embed.base import Embedder, Kind, Vectors, normalize
from memd.text import mmr_tokens

__all__ = ["EmbedFailure", "FakeEmbedder"]


class EmbedFailure(RuntimeError):
    """Raised by a FakeEmbedder told to fail, standing in for a provider outage in tests."""


class FakeEmbedder(Embedder):
    provider = "fake"

    def __init__(
        self,
        dims: int = 64,
        *,
        model: str = "fake-bow",
        max_tokens: int = 512,
        batch_size: int = 32,
    ) -> None:
        self.model = model
        self.dims = dims
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.calls = 0
        self.texts_embedded = 0
        self.documents_embedded = 0
        self.fail = False
        self._lock = threading.Lock()

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        with self._lock:
            if self.fail:
                raise EmbedFailure("fake embedder told to fail")
            self.calls += 1
            self.texts_embedded += len(texts)
            if kind == "document":
                self.documents_embedded += len(texts)
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in mmr_tokens(text):
                digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dims
                sign = 1.0 if digest[4] & 1 else -1.0
                out[row, bucket] += sign
            if not out[row].any():
                out[row, 0] = 1.0
        return normalize(out)
