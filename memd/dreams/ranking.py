"""Ranking of recall-store entries for promotion: OpenClaw's six weighted signals and the
manual and scheduled thresholds."""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from memd.dreams.lasting import lasting_reason
from memd.dreams.phases import PhaseHits, phase_boost
from memd.dreams.recall_entry import RecallEntry, parse_time
from memd.dreams.recall_text import is_promotable, is_short_term

__all__ = [
    "MANUAL",
    "SCHEDULED",
    "WEIGHTS",
    "Candidate",
    "Thresholds",
    "consolidation",
    "rank",
    "score_all",
    "score_entry",
    "verdict",
]

logger = logging.getLogger(__name__)

# Already normalised (they sum to 1). The phase boost from Light and REM hits
# (memd/dreams/phases.py) is added on top, unweighted, as OpenClaw adds it.
WEIGHTS: dict[str, float] = {
    "frequency": 0.24,
    "relevance": 0.30,
    "diversity": 0.15,
    "recency": 0.15,
    "consolidation": 0.10,
    "conceptual": 0.06,
}
_DAY_S = 86_400.0


@dataclass(frozen=True)
class Thresholds:
    """What an entry needs to be promoted; ``max_age_days < 0`` disables the age limit."""

    min_score: float
    min_recall_count: int
    min_unique_queries: int
    limit: int = 10
    max_age_days: float = 30.0
    half_life_days: float = 14.0


MANUAL = Thresholds(0.75, 3, 2)
SCHEDULED = Thresholds(0.8, 3, 3)


@dataclass
class Candidate:
    """An entry with its score and the components that made it."""

    entry: RecallEntry
    score: float
    components: dict[str, float]
    signal_count: int
    unique_queries: int
    age_days: float
    # Why REM surfaced it as a lasting fact (memd/dreams/lasting.py); such an entry does not
    # need the recall statistics (count, distinct queries, score) to be promoted.
    lasting: str | None = None


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def _parse_day(day: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(day)
    except ValueError:
        return None


def consolidation(recall_days: Sequence[str], grounded_count: int = 0) -> float:
    """Spaced repetition: more distinct days over a longer span (a week saturates) scores higher."""
    days = sorted({d for d in map(_parse_day, recall_days) if d is not None})
    if not days:
        spacing = 0.0
    elif len(days) == 1:
        spacing = 0.2
    else:
        n = len(days)
        span = (days[-1] - days[0]).days
        spacing = _clamp(
            0.55 * _clamp(math.log(1 + (n - 1)) / math.log(5)) + 0.45 * _clamp(span / 7)
        )
    return max(spacing, _clamp(grounded_count / 3))


def _age_days(entry: RecallEntry, now: dt.datetime) -> float:
    """Days since the last recall; 0 when the timestamp does not parse (as OpenClaw does)."""
    last = parse_time(entry.last_recalled_at)
    return 0.0 if last is None else max(0.0, (now - last).total_seconds() / _DAY_S)


def score_entry(
    entry: RecallEntry,
    now: dt.datetime,
    *,
    half_life_days: float = 14.0,
    phases: PhaseHits | None = None,
) -> Candidate:
    """Score one entry without applying any threshold: the six weighted signals, plus the
    boost of its Light and REM hits (``components["phase_boost"]``, not weighted)."""
    signals = entry.recall_count + entry.daily_count + entry.grounded_count
    diversity = max(len(entry.query_hashes), len(entry.recall_days))
    age = _age_days(entry, now)
    decay = math.log(2) / half_life_days if half_life_days > 0 else 0.0
    components = {
        "frequency": _clamp(math.log(1 + signals) / math.log(11)),
        "relevance": _clamp(entry.total_score / max(1, signals)),
        "diversity": _clamp(diversity / 5),
        "recency": math.exp(-decay * age),
        "consolidation": consolidation(entry.recall_days, entry.grounded_count),
        "conceptual": _clamp(len(entry.concept_tags) / 6),
    }
    score = sum(WEIGHTS[name] * value for name, value in components.items())
    boost = phase_boost(phases, now)
    components["phase_boost"] = boost
    return Candidate(entry, _clamp(score + boost), components, signals, diversity, age)


def verdict(c: Candidate, thresholds: Thresholds) -> str | None:
    """Why ``c`` is held back under ``thresholds`` (None: it passes)."""
    if thresholds.max_age_days >= 0 and c.age_days > thresholds.max_age_days:
        return f"last seen {c.age_days:.0f} days ago (at most {thresholds.max_age_days:g})"
    if c.lasting is not None:
        return None  # REM surfaced it as lasting: the statistics do not decide
    if c.signal_count == 0 or c.signal_count < thresholds.min_recall_count:
        return f"{c.signal_count} signals (needs {thresholds.min_recall_count})"
    if c.unique_queries < thresholds.min_unique_queries:
        return (
            f"{c.unique_queries} distinct queries or days (needs {thresholds.min_unique_queries})"
        )
    if c.score < thresholds.min_score:
        return f"score {c.score:.3f} (needs {thresholds.min_score:g})"
    return None


def score_all(
    entries: Iterable[RecallEntry],
    thresholds: Thresholds,
    now: dt.datetime,
    *,
    include_promoted: bool = False,
    phases: Mapping[str, PhaseHits] | None = None,
) -> list[Candidate]:
    """Every promotable short-term entry scored, best first, no threshold applied. An entry
    REM surfaced as a lasting fact (a REM hit, and a lasting phrase) carries its reason."""
    out: list[Candidate] = []
    for entry in entries:
        if entry.source != "memory" or not is_short_term(entry.path):
            continue
        if not is_promotable(entry.snippet):
            continue
        if entry.promoted_at is not None and not include_promoted:
            continue
        hits = (phases or {}).get(entry.key)
        c = score_entry(entry, now, half_life_days=thresholds.half_life_days, phases=hits)
        if hits is not None and hits.rem_hits > 0:
            c.lasting = lasting_reason(entry.snippet)
        out.append(c)
    out.sort(key=lambda c: (-c.score, -c.entry.recall_count, c.entry.path))
    return out


def rank(
    entries: Iterable[RecallEntry],
    thresholds: Thresholds,
    now: dt.datetime,
    *,
    include_promoted: bool = False,
    phases: Mapping[str, PhaseHits] | None = None,
) -> list[Candidate]:
    """The entries that pass ``thresholds``, best first, at most ``thresholds.limit``;
    ``phases`` are the phase signals by entry key (memd/dreams/phases.py)."""
    scored = score_all(entries, thresholds, now, include_promoted=include_promoted, phases=phases)
    return [c for c in scored if verdict(c, thresholds) is None][: max(0, thresholds.limit)]
