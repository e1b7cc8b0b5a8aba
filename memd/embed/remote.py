"""Remote embedding providers (OpenAI, Gemini, Voyage, Mistral, Ollama, OpenAI-compatible servers).

Each splits work into requests within the provider's limits (inputs and tokens per request),
sends up to ``concurrency`` of them at once (4 to a cloud API, 1 to Ollama or a server of your
own), halves a request the provider calls too large, keeps input order and returns
L2-normalised float32 rows. A search's query never waits for a document request: queries
have threads of their own. What is sent is counted per provider (memd/embed/usage.py).

Over 400 lines: six providers' request and response shapes, side by side because they share
the batching, retries and errors (memd/embed/http.py) and differ only in those shapes.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, Literal

import numpy as np

from memd.config import EmbeddingConfig
from memd.embed.base import Embedder, Kind, Vectors, normalize
from memd.embed.http import BatchTooLarge, JsonClient
from memd.embed.secrets import KEY_VARIABLES, Secret, load_api_key, redact
from memd.embed.usage import Usage
from memd.text import CHARS_PER_TOKEN
from memd_client.errors import ConfigError, ProviderUnavailable

__all__ = [
    "GeminiEmbedder",
    "MissingKey",
    "MistralEmbedder",
    "OllamaEmbedder",
    "OpenAICompatibleEmbedder",
    "OpenAIEmbedder",
    "RemoteEmbedder",
    "VoyageEmbedder",
    "create_remote",
]

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


class MissingKey(ProviderUnavailable):
    """A remote provider with no API key configured; an automatic chain skips it."""


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


class OpenAIEmbedder(RemoteEmbedder):
    provider = "openai"
    default_base = "https://api.openai.com/v1"
    default_model = "text-embedding-3-small"
    known_dims: ClassVar[Mapping[str, int]] = {
        "text-embedding-3-small": 1536,
        "text-embedding-3-large": 3072,
        "text-embedding-ada-002": 1536,
    }
    batch_limit = 2048
    batch_tokens: ClassVar[int | None] = 250_000  # the API allows 300k tokens per request
    default_max_tokens = 8191
    batch_api = True

    def __init__(
        self, config: EmbeddingConfig, key: Secret | None = None, *, sleep: Sleep = time.sleep
    ) -> None:
        super().__init__(config, key, sleep=sleep)
        if self.dimensions and self.model == "text-embedding-ada-002":
            raise ConfigError("openai: text-embedding-ada-002 does not take embedding.dimensions")

    def _body(self, texts: list[str], kind: Kind) -> dict[str, object]:
        body: dict[str, object] = {"model": self.model, "input": texts}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        return body

    def _request(self, texts: list[str], kind: Kind) -> Vectors:
        payload = self._post("/embeddings", self._body(texts, kind), texts)
        return self._matrix(self._indexed_rows(payload, len(texts)), len(texts))

    # -- the Batch API (memd/embed/batch.py) ----------------------------------------------------

    def batch_requests(self, texts: list[str]) -> Iterator[tuple[int, list[str]]]:
        """``texts`` grouped into request lines of a batch: up to the API's own limits (no
        one waits for these answers, so they need not be small)."""
        return self._plan(texts, self.batch_tokens)

    def batch_body(self, texts: list[str]) -> dict[str, object]:
        return self._body(texts, "document")

    def batch_rows(self, payload: Any, n: int) -> Vectors:
        """The raw rows of one answer in a batch's output (a /v1/embeddings reply)."""
        return self._matrix(self._indexed_rows(payload, n), n)


class OpenAICompatibleEmbedder(OpenAIEmbedder):
    """A self-hosted OpenAI-style server (LM Studio, vLLM, llama.cpp server); key optional."""

    provider = "openai-compatible"
    default_base = ""
    default_model = ""
    known_dims: ClassVar[Mapping[str, int]] = {}
    batch_tokens = None
    default_max_tokens = 8192
    needs_key = False
    kind = "server"
    batch_api = False

    def __init__(
        self, config: EmbeddingConfig, key: Secret | None = None, *, sleep: Sleep = time.sleep
    ) -> None:
        if not config.base_url:
            raise ConfigError(f"{self.provider}: embedding.base_url is required")
        super().__init__(config, key, sleep=sleep)
        # Server limits vary (llama.cpp's is its -ub size); the configured batch size applies.
        self.batch_size = config.batch_size
        self._prefixes = {"document": config.document_prefix, "query": config.query_prefix}

    def _body(self, texts: list[str], kind: Kind) -> dict[str, object]:
        prefix = self._prefixes[kind]
        return super()._body([prefix + t for t in texts] if prefix else texts, kind)

    def _extra_settings(self) -> dict[str, object]:
        extra = super()._extra_settings()
        if any(self._prefixes.values()):
            extra["prefixes"] = dict(self._prefixes)
        return extra


class MistralEmbedder(OpenAIEmbedder):
    provider = "mistral"
    default_base = "https://api.mistral.ai/v1"
    default_model = "mistral-embed"
    known_dims = {"mistral-embed": 1024, "codestral-embed": 1536}
    batch_limit = 64
    batch_tokens = 16_000
    default_max_tokens = 8192
    batch_api = False  # Mistral's batch jobs have shapes of their own

    def _body(self, texts: list[str], kind: Kind) -> dict[str, object]:
        body: dict[str, object] = {"model": self.model, "input": texts}
        if self.dimensions:
            body["output_dimension"] = self.dimensions
        return body


class VoyageEmbedder(RemoteEmbedder):
    provider = "voyage"
    default_base = "https://api.voyageai.com/v1"
    default_model = "voyage-3.5"
    known_dims = {
        "voyage-3.5": 1024,
        "voyage-3.5-lite": 1024,
        "voyage-3-large": 1024,
        "voyage-code-3": 1024,
        "voyage-3": 1024,
        "voyage-3-lite": 512,
    }
    batch_limit = 128
    batch_tokens = 100_000  # 120k for the large models, more for the others
    default_max_tokens = 32_000

    def _request(self, texts: list[str], kind: Kind) -> Vectors:
        # truncation=False: an over-long text is an error to split on, never silently cut.
        body: dict[str, object] = {
            "model": self.model,
            "input": texts,
            "input_type": kind,
            "truncation": False,
        }
        if self.dimensions:
            body["output_dimension"] = self.dimensions
        payload = self._post("/embeddings", body, texts)
        return self._matrix(self._indexed_rows(payload, len(texts)), len(texts))

    def _extra_settings(self) -> dict[str, object]:
        return {**super()._extra_settings(), "input_type": "query|document"}


class GeminiEmbedder(RemoteEmbedder):
    provider = "gemini"
    default_base = "https://generativelanguage.googleapis.com/v1beta"
    default_model = "gemini-embedding-001"
    known_dims = {"gemini-embedding-001": 3072, "text-embedding-004": 768}
    batch_limit = 100
    default_max_tokens = 2048
    auth_header = "x-goog-api-key"
    auth_prefix = ""
    task_types: ClassVar[dict[str, str]] = {
        "document": "RETRIEVAL_DOCUMENT",
        "query": "RETRIEVAL_QUERY",
    }

    def _request(self, texts: list[str], kind: Kind) -> Vectors:
        name = self.model.removeprefix("models/")
        request: dict[str, object] = {"model": f"models/{name}", "taskType": self.task_types[kind]}
        if self.dimensions:
            request["outputDimensionality"] = self.dimensions
        body = {"requests": [{**request, "content": {"parts": [{"text": t}]}} for t in texts]}
        path = f"/models/{urllib.parse.quote(name, safe='')}:batchEmbedContents"
        payload = self._post(path, body, texts)
        items = payload.get("embeddings") if isinstance(payload, dict) else None
        if not isinstance(items, list) or len(items) != len(texts):
            raise self._bad(f"expected {len(texts)} items in 'embeddings'")
        rows = [item.get("values") if isinstance(item, dict) else None for item in items]
        return self._matrix(rows, len(texts))

    def _extra_settings(self) -> dict[str, object]:
        return {**super()._extra_settings(), "task_types": dict(self.task_types)}


class OllamaEmbedder(RemoteEmbedder):
    provider = "ollama"
    default_base = "http://127.0.0.1:11434"
    default_model = "nomic-embed-text"
    default_max_tokens = 2048  # Ollama's default context
    needs_key = False
    kind = "server"

    def __init__(
        self, config: EmbeddingConfig, key: Secret | None = None, *, sleep: Sleep = time.sleep
    ) -> None:
        super().__init__(config, key, sleep=sleep)
        self.batch_size = config.batch_size
        self._prefixes = {"document": config.document_prefix, "query": config.query_prefix}

    def _request(self, texts: list[str], kind: Kind) -> Vectors:
        prefix = self._prefixes[kind]
        # truncate=False: Ollama would otherwise cut a long text to its context without a word.
        body: dict[str, object] = {
            "model": self.model,
            "input": [prefix + t for t in texts] if prefix else texts,
            "truncate": False,
        }
        if self.dimensions:
            body["dimensions"] = self.dimensions
        payload = self._post("/api/embed", body, texts)
        rows = payload.get("embeddings") if isinstance(payload, dict) else None
        if not isinstance(rows, list):
            raise self._bad("no 'embeddings' list")
        return self._matrix(rows, len(texts))

    def _extra_settings(self) -> dict[str, object]:
        extra = super()._extra_settings()
        if any(self._prefixes.values()):
            extra["prefixes"] = dict(self._prefixes)
        return extra


PROVIDERS: dict[str, type[RemoteEmbedder]] = {
    cls.provider: cls
    for cls in (
        OpenAIEmbedder,
        GeminiEmbedder,
        VoyageEmbedder,
        MistralEmbedder,
        OllamaEmbedder,
        OpenAICompatibleEmbedder,
    )
}


def create_remote(
    name: str, config: EmbeddingConfig, env: Mapping[str, str], *, sleep: Sleep = time.sleep
) -> Embedder:
    """Build the remote provider ``name``; raise MissingKey if it needs a key and has none."""
    cls = PROVIDERS.get(name)
    if cls is None:
        raise ConfigError(
            f"unknown remote embedding provider {name!r} (one of {', '.join(sorted(PROVIDERS))})"
        )
    key = load_api_key(name, env=env, key_file=config.api_key_file)
    if key is None and cls.needs_key:
        where = " or ".join([*KEY_VARIABLES[name], "embedding.api_key_file"])
        raise MissingKey(f"no API key for {name} (set {where})")
    return cls(config, key, sleep=sleep)


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
