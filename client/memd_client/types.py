"""The result maps of the daemon's methods, as TypedDicts (docs/protocol.md, "Methods").

They are plain dicts at run time, so indexing a result works as before; a type checker now
knows each key. A key the protocol documents and the daemon always sends is required; one it
sends only sometimes, or that docs/protocol.md calls informational, is ``NotRequired``. The
daemon may add keys: a client ignores those it does not know.

No ``from __future__ import annotations`` here: with string annotations, ``NotRequired`` is
not seen at run time and ``__required_keys__`` would list every key.

Over 400 lines: every result map of every method, which belong together as the protocol's
reference in code.
"""

from typing import Any, NotRequired, TypedDict

__all__ = [
    "AppendResult",
    "AppliedPromotion",
    "BatchJobStatus",
    "BatchesStatus",
    "ContextResult",
    "ContextSection",
    "DaemonStatus",
    "DreamResult",
    "DreamingStatus",
    "EmbedderStatus",
    "EmbeddingCosts",
    "ExplainedCandidate",
    "FlushPlan",
    "Freshness",
    "GetResult",
    "HelloResult",
    "IdentityStatus",
    "ModelPullStatus",
    "PromoteCandidate",
    "PromoteResult",
    "PromoteThresholds",
    "ProviderRequests",
    "ProviderStatus",
    "ProviderUsage",
    "RecallStoreCounts",
    "RecordRecallResult",
    "ReindexEstimate",
    "ReindexReport",
    "ReindexResult",
    "ScoreComponents",
    "SearchHit",
    "SearchResult",
    "SentCounts",
    "SkippedProvider",
    "Started",
    "StatusResult",
    "VectorStoreStatus",
    "WatcherStatus",
    "WorkspaceAddResult",
    "WorkspaceEntry",
    "WorkspaceListResult",
    "WorkspaceRemoveResult",
    "WorkspaceStatus",
]


class Freshness(TypedDict):
    """How far the index is behind the files when the call was answered."""

    generation: int
    pending_files: int
    unembedded_files: int
    skipped_files: int
    problems: list[str]
    watcher: str
    last_sync: float | None
    waited_ms: int
    fresh: bool
    rebuilding: NotRequired[bool]


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


# -- status --------------------------------------------------------------------------------------


class ReadersStatus(TypedDict):
    """The reader processes that run overlapping searches (``[search] reader_processes``)."""

    processes: int  # the most that may run (0: every search in the daemon)
    running: int
    busy: int
    pids: list[int]
    searches: int  # answered by a reader since the daemon started
    in_daemon: int  # run in the daemon (alone, or while a reader started)
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


# -- memory --------------------------------------------------------------------------------------


class SearchHit(TypedDict):
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    snippet_start_line: int
    match_lines: list[int]
    source: str
    vector_score: float
    text_score: float


class SearchResult(TypedDict):
    results: list[SearchHit]
    freshness: Freshness
    provider: str
    model: str
    mode: str
    note: str | None
    sources: NotRequired[list[str]]


# "from" is a keyword, so this one is spelled the functional way.
GetResult = TypedDict(
    "GetResult",
    {
        "path": str,
        "text": str,
        "from": int,
        "lines": int,
        "truncated": bool,
        "next_from": int | None,
        "missing": bool,
        "freshness": Freshness,
    },
)


class AppendResult(TypedDict):
    path: str
    start_line: int | None
    end_line: int | None
    written: bool
    note: str | None
    freshness: Freshness
    duplicate: NotRequired[bool]


class ContextSection(TypedDict):
    path: str
    title: str
    start_line: int
    end_line: int
    total_lines: int
    truncated: bool
    citation: str
    text: str


class ContextResult(TypedDict):
    text: str
    sections: list[ContextSection]
    date: str
    max_chars: int
    longterm: bool
    freshness: Freshness


class FlushPlan(TypedDict):
    soft_threshold_tokens: int
    force_flush_transcript_bytes: int
    relative_path: str
    date: str
    timezone: str
    silent_reply: str
    read_only: list[str]
    prompt: str
    system_prompt: str


class RecordRecallResult(TypedDict):
    recorded: int


# -- promotion -----------------------------------------------------------------------------------


class ScoreComponents(TypedDict):
    frequency: float
    relevance: float
    diversity: float
    recency: float
    consolidation: float
    conceptual: float
    phase_boost: float  # from Light and REM hits, added unweighted


class PromoteCandidate(TypedDict):
    key: str
    path: str
    start_line: int
    end_line: int
    snippet: str
    score: float
    components: ScoreComponents
    recall_count: int
    signal_count: int
    unique_queries: int
    recall_days: list[str]
    age_days: float
    promoted_at: str | None
    # Why REM surfaced it as a lasting fact (it then needs no recall statistics), or None.
    lasting: str | None


class ExplainedCandidate(PromoteCandidate):
    passes_thresholds: bool
    held_back: str | None  # why it does not pass (None when it does)


class AppliedPromotion(TypedDict):
    key: str
    path: str
    start_line: int
    end_line: int


class PromoteThresholds(TypedDict):
    min_score: float
    min_recall_count: int
    min_unique_queries: int
    limit: int
    max_age_days: NotRequired[float]
    half_life_days: NotRequired[float]


class PromoteResult(TypedDict):
    workspace: str
    entries: int
    thresholds: PromoteThresholds
    candidates: list[PromoteCandidate]
    applied: list[AppliedPromotion]  # written (empty without apply)
    # Without apply, when there are candidates: what a promotion that writes would write.
    would_apply: NotRequired[list[AppliedPromotion]]
    skipped: NotRequired[list[list[str]]]
    already_present: NotRequired[list[str]]
    dropped_sections: NotRequired[int]
    # With explain (None for an unknown key):
    explain: NotRequired[ExplainedCandidate | None]
    # For a caller that may not see the workspace's transcripts: how many items taken from
    # them the reply leaves out.
    withheld_from_transcripts: NotRequired[int]


class DreamGroup(TypedDict):
    """Entries that say one thing, led by ``key`` (staged by Light, or a REM truth)."""

    key: str
    snippet: str
    path: str
    start_line: int
    end_line: int
    average: float
    days: list[str]  # the days of the notes it was written on
    evidence: list[str]  # path:start-end of up to three of its entries
    merged: int
    merged_by_meaning: int


class DreamTruth(DreamGroup):
    confidence: float
    reason: str | None  # set for a lasting fact


class DreamTheme(TypedDict):
    tag: str
    strength: float
    count: int
    evidence: list[str]


class DreamLight(TypedDict):
    notes_read: list[str]
    messages_read: int
    snippets: int
    considered: int
    merged: int
    staged: list[DreamGroup]


class DreamRem(TypedDict):
    considered: int
    themes: list[DreamTheme]
    truths: list[DreamTruth]
    lasting: list[DreamTruth]
    grounded: int


class DreamCandidate(PromoteCandidate):
    why: str


class HeldBack(TypedDict):
    key: str
    path: str
    snippet: str
    score: float
    reason: str


class DreamDeep(TypedDict):
    candidates: list[DreamCandidate]
    held_back: list[HeldBack]
    applied: list[AppliedPromotion]  # written (empty in a preview)
    would_apply: NotRequired[list[AppliedPromotion]]  # a preview: what a run would write
    skipped: NotRequired[list[list[str]]]
    already_present: NotRequired[list[str]]
    dropped_sections: NotRequired[int]


class DreamResult(TypedDict):
    workspace: str
    at: str
    applied: bool
    phases: list[str]
    similarity: str  # "words", or "words and meaning (cosine >= T)"
    light: NotRequired[DreamLight]
    rem: NotRequired[DreamRem]
    deep: NotRequired[DreamDeep]
    meaning_failed: NotRequired[str]
    diary: NotRequired[dict[str, Any]]
    written: NotRequired[list[str]]
    # For a caller that may not see the workspace's transcripts: items left out.
    withheld_from_transcripts: NotRequired[int]


# -- indexing and workspaces ---------------------------------------------------------------------


class ReindexReport(TypedDict):
    workspace: str
    scanned: int
    indexed: int
    unchanged: int
    removed: int
    embedded: int
    pending_files: int
    rebuilt: bool
    errors: list[list[str]]
    seconds: float


class ReindexEstimate(TypedDict):
    """What a rebuild would send: ``texts`` distinct texts (chunks, and their lines when
    ``line_vectors``), of which ``cached`` are in the embedding cache and ``send_texts`` (about
    ``send_tokens`` tokens, in ``requests`` requests, or through the Batch API when ``batch``)
    would go to the provider."""

    workspace: str
    provider: str
    model: str
    files: int
    chunks: int
    texts: int
    line_vectors: bool
    cached: int
    send_texts: int
    send_tokens: int
    requests: int
    batch: bool


class ReindexResult(TypedDict, total=False):
    """``workspaces`` when the call waited, ``queued`` (the names) when it did not,
    ``estimates`` for a dry run."""

    workspaces: list[ReindexReport]
    queued: list[str]
    estimates: list[ReindexEstimate]


class WorkspaceEntry(TypedDict):
    """A registered workspace; ``sessions_dir`` and ``agent_id`` when transcripts are indexed."""

    name: str
    path: str
    extra_paths: list[str]
    sessions_dir: NotRequired[str]
    agent_id: NotRequired[str]


class WorkspaceAddResult(WorkspaceEntry):
    """The workspace as registered; ``added`` is false when the directory already was, and
    ``updated`` names the settings that call changed."""

    added: NotRequired[bool]
    updated: NotRequired[list[str]]


class WorkspaceRemoveResult(TypedDict):
    removed: bool


class WorkspaceListResult(TypedDict):
    workspaces: list[WorkspaceEntry]
    # Registered workspaces whose directory is not there (an unmounted drive), as registered.
    missing: NotRequired[list[dict[str, Any]]]
