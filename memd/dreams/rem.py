"""The REM phase of dreaming: recurring themes, candidate truths and lasting facts, from the
short-term memories of the last week, with no language model.

As OpenClaw does it: a theme is a concept tag carried by many of the entries, its strength
``min(1, count / entries × 2)``, kept at 0.75 or more; a candidate truth is a group of entries
that say the same thing (merged at Jaccard 0.88), with

    confidence = avgScore·0.45 + recallStrength·0.25 + consolidation·0.20 + conceptual·0.10
    recallStrength = min(1, ln(1+recallCount)/ln 7)     consolidation = min(1, recallDays/3)
    conceptual = min(1, conceptTags/6)

kept at 0.45 or more, at most three. The entries Light staged since the last REM run are the
ones considered when there are any.

Beyond OpenClaw:
- A claim's earlier mentions are gathered from the whole daily-ingestion window (14 days), not
  only the week REM looks at, and by meaning as well as by words (memd/dreams/similar.py).
- A truth written on several days is *grounded*: its entry is credited one "grounded" signal
  per other day (query ``__dreaming_grounded__:<day>``, that day as its bucket, counted once per
  day however often REM runs), which is what lets a line nobody searched for reach MEMORY.md.
- Lasting facts (memd/dreams/lasting.py) are surfaced with their reason whatever their numbers.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memd.dreams.lasting import lasting_reason
from memd.dreams.light import DAILY_LOOKBACK_DAYS, entry_within
from memd.dreams.phases import PhaseHits
from memd.dreams.recall_entry import RecallEntry
from memd.dreams.recall_store import RecallStore
from memd.dreams.similar import Group, Meaning, average_score, dedupe, note_day

__all__ = [
    "GROUNDED_QUERY",
    "Reflection",
    "RemSettings",
    "Theme",
    "Truth",
    "confidence",
    "ground",
    "reflect",
    "staged_keys",
    "themes",
]

GROUNDED_QUERY = "__dreaming_grounded__:{day}"
TRUTH_SIMILARITY = 0.88
MIN_CONFIDENCE = 0.45
MAX_TRUTHS = 3


@dataclass(frozen=True)
class RemSettings:
    """OpenClaw's REM defaults."""

    lookback_days: int = 7
    limit: int = 10
    min_pattern_strength: float = 0.75


@dataclass(frozen=True)
class Theme:
    tag: str
    strength: float
    count: int
    evidence: tuple[str, ...]


@dataclass
class Truth:
    """A candidate truth, or (with ``reason``) a lasting fact."""

    group: Group
    confidence: float
    reason: str | None = None

    @property
    def key(self) -> str:
        return self.group.entry.key


def confidence(group: Group) -> float:
    """OpenClaw's candidate-truth confidence of a group (see the module docstring)."""
    e = group.entry
    recall = min(1.0, math.log1p(e.recall_count) / math.log1p(6))
    consolidation = min(1.0, len(e.recall_days) / 3)
    conceptual = min(1.0, len(e.concept_tags) / 6)
    value = group.average * 0.45 + recall * 0.25 + consolidation * 0.2 + conceptual * 0.1
    return max(0.0, min(1.0, value))


def themes(entries: Sequence[RecallEntry], settings: RemSettings) -> list[Theme]:
    """The concept tags that keep coming back, strongest first, at most ``limit``."""
    stats: dict[str, tuple[int, list[str]]] = {}
    for e in entries:
        for tag in dict.fromkeys(t.strip().lower() for t in e.concept_tags):
            if not tag:
                continue
            count, evidence = stats.get(tag, (0, []))
            ref = f"{e.path}:{e.start_line}-{e.end_line}"
            stats[tag] = (count + 1, evidence if ref in evidence else [*evidence, ref])
    found = [
        Theme(tag, min(1.0, count / max(1, len(entries)) * 2), count, tuple(evidence[:3]))
        for tag, (count, evidence) in stats.items()
    ]
    found = [t for t in found if t.strength >= settings.min_pattern_strength]
    found.sort(key=lambda t: (-t.strength, -t.count, t.tag))
    return found[: max(0, settings.limit)]


def staged_keys(phases: Mapping[str, PhaseHits]) -> set[str]:
    """The entries Light staged after REM last looked at them (OpenClaw's readLightStagedKeys)."""
    return {
        key
        for key, h in phases.items()
        if h.light_hits > 0 and (h.last_light_at or "") > (h.last_rem_at or "")
    }


@dataclass
class Reflection:
    entries: int
    themes: list[Theme]
    truths: list[Truth]
    lasting: list[Truth]


def reflect(
    all_entries: Mapping[str, RecallEntry],
    phases: Mapping[str, PhaseHits],
    now: dt.datetime,
    settings: RemSettings,
    *,
    meaning: Meaning | None = None,
) -> Reflection:
    """Themes, candidate truths and lasting facts of the entries of the last week."""
    window = [e for e in all_entries.values() if entry_within(e, now, DAILY_LOOKBACK_DAYS)]
    # The newest note first: a claim's group is led by its latest mention, and stays so.
    window.sort(key=lambda e: (note_day(e), e.recall_count, e.key), reverse=True)
    recent = {e.key for e in window if entry_within(e, now, settings.lookback_days)}
    staged = staged_keys(phases) & recent
    considered = staged or recent
    groups = dedupe(window, TRUTH_SIMILARITY, meaning=meaning)
    groups = [
        g
        for g in groups
        if any(k in considered for k in g.keys)  # REM's week (or what Light staged)
        and all(m.promoted_at is None for m in g.members)  # already in MEMORY.md
    ]
    members = [all_entries[k] for k in considered]
    scored = [Truth(g, confidence(g)) for g in groups]
    chosen = [t for t in scored if t.confidence >= MIN_CONFIDENCE]
    chosen.sort(key=lambda t: (-t.confidence, t.group.entry.snippet))
    chosen = chosen[: max(1, min(MAX_TRUTHS, settings.limit))]
    picked = {t.key for t in chosen}
    lasting = []
    for t in scored:
        reason = lasting_reason(t.group.entry.snippet)
        if reason is not None:
            t.reason = reason
            if t.key not in picked:
                lasting.append(t)
    lasting.sort(key=lambda t: (-t.confidence, t.group.entry.snippet))
    return Reflection(
        len(members), themes(members, settings), chosen, lasting[: max(0, settings.limit)]
    )


def ground(
    store: RecallStore,
    entries: dict[str, RecallEntry],
    truths: Sequence[Truth],
    when: dt.datetime,
) -> int:
    """Credit each truth's entry one grounded signal per other day its claim was written on;
    returns how many were new (a day already credited is not counted again)."""
    added = 0
    for truth in truths:
        lead = entries[truth.key]  # every group is made of ``entries``
        for member in truth.group.members[1:]:
            day = note_day(member)
            if not day or day == note_day(lead):
                continue
            before = lead.grounded_count
            result = {
                "path": lead.path,
                "start_line": lead.start_line,
                "end_line": lead.end_line,
                "snippet": lead.snippet,
                "score": average_score(member),
            }
            store.count(
                entries,
                GROUNDED_QUERY.format(day=day),
                [result],
                when,
                signal="grounded",
                day=day,
                dedupe=True,
            )
            added += lead.grounded_count - before
    return added
