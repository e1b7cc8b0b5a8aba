"""RemoteEmbedder: what every remote embedding provider shares (memd/embed/providers.py holds
the six providers themselves).

It splits work into requests within the provider's limits (inputs and tokens per request),
sends up to ``concurrency`` of them at once (4 to a cloud API, 1 to Ollama or a server of your
own), halves a request the provider calls too large, keeps input order and returns
L2-normalised float32 rows. A search's query never waits for a document request: queries
have threads of their own. What is sent is counted per provider (memd/embed/usage.py).
Retries and errors are memd/embed/http.py's; a provider adds only its request and reply shapes.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, Literal

import numpy as np

from memd.config import EmbeddingConfig
from memd.embed.base import Embedder, Kind, Vectors, normalize
from memd.embed.http import BatchTooLarge, JsonClient
from memd.embed.secrets import Secret, redact
from memd.embed.usage import Usage
from memd.text import CHARS_PER_TOKEN
from memd_client.errors import ConfigError, ProviderUnavailable

__all__ = ["RemoteEmbedder", "Sleep"]

logger = logging.getLogger(__name__)

Sleep = Callable[[float], None]
ProviderKind = Literal["cloud", "server"]

# A cloud API takes requests in parallel and bills by the token: 4 in flight (OpenClaw's
# choice) of up to 8,192 tokens each (its batch size, and about 32 KB of text: a request's
# fixed cost is spread over hundreds of lines, and one wave of four is a second or so, which
# is how long an append waits behind the embedding of a first index).
CLOUD_CONCURRENCY = 4
CLOUD_REQUEST_TOKENS = 8192
# Ollama or a server of your own computes one request at a time on its own CPU or GPU: a query
# sent meanwhile waits behind the request it is running, so requests stay at about 1 KB of
# text, as for the local model (memd/embed/queued.py).
SERVER_REQUEST_TOKENS = 256
# Threads that send search queries, apart from the document requests.
QUERY_THREADS = 4


class RemoteEmbedder(Embedder):
    """An embedder behind an HTTP API; subclasses build the request and read the reply."""

    default_base: ClassVar[str]
    default_model: ClassVar[str] = ""
    known_dims: ClassVar[Mapping[str, int]] = {}
    batch_limit: ClassVar[int] = 32
    # Estimated tokens per request (None: no limit beyond batch_limit); a guess on the safe side,
    # since a request that is still too large is split anyway.
    batch_tokens: ClassVar[int | None] = None
    default_max_tokens: ClassVar[int] = 8192
    needs_key: ClassVar[bool] = True
    auth_header: ClassVar[str] = "Authorization"
    auth_prefix: ClassVar[str] = "Bearer "
    kind: ProviderKind = "cloud"
    own_threads = True
    # Whether the provider's Batch API is spoken here (memd/embed/batch.py): OpenAI's only.
    batch_api: ClassVar[bool] = False

    def __init__(
        self, config: EmbeddingConfig, key: Secret | None = None, *, sleep: Sleep = time.sleep
    ) -> None:
        self.model = config.model or self.default_model
        if not self.model:
            raise ConfigError(f"{self.provider}: embedding.model is required")
        self.dimensions = config.dimensions
        self._dims = config.dimensions or self.known_dims.get(self.model, 0)
        self.max_tokens = self.default_max_tokens
        self.batch_size = self.batch_limit
        cloud = self.kind == "cloud"
        self.concurrency = config.concurrency or (CLOUD_CONCURRENCY if cloud else 1)
        self.request_tokens = config.request_tokens or (
            CLOUD_REQUEST_TOKENS if cloud else SERVER_REQUEST_TOKENS
        )
        # One writer step hands over as much new text as one wave of requests holds.
        self.step_chars = self.concurrency * self.request_tokens * CHARS_PER_TOKEN
        self.usage = Usage()  # in memory until memd gives it a file (memd/service.py)
        self._probe_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._queries_lock = threading.Lock()
        self._queries: ThreadPoolExecutor | None = None  # made at the first search
        self._http = JsonClient(
            self.provider,
            config.base_url or self.default_base,
            key=key,
            auth_header=self.auth_header,
            auth_prefix=self.auth_prefix,
            timeout=config.timeout_seconds,
            max_retries=config.max_retries,
            sleep=sleep,
            on_request=lambda: self.usage.record(self.provider, requests=1),
            keep=self.concurrency + QUERY_THREADS,
        )
        self.base_url = self._http.base_url

    @property
    def dims(self) -> int:
        """The vector size; a model not in the table is asked once by embedding "ping"."""
        if not self._dims:
            with self._probe_lock:
                if not self._dims:
                    logger.info("%s: asking %s for its vector size", self.provider, self.model)
                    self._request(["ping"], "document")
        return self._dims

    @dims.setter
    def dims(self, value: int) -> None:
        self._dims = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    def settings(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "model": self.model,
            "dims": self.dims,
            "base_url": self.base_url,
            **self._extra_settings(),
        }

    def _extra_settings(self) -> dict[str, object]:
        return {"dimensions": self.dimensions} if self.dimensions else {}

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        """Embed ``texts`` in requests within the provider's limits. Documents: up to
        ``concurrency`` requests in flight, whoever asks (the writer, a rebuild); a query goes
        at once on the caller's thread, beside them, never queued behind them."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        plan = list(self._plan(texts))
        if kind == "query":
            parts = [self._embed_split(batch, start, kind) for start, batch in plan]
        elif len(plan) == 1:
            parts = [self._document(plan[0])]
        else:
            # Threads for this call only: nothing lingers once it returns.
            with ThreadPoolExecutor(
                min(self.concurrency, len(plan)), thread_name_prefix=f"memd-{self.provider}"
            ) as pool:
                futures = [pool.submit(self._document, item) for item in plan]
                try:
                    parts = [f.result() for f in futures]
                finally:
                    for f in futures:
                        f.cancel()  # after a failure, the requests not yet sent are not sent
        return normalize(np.concatenate(parts, axis=0))

    def _document(self, item: tuple[int, list[str]]) -> Vectors:
        start, texts = item
        with self._slots:
            return self._embed_split(texts, start, "document")

    def start_query(self, text: str) -> Future[Vectors]:
        """Embed a search query on a thread of the queries' own (a search does its keyword
        half meanwhile); never behind a document request."""
        with self._queries_lock:
            if self._queries is None:
                self._queries = ThreadPoolExecutor(
                    QUERY_THREADS, thread_name_prefix=f"memd-{self.provider}-query"
                )
            return self._queries.submit(self.embed_query, text)

    def close(self) -> None:
        with self._queries_lock:
            queries, self._queries = self._queries, None
        if queries is not None:
            queries.shutdown(wait=True, cancel_futures=True)
        self._http.close()
        self.usage.flush()

    def describe_limits(self) -> dict[str, object]:
        """How this provider is asked: what status shows of it."""
        return {
            "kind": self.kind,
            "concurrency": self.concurrency,
            "inputs_per_request": self.batch_size,
            "tokens_per_request": self._request_budget(),
            "held_s": round(self._http.pace.held(), 1),
        }

    def _request_budget(self) -> int:
        limit = self.batch_tokens
        return self.request_tokens if limit is None else min(limit, self.request_tokens)

    def plan_requests(self, texts: Sequence[str]) -> int:
        return sum(1 for _ in self._plan(list(texts)))

    @property
    def http(self) -> JsonClient:
        return self._http

    def _plan(self, texts: list[str], budget: int | None = 0) -> Iterator[tuple[int, list[str]]]:
        """Group ``texts`` into requests within the count and token limits, in order (``budget``
        tokens a request: by default the live requests' size; None: no limit)."""
        start, tokens = 0, 0
        if budget == 0:
            budget = self._request_budget()
        batch: list[str] = []
        for i, text in enumerate(texts):
            cost = self.count_tokens(text)
            full = len(batch) >= self.batch_size or (
                budget is not None and batch and tokens + cost > budget
            )
            if full:
                yield start, batch
                start, batch, tokens = i, [], 0
            batch.append(text)
            tokens += cost
        if batch:
            yield start, batch

    def _embed_split(self, texts: list[str], offset: int, kind: Kind) -> Vectors:
        try:
            return self._request(texts, kind)
        except BatchTooLarge:
            if len(texts) == 1:
                preview = redact(" ".join(texts[0][:40].split()))
                raise ProviderUnavailable(
                    f"{self.provider}: input {offset} (about {self.count_tokens(texts[0])} tokens, "
                    f"starting {preview!r}) is too large for {self.model}"
                ) from None
            mid = len(texts) // 2
            logger.info("%s: a batch of %d is too large; splitting it", self.provider, len(texts))
            left = self._embed_split(texts[:mid], offset, kind)
            return np.concatenate([left, self._embed_split(texts[mid:], offset + mid, kind)])

    @abstractmethod
    def _request(self, texts: list[str], kind: Kind) -> Vectors:
        """Embed one request's worth of ``texts``; return their raw rows in input order."""

    def _post(self, path: str, body: object, texts: list[str]) -> Any:
        """POST one embedding request for ``texts``; count them and their tokens (the
        provider's own count when the reply has one: ``usage`` or Ollama's
        ``prompt_eval_count``)."""
        estimate = sum(self.count_tokens_many(texts))
        payload = self._http.post(path, body, tokens=estimate)
        tokens = _reply_tokens(payload)
        self.usage.record(
            self.provider, texts=len(texts), tokens=estimate if tokens is None else tokens
        )
        return payload

    # -- reading replies ------------------------------------------------------------------------

    def _bad(self, what: str) -> ProviderUnavailable:
        return ProviderUnavailable(f"{self.provider} sent an unexpected reply: {what}")

    def _indexed_rows(self, payload: Any, n: int) -> list[Any]:
        """The ``data[i].embedding`` rows of an OpenAI-shaped reply, put back in input order."""
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != n:
            raise self._bad(f"expected {n} embeddings in 'data'")
        rows: list[Any] = [None] * n
        for pos, item in enumerate(data):
            index = item.get("index", pos) if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < n or rows[index] is not None:
                raise self._bad("missing, repeated or out-of-range 'index'")
            rows[index] = item.get("embedding")
        return rows

    def _matrix(self, rows: list[Any], n: int) -> Vectors:
        """Check ``rows`` are ``n`` finite vectors of the model's size; learn the size if new."""
        try:
            matrix = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError):
            raise self._bad("embeddings are not lists of numbers") from None
        if matrix.ndim != 2 or matrix.shape[0] != n or matrix.shape[1] == 0:
            raise self._bad(f"expected {n} vectors, got shape {matrix.shape}")
        if not np.isfinite(matrix).all():
            raise self._bad("embeddings hold non-finite numbers")
        width = int(matrix.shape[1])
        if not self._dims:
            self._dims = width
        elif width != self._dims:
            raise ProviderUnavailable(
                f"{self.provider} returned {width}-dim vectors for {self.model}, "
                f"expected {self._dims} (check embedding.model and embedding.dimensions)"
            )
        return matrix


def _reply_tokens(payload: Any) -> int | None:
    """The tokens a reply says the request cost, if it says."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if isinstance(usage, dict):
        for name in ("prompt_tokens", "total_tokens"):
            value = usage.get(name)
            if isinstance(value, int) and value >= 0:
                return value
    count = payload.get("prompt_eval_count")
    return count if isinstance(count, int) and count >= 0 else None
