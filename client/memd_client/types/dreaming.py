"""The result maps of promote and dream: candidates and their scores, what was promoted or held
back, and what each dreaming phase found.

Its own module: one family of methods, as the daemon groups them (memd/ipc/); memd_client.types
imports every name from here.

No ``from __future__ import annotations`` here (see memd_client.types).
"""

from typing import Any, NotRequired, TypedDict


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
