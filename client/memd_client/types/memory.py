"""The result maps of the memory methods: search, get, append, context, flush_plan, record_recall,
and ``Freshness`` (how far the index was behind), which their replies and a workspace's status
carry.

Its own module: one family of methods, as the daemon groups them (memd/ipc/); memd_client.types
imports every name from here.

No ``from __future__ import annotations`` here (see memd_client.types).
"""

from typing import NotRequired, TypedDict


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
