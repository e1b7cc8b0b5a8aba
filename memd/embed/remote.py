"""Remote embedding providers (OpenAI, Gemini, Voyage, Mistral, Ollama, OpenAI-compatible servers).

Each splits work into the provider's batch limits, halves a batch the provider calls too large,
keeps input order and returns L2-normalised float32 rows.

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
from typing import Any, ClassVar

import numpy as np

from memd.config import EmbeddingConfig
from memd.embed.base import Embedder, Kind, Vectors, normalize
from memd.embed.http import BatchTooLarge, JsonClient
from memd.embed.secrets import KEY_VARIABLES, Secret, load_api_key, redact
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
        self._probe_lock = threading.Lock()
        self._http = JsonClient(
            self.provider,
            config.base_url or self.default_base,
            key=key,
            auth_header=self.auth_header,
            auth_prefix=self.auth_prefix,
            timeout=config.timeout_seconds,
            max_retries=config.max_retries,
            sleep=sleep,
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
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        parts = [self._embed_split(batch, start, kind) for start, batch in self._plan(texts)]
        return normalize(np.concatenate(parts, axis=0))

    def _plan(self, texts: list[str]) -> Iterator[tuple[int, list[str]]]:
        """Group ``texts`` into requests within the count and token limits, in order."""
        start, tokens = 0, 0
        batch: list[str] = []
        for i, text in enumerate(texts):
            cost = self.count_tokens(text)
            full = len(batch) >= self.batch_size or (
                self.batch_tokens is not None and batch and tokens + cost > self.batch_tokens
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
        payload = self._http.post("/embeddings", self._body(texts, kind))
        return self._matrix(self._indexed_rows(payload, len(texts)), len(texts))


class OpenAICompatibleEmbedder(OpenAIEmbedder):
    """A self-hosted OpenAI-style server (LM Studio, vLLM, llama.cpp server); key optional."""

    provider = "openai-compatible"
    default_base = ""
    default_model = ""
    known_dims: ClassVar[Mapping[str, int]] = {}
    batch_tokens = None
    default_max_tokens = 8192
    needs_key = False

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
        payload = self._http.post("/embeddings", body)
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
        payload = self._http.post(path, body)
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
        payload = self._http.post("/api/embed", body)
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
