"""The Embedder interface every provider implements: texts in, L2-normalised float32 rows out;
with the size of the jobs documents are embedded in, and what indexing asks of a Batch API
(the interface the index is built against, so it needs no provider's module)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from memd.text import estimate_tokens

__all__ = [
    "DOCUMENT_JOB_CHARS",
    "BadVectors",
    "BatchQueue",
    "Embedder",
    "Kind",
    "Preempted",
    "Vectors",
    "check_vectors",
    "document_jobs",
    "normalize",
]

Kind = Literal["document", "query"]
Vectors = npt.NDArray[np.float32]

# Documents go to the embedder in jobs of about this many characters (one text at least): a
# query waits for the job that is running, and a batch of 32 chunks is half a minute of a slow
# CPU. Smaller jobs cost little: llama.cpp decodes a batch a sequence at a time anyway.
DOCUMENT_JOB_CHARS = 1024


class Preempted(Exception):
    """A document job stopped part way so that a query could go first; it is run again."""


class BadVectors(ValueError):
    """An embedder returned vectors no search can use (NaN, infinite, all zero, wrong shape):
    the texts count as not embedded, and the message says what was wrong."""


class Embedder(ABC):
    """A source of embeddings.

    Subclasses set ``provider``, ``model``, ``dims``, ``max_tokens`` and ``batch_size`` and
    implement :meth:`embed_batch`. ``settings()`` must name everything that changes the vectors,
    because it keys the embedding cache and the index identity.
    """

    provider: str
    model: str
    dims: int
    max_tokens: int
    batch_size: int = 32
    # "local" (a model on this machine), "server" (Ollama, a server of your own) or "cloud" (a
    # paid API): what the defaults of request sizes and concurrency go by.
    kind: str = "local"
    # True when the embedder runs its own requests, several at once, with queries apart (the
    # remote APIs): documents go to it straight, not through one worker thread.
    own_threads: bool = False
    # New text one embedding step of the writer hands it (0: the writer's default, about 1 KB,
    # so that a query or an append waits for little behind a local model).
    step_chars: int = 0

    @abstractmethod
    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        """Embed ``texts``; return an array of shape (len(texts), dims), rows L2-normalised."""

    def embed_query(self, text: str) -> Vectors:
        """Embed one search query; return a vector of shape (dims,)."""
        vector: Vectors = self.embed_batch([text], kind="query")[0]
        return vector

    def preempt(self) -> None:
        """Ask a running document job to stop for a query: it then raises Preempted. Only the
        local model's worker process can; elsewhere this does nothing."""

    def start_query(self, text: str) -> Future[Vectors]:
        """Begin embedding a search query; the future's result is its vector of shape (dims,).

        Here the work is done at once; an embedder with a thread of its own overrides this so
        that a search can run its keyword half while the query is embedded.
        """
        future: Future[Vectors] = Future()
        try:
            future.set_result(self.embed_query(text))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def send_query(self, text: str) -> Future[Vectors] | None:
        """Send a search query to an embedder that is idle, from the caller's thread, and return
        at once; the future's result is its vector. None (here, always) when it cannot: the
        query goes through :meth:`start_query`. The local model's worker can."""
        return None

    def query_takes_every_core(self) -> bool:
        """Whether a query now would likely run on every core (the local model's worker, when
        its last query did): a search then leaves the cores to it while it waits for the
        vector, rather than run work that can wait beside it (memd/search)."""
        return False

    def searching(self) -> AbstractContextManager[None]:
        """Count a search in flight while the block runs (the service wraps each in it): a
        local model gives a query every core only while it is the only search."""
        return contextlib.nullcontext()

    def count_tokens(self, text: str) -> int:
        """Count the tokens ``text`` costs this model; an estimate unless the model can tokenize."""
        return estimate_tokens(text)

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count_tokens` of each of ``texts`` (one round trip where the model is remote
        or in a process of its own)."""
        return [self.count_tokens(t) for t in texts]

    def plan_requests(self, texts: Sequence[str]) -> int:
        """How many requests embedding ``texts`` takes (0: none, the model is local)."""
        return 0

    def settings(self) -> dict[str, object]:
        """Everything that changes the vectors (never secrets)."""
        return {"provider": self.provider, "model": self.model, "dims": self.dims}

    @property
    def settings_key(self) -> str:
        """A stable hash of :meth:`settings`, used in cache keys and the index identity."""
        blob = json.dumps(self.settings(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def health(self) -> dict[str, object] | None:
        """What status shows of a provider that runs a process of its own (None: nothing)."""
        return None

    def close(self) -> None:
        """Release what the embedder holds (a model, a connection pool)."""

    def describe(self) -> str:
        return f"{self.provider}:{self.model} ({self.dims} dims)"


def normalize(matrix: npt.ArrayLike) -> Vectors:
    """Return ``matrix`` as float32 rows of unit length; non-finite values become 0."""
    arr = np.nan_to_num(np.asarray(matrix, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (arr / norms).astype(np.float32, copy=False)
    return out


def check_vectors(vectors: npt.ArrayLike, rows: int, dims: int) -> None:
    """Raise BadVectors unless ``vectors`` is ``rows`` finite, non-zero rows of ``dims``.

    :func:`normalize` turns NaN into 0 and leaves a zero row as it is, so a damaged model (NaN
    scales in its GGUF) would otherwise store all-zero vectors that match nothing, silently.
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape != (rows, dims):
        raise BadVectors(f"expected {rows} vector(s) of {dims} dims, got shape {arr.shape}")
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        raise BadVectors(
            f"non-finite values (NaN or infinity) in {int((~finite).sum())} of {rows} vector(s)"
        )
    # Unit rows have norm 1; a zero (or nearly zero, before normalising) row carries no direction.
    zero = np.linalg.norm(arr.astype(np.float64), axis=1) < 1e-6
    if zero.any():
        raise BadVectors(f"{int(zero.sum())} of {rows} vector(s) are all zero")


def document_jobs(texts: Sequence[str], limit: int = DOCUMENT_JOB_CHARS) -> Iterator[Sequence[str]]:
    """``texts`` cut into runs of about ``limit`` characters (one text at least), in order."""
    start = size = 0
    for i, text in enumerate(texts):
        if i > start and size + len(text) > limit:
            yield texts[start:i]
            start, size = i, 0
        size += len(text)
    yield texts[start:]


class BatchQueue(Protocol):
    """What indexing asks of a provider's Batch API (memd/embed/batch.py): texts sent to be
    embedded within hours at a lower price, whose vectors arrive in the embedding cache."""

    def pending(self) -> set[str]: ...

    def waiting(self) -> bool: ...

    def next_poll_in(self) -> float: ...

    def worth_it(self, tokens: int) -> bool: ...

    def submit(self, items: Mapping[str, str]) -> object: ...

    def poll(self, *, force: bool = False) -> int: ...
