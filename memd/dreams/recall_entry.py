"""One entry of the recall store (:class:`RecallEntry`): its JSON form as OpenClaw names it,
the checks that drop an invalid one, its caps, and the store's timestamps.

Its own module: what dreaming ranks, stages and promotes is these entries (memd/dreams/light.py,
rem.py, ranking.py, promote.py), whatever store file they came from.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from memd.dreams.recall_text import (
    DAY,
    MAX_CONCEPT_TAGS,
    collapse,
    concept_tags,
    is_promotable,
    is_short_term,
)

__all__ = [
    "MAX_QUERY_HASHES",
    "MAX_RECALL_DAYS",
    "RecallEntry",
    "entry_key",
    "is_int",
    "is_num",
    "iso_time",
    "merged_entry",
    "parse_time",
    "recent_distinct",
]

MAX_QUERY_HASHES = 32
MAX_RECALL_DAYS = 16


def entry_key(path: str, start_line: int, end_line: int) -> str:
    return f"memory:{path}:{start_line}:{end_line}"


def iso_time(moment: dt.datetime) -> str:
    """A JavaScript-style UTC timestamp: ``2026-04-01T12:00:00.000Z``."""
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(stamp: str | None) -> dt.datetime | None:
    """A timestamp of the stores (``iso_time``'s, or any ISO form; UTC when it names no zone),
    or None when there is none or it does not parse."""
    if not stamp:
        return None
    try:
        moment = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def recent_distinct(items: Sequence[str], new: str | None, cap: int) -> list[str]:
    """Distinct items in order, ``new`` moved to the end, keeping the last ``cap``."""
    out: list[str] = []
    for item in [*items, *([new] if new is not None else [])]:
        if item in out:
            out.remove(item)
        out.append(item)
    return out[-cap:]


def merged_entry(current: RecallEntry, archived: RecallEntry) -> RecallEntry:
    """One entry from two stores that counted different times (an archive, then a new store)."""
    first = min(filter(None, (current.first_recalled_at, archived.first_recalled_at)), default="")
    return dataclasses.replace(
        current,
        recall_count=current.recall_count + archived.recall_count,
        daily_count=current.daily_count + archived.daily_count,
        grounded_count=current.grounded_count + archived.grounded_count,
        total_score=current.total_score + archived.total_score,
        max_score=max(current.max_score, archived.max_score),
        first_recalled_at=first,
        last_recalled_at=max(current.last_recalled_at, archived.last_recalled_at),
        query_hashes=recent_distinct(
            [*archived.query_hashes, *current.query_hashes], None, MAX_QUERY_HASHES
        ),
        recall_days=sorted({*archived.recall_days, *current.recall_days})[-MAX_RECALL_DAYS:],
        promoted_at=current.promoted_at or archived.promoted_at,
    )


@dataclass
class RecallEntry:
    """One tracked line range of a daily note; JSON keys are OpenClaw's camelCase names."""

    key: str
    path: str
    start_line: int
    end_line: int
    snippet: str
    source: str = "memory"
    recall_count: int = 0
    daily_count: int = 0
    grounded_count: int = 0
    total_score: float = 0.0
    max_score: float = 0.0
    first_recalled_at: str = ""
    last_recalled_at: str = ""
    query_hashes: list[str] = field(default_factory=list)
    recall_days: list[str] = field(default_factory=list)
    concept_tags: list[str] = field(default_factory=list)
    claim_hash: str | None = None
    promoted_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "path": self.path,
            "startLine": self.start_line,
            "endLine": self.end_line,
            "source": self.source,
            "snippet": self.snippet,
            "recallCount": self.recall_count,
            "dailyCount": self.daily_count,
            "groundedCount": self.grounded_count,
            "totalScore": self.total_score,
            "maxScore": self.max_score,
            "firstRecalledAt": self.first_recalled_at,
            "lastRecalledAt": self.last_recalled_at,
            "queryHashes": list(self.query_hashes),
            "recallDays": list(self.recall_days),
            "conceptTags": list(self.concept_tags),
        }
        if self.claim_hash is not None:
            out["claimHash"] = self.claim_hash
        if self.promoted_at is not None:
            out["promotedAt"] = self.promoted_at
        return out

    @classmethod
    def from_json(cls, raw: Any, key: str | None = None) -> RecallEntry | None:
        """Parse and normalise one stored entry; None when it is invalid (the store drops it)."""
        if not isinstance(raw, Mapping):
            return None
        path, snippet, source = raw.get("path"), raw.get("snippet"), raw.get("source", "memory")
        start, end = raw.get("startLine"), raw.get("endLine")
        if not isinstance(path, str) or not is_short_term(path) or source != "memory":
            return None
        if not is_int(start) or not is_int(end) or not 1 <= start <= end:
            return None
        if not isinstance(snippet, str) or not is_promotable(snippet):
            return None
        counts = [raw.get(k, 0) for k in ("recallCount", "dailyCount", "groundedCount")]
        scores = [raw.get(k, 0.0) for k in ("totalScore", "maxScore")]
        if not all(is_int(c) and c >= 0 for c in counts):
            return None
        if not all(is_num(s) and s >= 0 for s in scores):
            return None
        stored_key = raw.get("key")
        tags = strs(raw.get("conceptTags"))[:MAX_CONCEPT_TAGS] or concept_tags(path, snippet)
        return cls(
            key=stored_key if isinstance(stored_key, str) and stored_key else key or "",
            path=path,
            start_line=start,
            end_line=end,
            snippet=collapse(snippet),
            recall_count=counts[0],
            daily_count=counts[1],
            grounded_count=counts[2],
            total_score=float(scores[0]),
            max_score=float(scores[1]),
            first_recalled_at=opt_str(raw.get("firstRecalledAt")) or "",
            last_recalled_at=opt_str(raw.get("lastRecalledAt")) or "",
            query_hashes=recent_distinct(strs(raw.get("queryHashes")), None, MAX_QUERY_HASHES),
            recall_days=sorted(set(filter(DAY.fullmatch, strs(raw.get("recallDays")))))[
                -MAX_RECALL_DAYS:
            ],
            concept_tags=tags,
            claim_hash=opt_str(raw.get("claimHash")),
            promoted_at=opt_str(raw.get("promotedAt")),
        )


def is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def strs(v: Any) -> list[str]:
    return [s for s in v if isinstance(s, str)] if isinstance(v, list) else []


def opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
