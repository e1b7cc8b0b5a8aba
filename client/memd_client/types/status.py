"""The result maps of hello and status: how the daemon was started, what it embeds with, and
the state of each workspace, of the remote providers and of the reader processes.

Its own module: one family of methods, as the daemon groups them (memd/ipc/); memd_client.types
imports every name from here.

No ``from __future__ import annotations`` here (see memd_client.types).
"""

from typing import Any, NotRequired, TypedDict

from memd_client.types.memory import Freshness


class Started(TypedDict):
    """How the daemon was started: ``how`` is "socket activation", "service", "on demand" (a
    client started it) or "by hand"; ``by`` the manager or client (None by hand)."""

    how: str
    by: str | None
    idle_exit_s: NotRequired[float]  # a socket-activated memd stops after this long idle


class EmbedderStatus(TypedDict):
    """What the daemon embeds with, whatever the workspaces: ``active`` "none" is keyword-only,
    and ``reason`` then says why."""

    active: str
    model: str
    dims: int
    reason: NotRequired[str]


class ModelPullStatus(TypedDict):
    """The model the daemon fetches in the background (``[embedding] auto_pull``): ``state``
    is "downloading", "loading", "done", "failed" (``next_try``: when it is tried again) or
    "stopped"; ``done`` of ``total`` bytes."""

    uri: str
    state: str
    done: int
    total: int | None
    error: str | None
    path: str | None
    next_try: float | None


class HelloResult(TypedDict):
    protocol: int
    server: str
    version: str
    pid: int
    methods: list[str]
    started: NotRequired[Started]


class ReadersStatus(TypedDict):
    """The reader processes that run overlapping searches (``[search] reader_processes``)."""

    processes: int  # the most that may run (0: every search in the daemon)
    running: int
    busy: int
    pids: list[int]
    searches: int  # answered by a reader since the daemon started
    in_daemon: int  # run in the daemon (alone, or while a reader started)
    ranked_by_daemon: int  # readers' keyword rankings done by the daemon's postings
    waited_out: int  # run in the daemon after 50 ms in which no busy reader came back
    deaths: int
    last_exit: str | None  # how the last reader that died ended ("SIGKILL", "exit 1")
    error: str | None  # why readers are no longer used, after repeated deaths


class DaemonStatus(TypedDict):
    pid: int
    version: str
    started_at: float
    uptime_s: float
    rss_bytes: int
    sqlite_memory_bytes: int
    cpu_percent: float
    threads: int
    blas_threads: int | None  # threads numpy's BLAS may use in the daemon (1; None: no BLAS)
    readers: ReadersStatus | None  # None: the service runs without a daemon
    connections: int
    socket: str
    started: NotRequired[Started]
    embedder: NotRequired[EmbedderStatus]
    model_pull: NotRequired[ModelPullStatus | None]
    missing_workspaces: NotRequired[list[str]]


class SkippedProvider(TypedDict):
    provider: str
    reason: str


class ProviderStatus(TypedDict):
    requested: str
    active: str
    model: str
    dims: int
    skipped: list[SkippedProvider]
    last_error: str | None
    worker: NotRequired[dict[str, Any] | None]
    line_vectors: NotRequired[bool]  # whether each line of a chunk gets a vector too


class VectorStoreStatus(TypedDict):
    kind: str
    sqlite_vec: bool
    sqlite_vec_version: str | None
    reason: str | None


class IdentityStatus(TypedDict):
    """``state`` says whether the index matches the configured model and chunking; the other
    keys are the stored identity's, absent when there is none."""

    state: str
    reason: str | None
    provider: NotRequired[str]
    model: NotRequired[str]
    settings_key: NotRequired[str]
    dims: NotRequired[int]
    vector_store: NotRequired[str]
    chunk_tokens: NotRequired[int]
    chunk_overlap: NotRequired[int]
    max_tokens: NotRequired[int]
    redact: NotRequired[bool]
    chunker: NotRequired[int]
    lines: NotRequired[int]
    fts: NotRequired[str]
    schema: NotRequired[int]


class WatcherStatus(TypedDict):
    state: str
    backend: str | None
    reason: str | None
    pending: NotRequired[int]
    pending_keys: NotRequired[list[str]]  # the changed paths waiting for the debounce
    rescan_pending: NotRequired[bool]  # a rescan of the whole workspace waits for it too
    restarts: NotRequired[int]
    last_event_at: NotRequired[float | None]
    rescan_at: NotRequired[float | None]  # when a rescan was last asked for
    probe_error: NotRequired[str | None]  # why no change probe runs (replies need wait_ms)


class RecallStoreCounts(TypedDict, total=False):
    """The recall store's counts, or only ``error`` when the store cannot be read."""

    entries: int
    promoted: int
    concept_tagged: int
    spaced: int
    error: str


class DreamingStatus(TypedDict):
    recall_store: RecallStoreCounts
    # When each phase ("light", "rem", "deep") last ran with apply, and its tally.
    last_runs: dict[str, dict[str, Any]]
    enabled: bool
    next_run: str | None


class WorkspaceStatus(TypedDict):
    workspace: str
    root: str
    files_on_disk: int  # memory files and session transcripts
    files_indexed: int
    files_pending: int
    chunks: int
    vectors: int
    dirty: bool
    provider: ProviderStatus
    vector_store: VectorStoreStatus
    identity: IdentityStatus
    freshness: Freshness
    watcher: WatcherStatus
    last_sync: float | None
    cache_entries: int
    dreaming: DreamingStatus
    # Informational (docs/protocol.md: "treat them as unstable").
    index_path: NotRequired[str]
    index_bytes: NotRequired[int]
    generation: NotRequired[int]
    files_stale: NotRequired[int]
    files_skipped: NotRequired[list[dict[str, str]]]
    file_errors: NotRequired[dict[str, str]]
    fts: NotRequired[dict[str, Any]]
    sources: NotRequired[dict[str, dict[str, int]]]
    vectors_match_chunks: NotRequired[bool]
    checked_at: NotRequired[float]
    rebuilding: NotRequired[bool]
    progress: NotRequired[dict[str, Any] | None]
    transcripts: NotRequired[dict[str, int]]  # on_disk, indexed: among the counts above


class ProviderRequests(TypedDict):
    """How a remote provider is asked: ``kind`` "cloud" (a paid API) or "server" (Ollama, a
    server of your own); ``held_s``: seconds it is not asked for, after a rate limit."""

    kind: str
    concurrency: int
    inputs_per_request: int
    tokens_per_request: int
    held_s: float


class SentCounts(TypedDict):
    texts: int
    tokens: int
    requests: int


class ProviderUsage(TypedDict):
    """What was sent to one provider (``"<provider> batch"``: through its Batch API)."""

    today: SentCounts
    total: SentCounts


class BatchJobStatus(TypedDict):
    id: str
    status: str  # the provider's: validating, in_progress, finalizing, completed, failed, ...
    requests: int
    completed: int
    failed: int
    texts: int
    tokens: int
    age_s: float


class BatchesStatus(TypedDict):
    min_tokens: int  # a first index or rebuild that would send this many goes as a batch
    jobs: list[BatchJobStatus]
    last: dict[str, Any] | None  # the last batch that finished: id, status, vectors, error


class EmbeddingCosts(TypedDict):
    requests: ProviderRequests | None  # None: no remote provider
    usage: dict[str, ProviderUsage]
    batches: BatchesStatus | None  # None: no Batch API (another provider, or switched off)


class StatusResult(TypedDict):
    daemon: DaemonStatus
    workspaces: list[WorkspaceStatus]
    embedding: NotRequired[EmbeddingCosts]
