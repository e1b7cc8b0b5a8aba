"""The six remote providers (OpenAI, Gemini, Voyage, Mistral, Ollama, OpenAI-compatible servers)
and ``create_remote``, which builds one by name.

Each provider is its request and reply shapes and its limits; the batching, concurrency,
splitting and checking of replies they share is RemoteEmbedder's (memd/embed/remote.py). They
sit side by side here, apart from that machinery, so one provider's shape reads against the
others'.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from memd.config import EmbeddingConfig
from memd.embed.base import Embedder, Kind, Vectors
from memd.embed.remote import RemoteEmbedder, Sleep
from memd.embed.secrets import KEY_VARIABLES, Secret, load_api_key
from memd_client.errors import ConfigError, ProviderUnavailable

__all__ = [
    "PROVIDERS",
    "GeminiEmbedder",
    "MissingKey",
    "MistralEmbedder",
    "OllamaEmbedder",
    "OpenAICompatibleEmbedder",
    "OpenAIEmbedder",
    "VoyageEmbedder",
    "create_remote",
]


class MissingKey(ProviderUnavailable):
    """A remote provider with no API key configured; an automatic chain skips it."""


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
