"""The sections of memd's configuration: one frozen dataclass each, with its defaults and bounds.

Each section names what it sets and checks its own values (``validate``); how a file or a
``MEMD_*`` variable becomes these values is memd.config.parse's and memd.config.env's job, so
the types read alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from memd.config.errors import _check

SearchMode = Literal["hybrid", "keyword", "vector"]
ProviderName = Literal[
    "auto",
    "local",
    "openai",
    "gemini",
    "voyage",
    "mistral",
    "ollama",
    "openai-compatible",
    "fake",
    "none",
]


@dataclass(frozen=True)
class IndexConfig:
    """How files become chunks and rows."""

    chunk_tokens: int = 400
    chunk_overlap: int = 80
    max_file_bytes: int = 10 * 1024 * 1024
    # Redact secrets (API keys, tokens, passwords, private keys) before text is indexed.
    redact: bool = True
    # Keep vectors in sqlite-vec and search them with its exact scan (110 ms at 100,000 chunks).
    # False (the default): a plain table, searched through an in-memory sketch of every vector
    # (memd/index/sketch.py; 15 ms at 100,000 chunks, the same top ten).
    sqlite_vec: bool = False
    # Index DREAMS.md, the dream diary (it is written for people to read, not to be searched).
    diary: bool = False
    # A vector for each line of a chunk besides the chunk's own (memd/index/chunk.py), whatever
    # the provider: with a paid API they cost 80-100% more tokens (cents a year of notes) and
    # lift hybrid R@1 on LoCoMo from below keyword search to above it (docs/benchmarks.md).
    # False halves what a first index sends.
    line_vectors: bool = True

    def validate(self) -> None:
        _check(1 <= self.chunk_tokens <= 8192, "index.chunk_tokens", "must be from 1 to 8192")
        _check(
            0 <= self.chunk_overlap < self.chunk_tokens,
            "index.chunk_overlap",
            "must be at least 0 and below index.chunk_tokens",
        )
        _check(
            1 <= self.max_file_bytes <= 1 << 30, "index.max_file_bytes", "must be from 1 to 1 GiB"
        )


def _default_readers() -> int:
    cores = os.cpu_count() or 1
    return min(4, cores) if cores > 1 else 0


@dataclass(frozen=True)
class SearchConfig:
    """Search defaults (OpenClaw's), each overridable per request where it makes sense."""

    mode: SearchMode = "hybrid"
    max_results: int = 6
    min_score: float = 0.35
    # The weights of the two halves of a hybrid score (memd.search.fusion._merge). OpenClaw's
    # 0.7 vector / 0.3 text ranked below keyword-only search on LoCoMo; keyword 0.7 with the
    # line-aware vector half 0.3 was best on the tuning conversations and held on the others
    # (docs/benchmarks.md).
    vector_weight: float = 0.3
    text_weight: float = 0.7
    candidate_multiplier: int = 4
    snippet_chars: int = 700
    decay: bool = False
    half_life_days: float = 30.0
    mmr: bool = False
    mmr_lambda: float = 0.7
    # Processes that run searches when several overlap (memd/readers): one per core, at most
    # four; 0 runs every search in the daemon.
    reader_processes: int = field(default_factory=_default_readers)

    def validate(self) -> None:
        _check(1 <= self.max_results <= 100, "search.max_results", "must be from 1 to 100")
        _check(0 <= self.reader_processes <= 16, "search.reader_processes", "must be 0 to 16")
        _check(0.0 <= self.min_score <= 1.0, "search.min_score", "must be from 0 to 1")
        _check(0 <= self.vector_weight <= 1000, "search.vector_weight", "must be from 0 to 1000")
        _check(0 <= self.text_weight <= 1000, "search.text_weight", "must be from 0 to 1000")
        _check(
            1 <= self.candidate_multiplier <= 20, "search.candidate_multiplier", "must be 1 to 20"
        )
        _check(16 <= self.snippet_chars <= 100_000, "search.snippet_chars", "must be 16 to 100000")
        _check(
            1 <= self.half_life_days <= 36_500, "search.half_life_days", "must be from 1 to 36500"
        )
        _check(0.0 <= self.mmr_lambda <= 1.0, "search.mmr_lambda", "must be from 0 to 1")


@dataclass(frozen=True)
class EmbeddingConfig:
    """Which embedding provider to use; ``auto`` walks local, then remote, then keyword-only."""

    provider: ProviderName = "auto"
    fallback: ProviderName = "none"
    # Model name for remote providers (empty: the provider's default).
    model: str = ""
    # A GGUF file for the local provider (also MEMD_LOCAL_MODEL); empty: look in the model dir.
    model_path: str = ""
    # With llama-cpp-python installed and no model anywhere, the daemon downloads pull_uri
    # (empty: the recommended multilingual-e5-small) into the model dir in the background on
    # its first start, searching by keyword meanwhile. On by default: installing the `local`
    # extra is asking for local vectors (as OpenClaw fetches its default model on first use);
    # false: never download, `memctl model pull` does it by hand.
    auto_pull: bool = True
    pull_uri: str = ""
    # llama.cpp threads for documents (0: half the cores, at least 1; a query, which a search waits
    # for, then takes every core; a number set here holds for queries too) and texts per call.
    threads: int = 0
    batch_size: int = 32
    # Override the per-model query/document prefixes (empty: from the table keyed by GGUF name).
    query_prefix: str = ""
    document_prefix: str = ""
    cache_max_entries: int = 0
    # Remote providers: an explicit server (OpenAI-compatible, Ollama), a 0600 key file,
    # requested output dimensions (0: the model's default), timeouts and retries.
    base_url: str = ""
    api_key_file: str = ""
    dimensions: int = 0
    timeout_seconds: float = 60.0
    max_retries: int = 3
    # Requests in flight at once and tokens per request (0: 4 and 8192 for the cloud APIs; 1
    # and 256 for Ollama and servers of your own, which compute one request at a time).
    concurrency: int = 0
    request_tokens: int = 0
    # OpenAI's Batch API (half the price, results within 24 h) for a first index or a rebuild
    # that would send at least batch_min_tokens: "auto" uses it there, "off" never.
    batch_api: Literal["auto", "off"] = "auto"
    batch_min_tokens: int = 1_000_000
    batch_poll_seconds: float = 60.0

    def validate(self) -> None:
        _check(0 <= self.threads <= 256, "embedding.threads", "must be from 0 (automatic) to 256")
        _check(1 <= self.batch_size <= 4096, "embedding.batch_size", "must be from 1 to 4096")
        _check(
            0 <= self.cache_max_entries <= 10**9,
            "embedding.cache_max_entries",
            "must be from 0 to 1000000000",
        )
        _check(0 <= self.dimensions <= 65_536, "embedding.dimensions", "must be from 0 to 65536")
        _check(
            0 < self.timeout_seconds <= 3600, "embedding.timeout_seconds", "must be over 0, to 3600"
        )
        _check(0 <= self.max_retries <= 10, "embedding.max_retries", "must be from 0 to 10")
        _check(0 <= self.concurrency <= 64, "embedding.concurrency", "must be from 0 to 64")
        _check(
            0 <= self.request_tokens <= 1_000_000,
            "embedding.request_tokens",
            "must be from 0 (automatic) to 1000000",
        )
        _check(
            1 <= self.batch_min_tokens <= 10**12,
            "embedding.batch_min_tokens",
            "must be at least 1",
        )
        _check(
            1 <= self.batch_poll_seconds <= 86_400,
            "embedding.batch_poll_seconds",
            "must be from 1 to 86400",
        )


@dataclass(frozen=True)
class WatchConfig:
    """File watching and reconciliation."""

    debounce_ms: int = 1500
    reconcile_seconds: int = 300

    def validate(self) -> None:
        _check(0 <= self.debounce_ms <= 600_000, "watch.debounce_ms", "must be from 0 to 600000")
        _check(
            1 <= self.reconcile_seconds <= 7 * 86_400,
            "watch.reconcile_seconds",
            "must be from 1 to 604800 (a week)",
        )


@dataclass(frozen=True)
class GetConfig:
    """Limits of ``get``."""

    default_lines: int = 120
    max_chars: int = 12_000

    def validate(self) -> None:
        _check(1 <= self.default_lines <= 10_000, "get.default_lines", "must be from 1 to 10000")
        _check(100 <= self.max_chars <= 10_000_000, "get.max_chars", "must be from 100 to 10000000")


@dataclass(frozen=True)
class DreamingConfig:
    """Recall tracking and the promotion of short-term memories into MEMORY.md."""

    # Record which daily-log results each search returned (the input of promotion).
    record_recalls: bool = True
    # Run promotion on a schedule (a cron expression in the user's time zone).
    enabled: bool = False
    schedule: str = "0 3 * * *"
    # Keep MEMORY.md under this many characters by dropping the oldest promoted sections.
    memory_max_chars: int = 10_000
    # Keep DREAMS.md (the dream diary) under this many characters by dropping its oldest
    # entries that nobody edited.
    diary_max_chars: int = 20_000

    def validate(self) -> None:
        from croniter import croniter

        _check(
            croniter.is_valid(self.schedule), "dreaming.schedule", "is not a valid cron expression"
        )
        _check(
            0 <= self.memory_max_chars <= 100_000_000,
            "dreaming.memory_max_chars",
            "must be from 0 to 100000000",
        )
        _check(
            0 <= self.diary_max_chars <= 100_000_000,
            "dreaming.diary_max_chars",
            "must be from 0 to 100000000",
        )


@dataclass(frozen=True)
class WorkspaceConfig:
    """A workspace named in the configuration file."""

    path: str
    name: str = ""
    extra_paths: tuple[str, ...] = ()
    # A folder of the agent's session transcripts (*.jsonl) to index as source "sessions",
    # and the agent they belong to (only callers of that agent see them; default: the name).
    sessions_dir: str = ""
    agent_id: str = ""


@dataclass(frozen=True)
class SessionsConfig:
    """When transcripts are reindexed: after this much growth, or once they go quiet."""

    delta_bytes: int = 100_000
    delta_messages: int = 50
    idle_seconds: int = 600
    check_seconds: float = 5.0

    def validate(self) -> None:
        _check(
            1 <= self.idle_seconds <= 30 * 86_400, "sessions.idle_seconds", "must be 1 to 2592000"
        )
        _check(0 < self.check_seconds <= 3600, "sessions.check_seconds", "must be over 0, to 3600")
        _check(1 <= self.delta_bytes <= 1 << 40, "sessions.delta_bytes", "must be from 1 to 1 TiB")
        _check(
            1 <= self.delta_messages <= 10**9, "sessions.delta_messages", "must be 1 to 1000000000"
        )


@dataclass(frozen=True)
class ScopeRule:
    """Which sources a caller may search: the first rule matching the caller decides."""

    action: Literal["allow", "deny"]
    # Match fields (every one given must match; empty matches anything).
    chat_type: str = ""
    channel: str = ""
    key_prefix: str = ""
    # What the rule is about: "longterm" (MEMORY.md / memory.md), "memory" (all memory files),
    # "sessions" (transcripts).
    sources: tuple[str, ...] = ("longterm", "memory", "sessions")
