"""Phase signals (Light and REM hits) and the boost they give in the Deep phase's ranking,
against hand-computed values; the store on disk in OpenClaw's shape."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

import pytest

from memd.clock import Clock
from memd.dreams.dreaming import run_promotion
from memd.dreams.phases import MAX_HITS, PhaseHits, PhaseSignals, phase_boost
from memd.dreams.ranking import MANUAL, Thresholds, rank, score_entry

from .test_ranking import NOW, iso, make


def test_the_boost_by_hand() -> None:
    # Light: 6 hits -> strength ln 7 / ln 7 = 1; last hit 14 days ago -> recency 1/2: 0.03.
    # REM: 1 hit -> strength ln 2 / ln 7 = 0.356207; last hit now -> 1: 0.09 x that = 0.032059.
    hits = PhaseHits("k", 6, 1, iso(NOW - timedelta(days=14)), iso(NOW))
    assert phase_boost(hits, NOW) == pytest.approx(0.03 + 0.09 * math.log(2) / math.log(7))
    assert phase_boost(hits, NOW) == pytest.approx(0.062059, abs=1e-6)
    assert phase_boost(None, NOW) == 0.0
    assert phase_boost(PhaseHits("k", 3, 0), NOW) == 0.0  # hits without a time: never recent
    # Saturated: many hits just now give at most 0.06 + 0.09.
    assert phase_boost(
        PhaseHits("k", MAX_HITS, MAX_HITS, iso(NOW), iso(NOW)), NOW
    ) == pytest.approx(0.15)


def test_ranking_adds_the_boost_unweighted() -> None:
    entry = make()
    plain = score_entry(entry, NOW)
    hits = PhaseHits(entry.key, 6, 0, iso(NOW))
    boosted = score_entry(entry, NOW, phases=hits)
    assert boosted.components["phase_boost"] == pytest.approx(0.06)
    assert boosted.score == pytest.approx(min(1.0, plain.score + 0.06))
    # An entry just under the bar passes with its Light hits, and not without them.
    bar = Thresholds(plain.score + 0.03, 1, 1)
    assert rank([entry], bar, NOW) == []
    (passed,) = rank([entry], bar, NOW, phases={entry.key: hits})
    assert passed.entry.key == entry.key


def test_the_store_counts_hits_caps_them_and_drops_unknown_keys(tmp_path: Path) -> None:
    signals = PhaseSignals(tmp_path)
    assert signals.load() == {}
    signals.record(["a", "b", "a"], "light", NOW)  # a key counts once per run
    signals.record(["a"], "rem", NOW + timedelta(hours=1))
    got = signals.load()
    assert (got["a"].light_hits, got["a"].rem_hits, got["b"].light_hits) == (1, 1, 1)
    raw = json.loads(signals.path.read_text())
    assert raw["version"] == 1 and raw["updatedAt"] == "2026-04-08T13:00:00.000Z"
    assert raw["entries"]["a"] == {
        "key": "a",
        "lightHits": 1,
        "remHits": 1,
        "lastLightAt": "2026-04-08T12:00:00.000Z",
        "lastRemAt": "2026-04-08T13:00:00.000Z",
    }
    signals.record(["a"], "light", NOW, known={"a": object()})
    assert set(signals.load()) == {"a"}  # "b" is no longer in the recall store
    raw["entries"]["a"]["lightHits"] = 10**9
    raw["entries"]["c"] = {"lightHits": "many"}
    signals.path.write_text(json.dumps(raw))
    got = signals.load()
    assert got["a"].light_hits == MAX_HITS and got["c"].light_hits == 0
    signals.path.write_text("{not json")
    assert signals.load() == {}  # unreadable: no boost, never an error


def test_promotion_explains_the_boost(tmp_path: Path) -> None:
    from memd.dreams.recall_store import RecallStore

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-04-01.md").write_text("# 2026-04-01\n\n" + make().snippet + "\n")
    store = RecallStore(ws, clock=Clock.at(NOW, "UTC"))
    for i in range(3):
        store.record(
            f"q{i}",
            [
                {
                    "path": "memory/2026-04-01.md",
                    "start_line": 3,
                    "end_line": 3,
                    "score": 0.9,
                    "snippet": make().snippet,
                }
            ],
        )
    (key,) = store.load()
    before = run_promotion(ws, MANUAL, explain=key, clock=Clock.at(NOW, "UTC"))
    PhaseSignals(ws).record([key], "light", NOW)
    after = run_promotion(ws, MANUAL, explain=key, clock=Clock.at(NOW, "UTC"))
    assert before["explain"]["components"]["phase_boost"] == 0.0
    light = 0.06 * math.log(2) / math.log(7)
    assert after["explain"]["components"]["phase_boost"] == pytest.approx(light, abs=1e-4)
    assert after["explain"]["score"] == pytest.approx(before["explain"]["score"] + light, abs=2e-4)
