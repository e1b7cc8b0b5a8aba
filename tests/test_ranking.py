"""Promotion ranking: each signal against hand-computed values, thresholds, filters and order."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest

from memd.dreams.ranking import (
    MANUAL,
    SCHEDULED,
    WEIGHTS,
    Thresholds,
    consolidation,
    rank,
    score_entry,
)
from memd.dreams.recall_entry import RecallEntry

NOW = datetime(2026, 4, 8, 12, 0, tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make(
    *,
    path: str = "memory/2026-04-01.md",
    start: int = 1,
    recalls: int = 4,
    total: float = 3.6,
    queries: int = 4,
    days: tuple[str, ...] = ("2026-04-01", "2026-04-03", "2026-04-07"),
    tags: int = 6,
    last: datetime = NOW,
    snippet: str = "Deploys go through the blue-green pipeline on staging first.",
    promoted_at: str | None = None,
) -> RecallEntry:
    return RecallEntry(
        key=f"memory:{path}:{start}:{start + 2}",
        path=path,
        start_line=start,
        end_line=start + 2,
        snippet=snippet,
        recall_count=recalls,
        total_score=total,
        max_score=1.0,
        first_recalled_at=iso(last - timedelta(days=6)),
        last_recalled_at=iso(last),
        query_hashes=[f"{i:012x}" for i in range(queries)],
        recall_days=list(days),
        concept_tags=[f"tag{i}" for i in range(tags)],
        promoted_at=promoted_at,
    )


def test_weights_sum_to_one() -> None:
    assert math.isclose(sum(WEIGHTS.values()), 1.0)
    assert WEIGHTS == {
        "frequency": 0.24,
        "relevance": 0.30,
        "diversity": 0.15,
        "recency": 0.15,
        "consolidation": 0.10,
        "conceptual": 0.06,
    }


def test_consolidation_worked_example() -> None:
    # n = 3 distinct days over a 6-day span: 0.55 * ln3/ln5 + 0.45 * 6/7
    value = consolidation(["2026-04-01", "2026-04-03", "2026-04-07"])
    assert value == pytest.approx(0.55 * math.log(3) / math.log(5) + 0.45 * 6 / 7)
    assert value == pytest.approx(0.761, abs=0.001)


def test_consolidation_edges() -> None:
    assert consolidation([]) == 0.0
    assert consolidation(["2026-04-01"]) == 0.2
    assert consolidation(["2026-04-01", "2026-04-01"]) == 0.2  # distinct days only
    assert consolidation(["garbage"]) == 0.0
    # Many days over a long span saturate at 1.
    assert consolidation([f"2026-03-{d:02d}" for d in range(1, 20)]) == 1.0
    # Grounded evidence can lift it: max(spacing, clamp(grounded / 3)).
    assert consolidation(["2026-04-01"], grounded_count=2) == pytest.approx(2 / 3)
    assert consolidation([], grounded_count=9) == 1.0


def test_components_against_hand_computed_values() -> None:
    entry = make(recalls=4, total=3.6, queries=4, tags=3, last=NOW - timedelta(days=7))
    c = score_entry(entry, NOW)
    assert c.signal_count == 4
    assert c.unique_queries == 4
    assert c.age_days == pytest.approx(7.0)
    expected = {
        "frequency": math.log(5) / math.log(11),
        "relevance": 0.9,
        "diversity": 0.8,
        "recency": 0.5 ** (7 / 14),
        "consolidation": 0.55 * math.log(3) / math.log(5) + 0.45 * 6 / 7,
        "conceptual": 0.5,
    }
    assert c.components == pytest.approx({**expected, "phase_boost": 0.0})
    assert c.score == pytest.approx(sum(WEIGHTS[k] * v for k, v in expected.items()))


def test_component_clamps_and_signal_sum() -> None:
    entry = make(recalls=20, total=50.0, queries=9, tags=8)
    entry.daily_count = 3
    entry.grounded_count = 2
    c = score_entry(entry, NOW)
    assert c.signal_count == 25
    assert c.components["frequency"] == 1.0  # ln(26)/ln(11) > 1
    assert c.components["relevance"] == 1.0
    assert c.components["diversity"] == 1.0
    assert c.components["conceptual"] == 1.0
    assert c.components["recency"] == 1.0
    assert 0.0 <= c.score <= 1.0


def test_unparsable_last_recall_counts_as_now() -> None:
    entry = dataclasses.replace(make(), last_recalled_at="not a time")
    assert score_entry(entry, NOW).age_days == 0.0


def test_diversity_is_the_larger_of_queries_and_days() -> None:
    entry = make(queries=1, days=("2026-04-01", "2026-04-02", "2026-04-03"))
    assert score_entry(entry, NOW).unique_queries == 3


def test_two_distinct_queries_pass_manual_but_not_scheduled() -> None:
    entry = make(recalls=6, total=6.0, queries=2, days=("2026-04-01", "2026-04-07"), tags=8)
    assert score_entry(entry, NOW).score >= SCHEDULED.min_score
    assert [c.entry.key for c in rank([entry], MANUAL, NOW)] == [entry.key]
    assert rank([entry], SCHEDULED, NOW) == []


def test_min_recall_count_and_min_score() -> None:
    too_few = make(recalls=2, total=2.0)
    assert rank([too_few], MANUAL, NOW) == []
    assert rank([too_few], dataclasses.replace(MANUAL, min_recall_count=2), NOW)
    weak = make(total=0.4)  # avg relevance 0.1
    assert score_entry(weak, NOW).score < MANUAL.min_score
    assert rank([weak], MANUAL, NOW) == []
    assert rank([make(recalls=0, total=0.0)], Thresholds(0.0, 0, 0), NOW) == []  # no signal


def test_max_age() -> None:
    old = make(last=NOW - timedelta(days=31))
    lenient = Thresholds(0.0, 1, 1)
    assert rank([old], lenient, NOW) == []
    assert rank([old], dataclasses.replace(lenient, max_age_days=40), NOW)
    assert rank([old], dataclasses.replace(lenient, max_age_days=-1), NOW)


def test_promoted_excluded_unless_asked() -> None:
    entry = make(promoted_at=iso(NOW))
    assert rank([entry], MANUAL, NOW) == []
    assert [c.entry.key for c in rank([entry], MANUAL, NOW, include_promoted=True)] == [entry.key]


def test_only_short_term_promotable_entries() -> None:
    lenient = Thresholds(0.0, 1, 1)
    assert rank([make(path="MEMORY.md")], lenient, NOW) == []
    assert rank([make(path="memory/projects.md")], lenient, NOW) == []
    assert rank([make(path="memory/dreaming/2026-04-01.md")], lenient, NOW) == []
    assert rank([make(snippet="## Heading only")], lenient, NOW) == []
    assert len(rank([make(path="memory/team/2026-04-01-standup.md")], lenient, NOW)) == 1


def test_ordering_and_limit() -> None:
    lenient = Thresholds(0.0, 1, 1, limit=3)
    best = make(path="memory/2026-04-05.md", total=4.0)
    tie_a = make(path="memory/2026-04-02.md", total=3.0, recalls=4)
    tie_b = make(path="memory/2026-04-01.md", total=3.0, recalls=4)
    worst = make(path="memory/2026-04-03.md", total=1.0)
    ranked = rank([worst, tie_a, best, tie_b], lenient, NOW)
    assert [c.entry.path for c in ranked] == [
        "memory/2026-04-05.md",
        "memory/2026-04-01.md",  # equal score and recalls: by path
        "memory/2026-04-02.md",
    ]
    scores = [c.score for c in ranked]
    assert scores == sorted(scores, reverse=True)


def test_recall_count_breaks_score_ties() -> None:
    lenient = Thresholds(0.0, 1, 1)
    # Same score (every component saturated) but different recall counts.
    many = make(path="memory/2026-04-01.md", recalls=40, total=40.0, queries=9, tags=8)
    few = make(path="memory/2026-04-02.md", recalls=30, total=30.0, queries=9, tags=8)
    days = tuple(f"2026-03-{d:02d}" for d in range(10, 26))
    many.recall_days = few.recall_days = list(days)
    ranked = rank([few, many], lenient, NOW)
    assert ranked[0].score == ranked[1].score
    assert [c.entry.recall_count for c in ranked] == [40, 30]
