"""Dreaming's Light and REM phases, the Deep phase with their boosts, and the diary: strengths
and confidences computed by hand, real files and a real recall store, and two weeks of daily
notes in which lines nobody searched for reach MEMORY.md."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from memd.clock import Clock
from memd.dreams import diary
from memd.dreams.dream import DreamOptions, last_runs, run_dream
from memd.dreams.lasting import lasting_reason
from memd.dreams.light import LightSettings, collect_daily, ingest_daily, stage
from memd.dreams.phases import PhaseHits, PhaseSignals
from memd.dreams.recall_entry import RecallEntry, entry_key
from memd.dreams.recall_store import RecallStore
from memd.dreams.rem import RemSettings, confidence, ground, reflect, themes
from memd.dreams.similar import Group, Meaning, dedupe, facts_agree, text_similarity
from memd.dreams.transcripts import Message, Transcript, collect_sessions, save_sessions_state
from memd.embed.fake import FakeEmbedder
from memd.index.cache import EmbeddingCache, cached_vectors

UTC = dt.UTC


def _entry(
    path: str,
    line: int,
    snippet: str,
    *,
    recalls: int = 0,
    daily: int = 0,
    total: float = 0.0,
    days: list[str] | None = None,
    tags: list[str] | None = None,
) -> RecallEntry:
    return RecallEntry(
        entry_key(path, line, line),
        path,
        line,
        line,
        snippet,
        recall_count=recalls,
        daily_count=daily,
        total_score=total,
        recall_days=days or [],
        concept_tags=tags if tags is not None else [],
        last_recalled_at="2026-11-30T03:00:00.000Z",
    )


# --- REM: hand-computed --------------------------------------------------------------------------


def test_candidate_truth_confidence_by_hand() -> None:
    # A line nobody searched, read from notes of three days: avg 0.62, no recalls, 3 days,
    # 4 tags: 0.62·0.45 + 0·0.25 + (3/3)·0.20 + (4/6)·0.10 = 0.279 + 0.2 + 0.0666… = 0.54567
    e = _entry(
        "memory/2026-11-28.md",
        3,
        "Ana prefers morning meetings.",
        daily=1,
        total=0.62,
        days=["2026-11-20", "2026-11-24", "2026-11-28"],
        tags=["ana", "prefers", "morning", "meetings"],
    )
    assert confidence(Group(e, [e])) == pytest.approx(0.279 + 0.2 + 4 / 60, abs=1e-9)
    # Searched three times (avg 0.7), two days, six tags:
    # 0.7·0.45 + (ln 4 / ln 7)·0.25 + (2/3)·0.2 + 1·0.1 = 0.315 + 0.178103 + 0.133333 + 0.1
    s = _entry(
        "memory/2026-11-28.md",
        4,
        "The VPN password rotates every 90 days.",
        recalls=3,
        total=2.1,
        days=["2026-11-27", "2026-11-28"],
        tags=list("abcdef"),
    )
    want = 0.315 + math.log(4) / math.log(7) * 0.25 + 2 / 3 * 0.2 + 0.1
    assert confidence(Group(s, [s])) == pytest.approx(want, abs=1e-9)
    assert want == pytest.approx(0.72644, abs=1e-5)


def test_theme_strength_is_twice_the_share_of_entries_capped_at_one() -> None:
    entries = [
        _entry("memory/2026-11-28.md", i, f"line {i}", tags=tags)
        for i, tags in enumerate(
            [["vpn", "ops"], ["vpn"], ["lunch"], ["ops"], ["ops", "vpn"]], start=1
        )
    ]
    found = {t.tag: t for t in themes(entries, RemSettings())}
    # vpn: 3 of 5 → min(1, 0.6·2) = 1.0; ops: 3 of 5 → 1.0; lunch: 1 of 5 → 0.4 < 0.75, dropped
    assert set(found) == {"vpn", "ops"}
    assert found["vpn"].strength == 1.0 and found["vpn"].count == 3
    two = themes(entries[:4] + [_entry("memory/2026-11-28.md", 9, "x", tags=["q"])], RemSettings())
    # now ops: 2 of 5 → 0.8 (kept), vpn: 2 of 5 → 0.8 (kept), order by strength, count, tag
    assert [(t.tag, t.strength) for t in two] == [("ops", 0.8), ("vpn", 0.8)]


# --- similarity ----------------------------------------------------------------------------------


def test_words_similarity_is_jaccard_of_tokens() -> None:
    assert text_similarity("deploy the api", "deploy the web") == pytest.approx(2 / 4)
    assert text_similarity("Ana prefers tea.", "ana PREFERS tea") == 1.0
    assert text_similarity("—", "—") == 1.0 and text_similarity("—", "…") == 0.0
    # CJK: characters and adjacent pairs; 过敏 shared, one extra character
    assert 0 < text_similarity("李娜对花生过敏", "李娜对花生不过敏") < 0.9


@pytest.mark.parametrize(
    ("a", "b", "agree"),
    [
        ("- Ana prefers morning meetings.", "- Ana likes her meetings in the morning.", True),
        ("- Standup is at 9:30.", "- Standup is at 10:30.", False),
        ("- Review with Dana on Friday.", "- Review with Dana on Thursday.", False),
        ("- Prefers answers with bullets.", "- Prefers answers without bullets.", False),
        ("- Ana prefers tea.", "- Ben prefers tea.", False),
        ("- Maria's birthday is March 14.", "- March 14 is Maria's birthday.", True),
        ("- Note to self: Ana likes tea.", "- Ana likes tea.", True),  # a name left out
        ("- 李娜对花生过敏。", "- 李娜有花生过敏症。", False),  # CJK: never by meaning
    ],
)
def test_meaning_merges_only_texts_that_agree_on_their_facts(a: str, b: str, agree: bool) -> None:
    assert facts_agree(a, b) is agree


def test_dedupe_merges_across_notes_and_by_meaning_only_when_facts_agree() -> None:
    a = _entry("memory/2026-11-28.md", 3, "Ana prefers morning meetings.")
    b = _entry("memory/2026-11-20.md", 5, "Ana prefers morning meetings!")
    c = _entry("memory/2026-11-21.md", 2, "Ana likes her meetings in the morning.")
    d = _entry("memory/2026-11-22.md", 2, "Ben likes his meetings in the morning.")
    vectors = {  # a stand-in for a model: c says what a says, and so (by vector) does d
        a.snippet: np.array([1.0, 0.0]),
        b.snippet: np.array([1.0, 0.0]),
        c.snippet: np.array([0.96, 0.28]),
        d.snippet: np.array([0.96, 0.28]),
    }
    meaning = Meaning(lambda texts: [vectors[t] for t in texts], 0.94)
    groups = dedupe([a, b, c, d], 0.9, meaning=meaning)
    assert [g.keys for g in groups] == [[a.key, b.key, c.key], [d.key]]
    assert groups[0].by_meaning == 1 and groups[0].days == [
        "2026-11-20",
        "2026-11-21",
        "2026-11-28",
    ]
    words_only = dedupe([a, b, c, d], 0.9)
    assert [len(g.members) for g in words_only] == [2, 1, 1]


def test_meaning_that_fails_falls_back_to_words(caplog: pytest.LogCaptureFixture) -> None:
    def broken(texts: object) -> list[np.ndarray]:
        raise ConnectionError("provider down")

    meaning = Meaning(broken, 0.9)
    a = _entry("memory/2026-11-28.md", 3, "Ana prefers morning meetings.")
    c = _entry("memory/2026-11-21.md", 2, "Ana likes her meetings in the morning.")
    assert len(dedupe([a, c], 0.9, meaning=meaning)) == 2
    assert meaning.failed == "provider down" and not meaning.active


def test_cached_vectors_make_no_model_call_for_indexed_text(tmp_path: Path) -> None:
    fake = FakeEmbedder()
    cache = EmbeddingCache(tmp_path / "cache.sqlite")
    try:
        source = cached_vectors(fake, cache)
        first = source(["- Ana prefers morning meetings.", "- Ben is allergic to peanuts."])
        assert fake.calls == 1 and all(v is not None for v in first)
        again = source(["- Ben is allergic to peanuts."])
        assert fake.calls == 1  # the cache answered
        assert np.array_equal(again[0], first[1])
    finally:
        cache.close()


# --- lasting facts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "reason"),
    [
        ("Ben is allergic to peanuts.", 'lasting: an allergy ("allergic")'),
        ("My name is Jo, not Joanna.", 'lasting: a name ("My name is")'),
        ("Always run the migrations before deploying.", 'lasting: always ("Always")'),
        ("Never push to main on Fridays.", 'lasting: never ("Never")'),
        ("李娜对花生过敏。", 'lasting: an allergy ("过敏")'),
        ("Never mind, the build passed.", None),
        ("Is Ben allergic to peanuts?", None),
        ("Lunch was pizza.", None),
    ],
)
def test_lasting_reason(snippet: str, reason: str | None) -> None:
    assert lasting_reason(snippet) == reason


# --- Light ---------------------------------------------------------------------------------------


def _note(root: Path, day: str, *lines: str) -> Path:
    path = root / "memory" / f"{day}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([f"# {day}", "", *lines]) + "\n")
    return path


def test_light_reads_each_note_once_per_dreaming_day_with_its_day_as_bucket(
    tmp_path: Path,
) -> None:
    _note(tmp_path, "2026-11-27", "- Ana prefers morning meetings.", "- Lunch was pizza.")
    _note(tmp_path, "2026-11-10", "- Too old to read (outside the 14 days).")
    outside = tmp_path / "elsewhere.md"
    outside.write_text("- a file outside memory/\n")
    os.symlink(outside, tmp_path / "memory" / "2026-11-26.md")  # never followed
    store = RecallStore(tmp_path, clock=Clock("UTC"))
    now = dt.datetime(2026, 11, 28, 3, tzinfo=UTC)

    def read(now: dt.datetime, today: str) -> dict[str, RecallEntry]:
        with store.editing() as entries:
            collected = collect_daily(tmp_path, now, today=today, limit=100)
            ingest_daily(store, entries, collected, now)
            from memd.dreams.light import save_state

            save_state(tmp_path, collected)
        return store.load()

    entries = read(now, "2026-11-28")
    assert sorted(e.snippet for e in entries.values()) == [
        "Ana prefers morning meetings.",
        "Lunch was pizza.",
    ]
    ana = next(e for e in entries.values() if e.snippet.startswith("Ana"))
    assert (ana.daily_count, ana.recall_count, ana.recall_days) == (1, 0, ["2026-11-27"])
    assert ana.total_score == pytest.approx(0.62)
    # Same dreaming day, note unchanged: not read again.
    assert read(now + dt.timedelta(hours=5), "2026-11-28")[ana.key].daily_count == 1
    # The next day it is read again and counted again (OpenClaw: no per-day dedupe), still
    # under the note's own day.
    later = read(now + dt.timedelta(days=1), "2026-11-29")[ana.key]
    assert (later.daily_count, later.recall_days) == (2, ["2026-11-27"])
    assert len(later.query_hashes) == 1
    state = json.loads((tmp_path / "memory" / ".dreams" / "daily-ingestion.json").read_text())
    assert list(state["files"]) == ["memory/2026-11-27.md"]
    assert state["files"]["memory/2026-11-27.md"]["lastDreamingDayIngested"] == "2026-11-29"


def test_light_stages_recent_entries_once_until_seen_again() -> None:
    now = dt.datetime(2026, 11, 30, 3, tzinfo=UTC)
    a = _entry("memory/2026-11-29.md", 3, "Ana prefers morning meetings.", days=["2026-11-29"])
    b = _entry("memory/2026-11-29.md", 4, "Ana prefers morning meetings!", days=["2026-11-29"])
    old = _entry("memory/2026-11-20.md", 2, "An old note.", days=["2026-11-20"])
    old.daily_count = 3  # only read by dreaming, on a day outside Light's two days
    entries = {e.key: e for e in (a, b, old)}
    groups, considered = stage(entries, {}, now, LightSettings())
    assert considered == 2 and len(groups) == 1 and set(groups[0].keys) == {a.key, b.key}
    lead = groups[0].entry.key
    other = ({a.key, b.key} - {lead}).pop()
    staged = {lead: PhaseHits(lead, light_hits=1, last_light_at="2026-11-30T03:00:00.000Z")}
    # staged after it was last seen: not staged again until seen again
    assert stage(entries, staged, now, LightSettings())[0][0].keys == [other]


# --- REM grounding -------------------------------------------------------------------------------


def test_rem_grounds_a_claim_written_on_several_days_once_per_day(tmp_path: Path) -> None:
    for day in ("2026-11-20", "2026-11-24", "2026-11-28"):
        _note(tmp_path, day, "- Ana prefers morning meetings.", f"- Worked on ticket {day}.")
    store = RecallStore(tmp_path, clock=Clock("UTC"))
    now = dt.datetime(2026, 11, 29, 3, tzinfo=UTC)
    for _ in range(2):  # REM twice on the same material: the second adds nothing
        with store.editing() as entries:
            collected = collect_daily(tmp_path, now, today="2026-11-29", limit=100)
            ingest_daily(store, entries, collected, now)
            refl = reflect(entries, {}, now, RemSettings())
            added = ground(store, entries, refl.truths, now)
        lead = entries[entry_key("memory/2026-11-28.md", 3, 3)]
        assert [t.key for t in refl.truths] == [lead.key]
        assert lead.grounded_count == 2 and lead.recall_count == 0
        assert lead.recall_days == ["2026-11-20", "2026-11-24", "2026-11-28"]
        now += dt.timedelta(hours=1)
    assert added == 0
    assert len(lead.query_hashes) == 3  # its own day's reading, and one grounding per other day


# --- the diary -----------------------------------------------------------------------------------


def test_diary_drops_only_the_oldest_entries_nobody_edited(tmp_path: Path) -> None:
    body = [f"- line {i} of a long entry" for i in range(20)]
    for n in range(3):
        diary.write_entry(tmp_path, f"2026-11-2{n} 03:00", body, max_chars=0)
    path = tmp_path / diary.DIARY_FILE
    text = path.read_text()
    assert text.startswith("# Dream Diary\n\n## Dreams of 2026-11-20 03:00\n<!-- memd-dream")
    # A human adds a remark to the oldest entry: that entry is theirs now, it stays.
    path.write_text(
        text.replace("- line 3 of a long entry\n", "- line 3 of a long entry\nMine.\n", 1)
    )
    result = diary.write_entry(tmp_path, "2026-11-23 03:00", body, max_chars=len(text))
    after = path.read_text()
    assert result.dropped_entries >= 1
    assert "Mine." in after and "## Dreams of 2026-11-20 03:00" in after
    assert "## Dreams of 2026-11-21 03:00" not in after  # the oldest untouched entry went
    assert after.rstrip().endswith("- line 19 of a long entry")
    assert "## Dreams of 2026-11-23 03:00" in after


def test_diary_refuses_to_write_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.md"
    target.write_text("keep\n")
    (tmp_path / "ws").mkdir()
    os.symlink(target, tmp_path / "ws" / diary.DIARY_FILE)
    with pytest.raises(Exception, match="symlink"):
        diary.write_entry(tmp_path / "ws", "2026-11-23 03:00", ["- x"], max_chars=0)
    assert target.read_text() == "keep\n"


# --- two weeks, end to end -----------------------------------------------------------------------

START = dt.date(2026, 11, 16)
TOPICS = ("billing", "search", "mobile", "infra", "docs")


def _day_note(root: Path, n: int) -> None:
    day = (START + dt.timedelta(days=n)).isoformat()
    lines = [
        f"- Reviewed pull request #{n * 10 + i} for the {TOPICS[(n + i) % 5]} service."
        for i in range(3)
    ]
    if n in (2, 6, 11):
        lines.append("- Ana prefers morning meetings.")
    if n == 4:
        lines.append("- Ben is allergic to peanuts.")
    if n == 9:
        lines.append("- Fixed the flaky login test.")
    _note(root, day, *lines)


def test_two_weeks_of_notes_nobody_searched_promote_what_lasts(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\n- Written by a human.\n")
    promoted: dict[str, str] = {}
    for n in range(17):  # a note a day for two weeks, dreaming every night at 03:00
        if n < 14:
            _day_note(root, n)
        now = dt.datetime.combine(START + dt.timedelta(days=n + 1), dt.time(3), UTC)
        options = DreamOptions(apply=True, diary_max_chars=0)  # keep every entry
        run = run_dream(root, options, clock=Clock.at(now, "UTC"))
        for a in run["deep"]["applied"]:
            promoted[a["key"]] = now.date().isoformat()
    memory = (root / "MEMORY.md").read_text()
    assert memory.startswith("# Memory\n\n- Written by a human.\n")
    ana = entry_key("memory/2026-11-27.md", 6, 6)  # the third mention leads the claim
    ben = entry_key("memory/2026-11-20.md", 6, 6)
    assert set(promoted) == {ana, ben}
    assert promoted[ben] == "2026-11-21"  # a lasting fact: the first night after it was written
    assert promoted[ana] > "2026-11-27"  # only once written on three days
    assert memory.count("- Ana prefers morning meetings. [") == 1
    assert "- Ben is allergic to peanuts. [" in memory and "flaky login" not in memory
    entries = RecallStore(root).load()
    assert entries[ana].recall_count == 0 and entries[ana].grounded_count == 2
    assert entries[ana].promoted_at is not None
    phases = PhaseSignals(root).load()
    assert phases[ana].light_hits >= 1 and phases[ana].rem_hits >= 1
    dreams = (root / "DREAMS.md").read_text()
    assert "### Light Sleep" in dreams and "### REM Sleep" in dreams
    assert "- Ben is allergic to peanuts. [lasting: an allergy" in dreams
    assert "Promoted into MEMORY.md:\n- Ana prefers morning meetings. (score 0." in dreams
    assert "Held back:\n" in dreams
    runs = last_runs(root)
    assert set(runs) == {"light", "rem", "deep"} and runs["deep"]["at"].startswith("2026-12-03")


def test_a_preview_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for n in range(5):
        _day_note(root, n)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    now = dt.datetime(2026, 11, 21, 3, tzinfo=UTC)
    run = run_dream(root, DreamOptions(), clock=Clock.at(now, "UTC"))
    assert run["applied"] is False and run["light"]["snippets"] > 0
    assert [t["snippet"] for t in run["rem"]["lasting"]] == ["Ben is allergic to peanuts."]
    assert [c["snippet"] for c in run["deep"]["candidates"]] == ["Ben is allergic to peanuts."]
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before


MODEL = os.environ.get("MEMD_TEST_MODEL", "")


@pytest.mark.skipif(not MODEL, reason="set MEMD_TEST_MODEL to the MiniLM GGUF model")
def test_the_real_model_merges_a_paraphrase_and_not_a_different_fact(tmp_path: Path) -> None:
    from memd.dreams.similar import meaning_threshold
    from memd.embed.process import ProcessEmbedder

    embedder = ProcessEmbedder(MODEL, threads=2)  # out of process, as memd runs it
    cache = EmbeddingCache(tmp_path / "cache.sqlite")
    try:
        threshold = meaning_threshold(embedder.model)
        assert threshold == 0.94
        a = _entry("memory/2026-11-28.md", 3, "- Ana prefers morning meetings.")
        b = _entry("memory/2026-11-21.md", 2, "- Ana likes to have meetings in the morning.")
        c = _entry("memory/2026-11-22.md", 2, "- Quarterly review with Dana on Friday at 2pm.")
        d = _entry("memory/2026-11-23.md", 2, "- Quarterly review with Dana on Thursday at 2pm.")
        meaning = Meaning(cached_vectors(embedder, cache), threshold)
        groups = dedupe([a, b, c, d], 0.9, meaning=meaning)
        # b says what a says (cosine 0.95); d is another day (cosine 0.994, but facts differ)
        assert [g.keys for g in groups] == [[a.key, b.key], [c.key], [d.key]]
        assert groups[0].by_meaning == 1
        assert cache.count() == 4
    finally:
        embedder.close()
        cache.close()


# --- Light's transcripts -------------------------------------------------------------------------


def _transcript(name: str, texts: list[tuple[int, str]], size: int | None = None) -> Transcript:
    """A transcript of (hour on 2026-11-29 UTC, "User: …") messages, one per JSONL line."""
    messages = [
        Message(i, int(dt.datetime(2026, 11, 29, h, tzinfo=UTC).timestamp() * 1000), text)
        for i, (h, text) in enumerate(texts, start=1)
    ]
    return Transcript(name, size or len(texts), 1, lambda: messages)


def test_light_takes_each_new_message_once_within_its_caps(tmp_path: Path) -> None:
    now = dt.datetime(2026, 11, 30, 3, tzinfo=UTC)
    chat = [(9, f"User: please remember fact number {i} about the launch") for i in range(100)]
    first = collect_sessions(
        tmp_path, lambda: [_transcript("a.jsonl", chat)], now, tz=UTC, lookback_days=2
    )
    # one transcript: per-transcript cap min(80, max(12, ceil(240/1))) = 80
    assert first.messages == 80 and list(first.by_day) == ["2026-11-29"]
    save_sessions_state(tmp_path, first)
    grown = _transcript("a.jsonl", chat, size=101)  # appended to: the rest is read, once
    second = collect_sessions(tmp_path, lambda: [grown], now, tz=UTC, lookback_days=2)
    assert second.messages == 20
    assert second.by_day["2026-11-29"][0] == "User: please remember fact number 80 about the launch"
    save_sessions_state(tmp_path, second)
    again = collect_sessions(tmp_path, lambda: [grown], now, tz=UTC, lookback_days=2)
    assert again.messages == 0 and not again.changed
    old = [(9, "User: an old remark from long ago, long gone")]
    stale = Transcript("b.jsonl", 1, 1, lambda: [Message(1, 1_000, old[0][1])])  # 1970
    short = _transcript("c.jsonl", [(9, "User: ok")])
    rest = collect_sessions(tmp_path, lambda: [grown, stale, short], now, tz=UTC, lookback_days=2)
    assert rest.messages == 0  # too old, too short


def test_transcripts_reach_memory_md_through_the_session_corpus(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    said = "User: I'm allergic to shellfish, please keep that in mind."
    chat = _transcript("s1.jsonl", [(9, said), (10, "Assistant: Noted, no shellfish.")])
    now = dt.datetime(2026, 11, 30, 3, tzinfo=UTC)
    preview = run_dream(
        root, DreamOptions(), transcripts=lambda: [chat], clock=Clock.at(now, "UTC")
    )
    assert preview["light"]["messages_read"] == 2 and not (root / "memory").exists()
    run = run_dream(
        root,
        DreamOptions(apply=True),
        transcripts=lambda: [chat],
        clock=Clock.at(now, "UTC"),
    )
    corpus = root / "memory" / ".dreams" / "session-corpus" / "2026-11-29.txt"
    assert corpus.read_text() == f"{said}\nAssistant: Noted, no shellfish.\n"
    assert [t["snippet"] for t in run["rem"]["lasting"]] == [said]
    assert [a["path"] for a in run["deep"]["applied"]] == [
        "memory/.dreams/session-corpus/2026-11-29.txt"
    ]
    assert f"- {said} [" in (root / "MEMORY.md").read_text()
    # The next run reads nothing new and writes no second copy.
    later = now + dt.timedelta(days=1)
    run_dream(
        root,
        DreamOptions(apply=True),
        transcripts=lambda: [chat],
        clock=Clock.at(later, "UTC"),
    )
    assert corpus.read_text().count(said) == 1


def test_a_transcript_message_falls_on_the_users_day_with_no_zone_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``timezone`` set: the machine's zone decides the day, for transcripts as for the
    daily logs (a message at 20:00 UTC is the next morning in Tokyo)."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    root = tmp_path / "ws"
    root.mkdir()
    said = "User: the offsite moved to the harbour hotel, remember that."
    chat = _transcript("s1.jsonl", [(20, said), (21, "Assistant: Noted.")])
    now = dt.datetime(2026, 11, 30, 3, tzinfo=UTC)
    run_dream(root, DreamOptions(apply=True), transcripts=lambda: [chat], clock=Clock.at(now))
    corpus = root / "memory" / ".dreams" / "session-corpus"
    assert sorted(p.name for p in corpus.iterdir()) == ["2026-11-30.txt"]  # not 11-29 (UTC)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_diary_trim_keeps_a_human_edit_made_while_it_rewrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A human appends to DREAMS.md just as memd swaps in the trimmed file (twice): each time
    the swap notices, starts over, and their line is there once at the end."""
    from memd.dreams import sharedfile

    body = [f"- line {i} of a long entry" for i in range(20)]
    for n in range(3):
        diary.write_entry(tmp_path, f"2026-11-2{n} 03:00", body, max_chars=0)
    path = tmp_path / diary.DIARY_FILE
    budget = len(path.read_text())
    real = sharedfile.fsync
    added: list[str] = []

    def fsync(fd: int) -> None:
        real(fd)
        if len(added) < 2 and os.readlink(f"/proc/self/fd/{fd}") != str(path):
            added.append(f"a human remark {len(added)}")
            with open(path, "a") as f:
                f.write(added[-1] + "\n")

    monkeypatch.setattr(sharedfile, "fsync", fsync)
    result = diary.write_entry(tmp_path, "2026-11-23 03:00", body, max_chars=budget)
    text = path.read_text()
    assert len(added) == 2 and all(text.count(line) == 1 for line in added)
    assert result.dropped_entries >= 1 and "## Dreams of 2026-11-20 03:00" not in text


def test_a_run_compares_by_meaning_with_vectors_from_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for n in range(5):
        _day_note(root, n)
    fake = FakeEmbedder()
    cache = EmbeddingCache(tmp_path / "cache.sqlite")
    try:
        source = cached_vectors(fake, cache)
        now = dt.datetime(2026, 11, 21, 3, tzinfo=UTC)
        options = DreamOptions(apply=True)
        run = run_dream(
            root, options, vectors=source, meaning_threshold=0.94, clock=Clock.at(now, "UTC")
        )
        assert run["similarity"] == "words and meaning (cosine >= 0.94)"
        calls = fake.calls
        assert calls >= 1 and cache.count() >= 16  # every line of the five notes
        later = now + dt.timedelta(hours=1)
        run_dream(
            root, options, vectors=source, meaning_threshold=0.94, clock=Clock.at(later, "UTC")
        )
        assert fake.calls == calls  # the same lines again: all from the cache
    finally:
        cache.close()
