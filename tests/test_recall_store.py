"""The recall store: paths and snippets it tracks, counting and caps, the JSON shape, the lock
protocol across processes, and surviving a crash mid-rewrite."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from memd.clock import Clock
from memd.dreams import recall_lock
from memd.dreams.recall_entry import RecallEntry, entry_key
from memd.dreams.recall_store import RecallStore
from memd.dreams.recall_text import (
    claim_hash,
    concept_tags,
    is_promotable,
    is_short_term,
    query_hash,
)
from memd_client.errors import Busy

DAY1 = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)
SNIPPET = "Deploys go through the blue-green pipeline.\nStaging first, then prod."


class FakeTime:
    def __init__(self, now: datetime = DAY1) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def hit(
    path: str = "memory/2026-04-01.md", start: int = 1, score: float = 0.9, **kw: Any
) -> dict[str, Any]:
    return {
        "path": path,
        "start_line": start,
        "end_line": start + 1,
        "score": score,
        "snippet": SNIPPET,
        **kw,
    }


@pytest.fixture
def clock() -> FakeTime:
    return FakeTime()


@pytest.fixture
def store(workspace: Path, clock: FakeTime) -> RecallStore:
    return RecallStore(workspace, clock=Clock("UTC", source=clock))


@pytest.fixture
def fast_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recall_lock, "LOCK_TIMEOUT_S", 0.3)
    monkeypatch.setattr(recall_lock, "LOCK_RETRY_S", 0.01)


# -- what is tracked ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("memory/2026-04-01.md", True),
        ("memory/2026-04-01-standup.md", True),
        ("memory/team/notes/2026-04-01.md", True),
        ("./memory/2026-04-01.md", True),
        ("agents/main/memory/2026-04-01.md", True),
        ("memory/2026-02-30.md", False),  # not a calendar date
        ("memory/2026-04-01.txt", False),
        ("memory/dreaming/2026-04-01.md", False),
        ("memory/dreaming/light/2026-04-01.md", False),
        ("MEMORY.md", False),
        ("memory.md", False),
        ("memory/projects.md", False),
        ("notes/2026-04-01.md", False),
        ("mymemory/2026-04-01.md", False),
    ],
)
def test_is_short_term(path: str, expected: bool) -> None:
    assert is_short_term(path) is expected


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("Use blue-green deploys.", True),
        ("## Decisions\n- use blue-green deploys", True),
        ("", False),
        ("   \n\t", False),
        ("# Heading\n## Sub", False),
        ("## Tasks\n- \n* [ ]\n1.", False),
        ("<!-- memd-promotion:memory:memory/2026-04-01.md:1:2 -->", False),
        ("<!-- openclaw-memory-promotion:k -->\n- promoted text", False),
        (
            "Candidate: deploys are blue-green\nconfidence: 0.9\nevidence: 3 notes\n"
            "status: staged\nrecalls: 4",
            False,
        ),
        ("Candidate: deploys are blue-green\nconfidence: 0.9", True),  # not the full combination
    ],
)
def test_is_promotable(snippet: str, expected: bool) -> None:
    assert is_promotable(snippet) is expected


def test_hashes() -> None:
    assert query_hash("  Deploy Process ") == query_hash("deploy process")
    assert len(query_hash("x")) == 12
    assert int(query_hash("x"), 16) >= 0
    assert claim_hash("a  b\n c") == claim_hash("a b c")
    assert claim_hash("a b c") != claim_hash("a b d")


def test_concept_tags() -> None:
    tags = concept_tags(
        "memory/2026-04-01.md",
        "Today the agent fixed the Postgres_Pool in src/db.py: 12345, 2026-04-01, ok, about "
        "postgres-pool retries; see ./README.md and memory search",
    )
    assert tags == ["fixed", "postgres-pool", "src/db.py", "retries", "readme.md"]
    many = concept_tags("memory/2026-04-01.md", " ".join(f"word{i}" for i in range(20)))
    assert len(many) == 8


# -- recording ---------------------------------------------------------------------------------


def test_record_creates_entry_with_reference_shape(store: RecallStore) -> None:
    assert store.record("deploy process", [hit(score=1.5)]) == 1
    data = json.loads(store.path.read_text())
    assert data["version"] == 1
    assert data["updatedAt"] == "2026-04-01T12:00:00.000Z"
    assert store.path.read_text().endswith("}\n")
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    key = "memory:memory/2026-04-01.md:1:2"
    raw = data["entries"][key]
    assert raw == {
        "key": key,
        "path": "memory/2026-04-01.md",
        "startLine": 1,
        "endLine": 2,
        "source": "memory",
        "snippet": "Deploys go through the blue-green pipeline. Staging first, then prod.",
        "recallCount": 1,
        "dailyCount": 0,
        "groundedCount": 0,
        "totalScore": 1.0,  # clamped
        "maxScore": 1.0,
        "firstRecalledAt": "2026-04-01T12:00:00.000Z",
        "lastRecalledAt": "2026-04-01T12:00:00.000Z",
        "queryHashes": [query_hash("deploy process")],
        "recallDays": ["2026-04-01"],
        "conceptTags": concept_tags("memory/2026-04-01.md", raw["snippet"]),
    }
    entry = store.load()[key]
    assert RecallEntry.from_json(entry.to_json()) == entry


def test_record_accumulates_and_dedupes_same_query_same_day(
    store: RecallStore, clock: FakeTime
) -> None:
    store.record("deploy", [hit(score=0.5)])
    store.record("Deploy ", [hit(score=0.9)])  # same query hash, same day: lists only
    store.record("rollback", [hit(score=0.9)])
    clock.now = DAY1 + timedelta(days=1)
    store.record("deploy", [hit(score=0.7)])  # same query, new day: counted
    store.record("x", [hit()], signal="daily")
    (entry,) = store.load().values()
    assert entry.recall_count == 3
    assert entry.daily_count == 1
    assert entry.total_score == pytest.approx(0.5 + 0.9 + 0.7 + 0.9)
    assert entry.max_score == 0.9
    assert entry.recall_days == ["2026-04-01", "2026-04-02"]
    assert entry.query_hashes == [query_hash("rollback"), query_hash("deploy"), query_hash("x")]
    assert entry.first_recalled_at == "2026-04-01T12:00:00.000Z"
    assert entry.last_recalled_at == "2026-04-02T12:00:00.000Z"
    assert store.counts() == {"entries": 1, "promoted": 0, "concept_tagged": 1, "spaced": 1}


def test_caps_keep_most_recent(store: RecallStore, clock: FakeTime) -> None:
    for i in range(33):
        store.record(f"query {i}", [hit()])
    (entry,) = store.load().values()
    assert entry.recall_count == 33
    assert len(entry.query_hashes) == 32
    assert entry.query_hashes[0] == query_hash("query 1")
    assert entry.query_hashes[-1] == query_hash("query 32")
    for d in range(17):
        clock.now = DAY1 + timedelta(days=d)
        store.record("daily question", [hit()])
    (entry,) = store.load().values()
    assert len(entry.recall_days) == 16
    assert entry.recall_days[0] == "2026-04-02"
    assert entry.recall_days[-1] == "2026-04-17"


def test_non_short_term_and_unpromotable_ignored(store: RecallStore) -> None:
    results = [
        hit(path="MEMORY.md"),
        hit(path="memory/projects.md"),
        hit(path="memory/dreaming/2026-04-01.md"),
        hit(source="sessions"),
        hit(snippet=""),
        hit(snippet="## Heading\n### Another"),
        hit(snippet="<!-- memd-promotion:memory:memory/2026-04-01.md:1:2 -->"),
        {"path": "memory/2026-04-01.md", "start_line": 5, "end_line": 2, "snippet": "x"},
    ]
    assert store.record("q", results) == 0
    assert not store.path.exists()
    assert store.record("q", [*results, hit(start=7)]) == 1
    assert list(store.load()) == ["memory:memory/2026-04-01.md:7:8"]


def test_missing_snippet_is_read_from_the_file(store: RecallStore, write: Any) -> None:
    write("memory/2026-04-01.md", "# Day\nDeploys are blue-green.\nStaging first.\n")
    no_snippet = {"path": "memory/2026-04-01.md", "start_line": 2, "end_line": 3, "score": 0.5}
    assert store.record("q", [no_snippet]) == 1
    (entry,) = store.load().values()
    # cut as Light cuts the note: the lines under their heading
    assert entry.snippet == "Day: Deploys are blue-green. Staging first."
    assert (entry.start_line, entry.end_line) == (2, 3)


def test_a_note_edited_between_recalls_is_read_again(store: RecallStore, write: Any) -> None:
    # The recorder keeps the notes it read (and their cuts) while their size, mtime and inode
    # stay the same: an edit of any kind, even to the same size, is read afresh.
    path = "memory/2026-04-01.md"
    hit = {"path": path, "start_line": 2, "end_line": 2, "score": 0.5}
    write(path, "# Day\nDeploys are blue-green.\n")
    assert store.record("deploys", [hit]) == 1
    # the second is the first's size: only the mtime tells them apart
    edits = ("Deploys are red-black!", "Deploys are blue-red!!", "Deploys: rolling.")
    assert len(edits[0]) == len(edits[1])
    for text in edits:
        before = os.stat(store.root / path)
        write(path, f"# Day\n{text}\n")
        if os.stat(store.root / path).st_mtime_ns == before.st_mtime_ns:
            os.utime(store.root / path, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
        store.record("deploys", [hit])
        snippets = {e.snippet for e in store.load().values()}
        assert f"Day: {text}" in snippets, snippets


def test_day_bucket_uses_the_time_zone(workspace: Path) -> None:
    late_utc = FakeTime(datetime(2026, 4, 1, 23, 30, tzinfo=UTC))  # already Apr 2 in Tokyo
    RecallStore(workspace, clock=Clock("Asia/Tokyo", source=late_utc)).record("q1", [hit()])
    RecallStore(workspace, clock=Clock("America/New_York", source=late_utc)).record("q2", [hit()])
    (entry,) = RecallStore(workspace).load().values()
    assert entry.recall_days == ["2026-04-01", "2026-04-02"]


def test_mark_promoted(store: RecallStore, clock: FakeTime) -> None:
    store.record("q", [hit(), hit(start=10)])
    clock.now = DAY1 + timedelta(hours=1)
    key = "memory:memory/2026-04-01.md:1:2"
    changed = store.mark_promoted(
        {key: {"start_line": 3, "end_line": 4, "snippet": "Moved  text"}, "nope": {}}
    )
    assert changed == 1
    entries = store.load()
    assert entries[key].promoted_at == "2026-04-01T13:00:00.000Z"
    assert (entries[key].start_line, entries[key].end_line) == (3, 4)
    assert entries[key].snippet == "Moved text"
    assert entries["memory:memory/2026-04-01.md:10:11"].promoted_at is None
    assert store.counts()["promoted"] == 1


def test_counts_read_the_store_again_only_when_it_changed(
    store: RecallStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Status asks for the counts at every call; a store of thousands of entries took a tenth
    of a second to parse each time. A spy counts the reads of the file."""
    reads: list[Path] = []
    real_read = RecallStore._read

    def spy(self: RecallStore, path: Path) -> Any:
        reads.append(path)
        return real_read(self, path)

    monkeypatch.setattr(RecallStore, "_read", spy)
    store.record("q", [hit()])
    reads.clear()
    assert store.counts()["entries"] == 1
    assert len(reads) == 1
    other = RecallStore(workspace)  # status makes a store of its own at every call
    assert other.counts()["entries"] == 1
    other.counts()["entries"] = 99  # a caller's copy, not the kept one
    assert other.counts()["entries"] == 1
    assert len(reads) == 1, "the file had not changed"
    store.record("q2", [hit(start=10)])
    assert other.counts()["entries"] == 2, "a write is seen at the next count"
    store.path.write_text("not json")  # damaged from outside: counted again, and recovered
    assert store.counts()["entries"] == 1  # from .prev, the store before the last write


def test_load_normalises(store: RecallStore) -> None:
    good = {
        "path": "memory/2026-04-01.md",
        "startLine": 1,
        "endLine": 2,
        "source": "memory",
        "snippet": "Deploys  are\nblue-green.",
        "recallCount": 3,
        "queryHashes": [f"{i:012x}" for i in range(40)],
        "recallDays": [f"2026-03-{d:02d}" for d in range(1, 21)] + ["bad"],
    }
    entries = {
        "good": good,
        "bad-path": {**good, "path": "MEMORY.md"},
        "bad-int": {**good, "startLine": "1"},
        "bad-count": {**good, "recallCount": -1},
        "bad-source": {**good, "source": "sessions"},
        "bad-snippet": {**good, "snippet": "# just a heading"},
        "not-a-map": [1, 2],
    }
    store.dir.mkdir(parents=True)
    store.path.write_text(json.dumps({"version": 1, "entries": entries}))
    loaded = store.load()
    assert list(loaded) == ["good"]
    entry = loaded["good"]
    assert entry.snippet == "Deploys are blue-green."
    assert len(entry.query_hashes) == 32 and entry.query_hashes[-1] == f"{39:012x}"
    assert entry.recall_days == [f"2026-03-{d:02d}" for d in range(5, 21)]
    assert entry.concept_tags == concept_tags(entry.path, entry.snippet)
    assert store.counts() == {"entries": 1, "promoted": 0, "concept_tagged": 1, "spaced": 1}


# -- crash safety ------------------------------------------------------------------------------


def test_corrupt_store_falls_back_to_prev(store: RecallStore, clock: FakeTime) -> None:
    store.record("first", [hit()])
    store.record("second", [hit()])  # .prev now holds the store after "first"
    assert json.loads(store.prev_path.read_text())["entries"]
    store.path.write_text('{"version": 1, "entries": {"trunc')
    (entry,) = store.load().values()
    assert entry.recall_count == 1
    quarantined = list(store.dir.glob("short-term-recall.json.corrupt-*"))
    assert len(quarantined) == 1 and quarantined[0].read_text().endswith("trunc")
    store.record("third", [hit()])
    (entry,) = store.load().values()
    assert entry.recall_count == 2


def test_corrupt_store_without_prev_starts_empty(store: RecallStore) -> None:
    store.dir.mkdir(parents=True)
    store.path.write_bytes(b"\x00\x00garbage")
    assert store.load() == {}
    assert not store.path.exists()


def test_truncated_temp_file_is_ignored_and_cleaned(store: RecallStore) -> None:
    store.record("q", [hit()])
    old = store.dir / ".short-term-recall.json.tmp-999-abcd"
    old.write_text('{"version": 1, "entr')
    fresh = store.dir / ".short-term-recall.json.tmp-998-efgh"
    fresh.write_text("{")
    hour_ago = time.time() - 3700
    os.utime(old, (hour_ago, hour_ago))
    assert len(store.load()) == 1
    assert store.cleanup() == 1
    assert not old.exists() and fresh.exists()


CHILD_SAVE_LOOP = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memd.clock import Clock
    from memd.dreams.recall_store import RecallStore
    store = RecallStore(Path(sys.argv[1]), clock=Clock("UTC"))
    i = 0
    while True:
        hits = [{"path": "memory/2026-04-01.md", "start_line": n, "end_line": n, "score": 0.5,
                 "snippet": "entry number %d with some text to make the file longer" % n}
                for n in range(1, 30)]
        store.record("query %d" % i, hits)
        if i == 0:
            print("ready", flush=True)
        i += 1
    """
)


def test_sigkill_during_rewrites_never_leaves_a_broken_store(workspace: Path) -> None:
    store = RecallStore(workspace, clock=Clock("UTC"))
    rng = random.Random(7)
    for _ in range(20):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD_SAVE_LOOP, str(workspace)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0, 0.03))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        data = json.loads(store.path.read_text())  # parses as is, no fallback needed
        assert data["version"] == 1 and len(data["entries"]) == 29
        if store.lock_path.exists():  # the killed child's lock: let the stale rule take it
            past = time.time() - 61
            os.utime(store.lock_path, (past, past))
    assert len(store.load()) == 29
    store.cleanup(max_age_s=0)
    assert not list(store.dir.glob(".*.tmp-*"))


# -- locking -----------------------------------------------------------------------------------


def write_lock(store: RecallStore, pid: int, age_s: float) -> str:
    """A lock taken ``age_s`` ago by ``pid`` (naming its start time, as memd does, when the
    process runs)."""
    store.dir.mkdir(parents=True, exist_ok=True)
    try:
        started = f":{psutil.Process(pid).create_time():.3f}"
    except psutil.NoSuchProcess:
        started = ""
    text = f"{pid}:{int((time.time() - age_s) * 1000)}{started}\n"
    store.lock_path.write_text(text)
    then = time.time() - age_s
    os.utime(store.lock_path, (then, then))
    return text


def test_lock_written_and_removed(store: RecallStore) -> None:
    with store.locked():
        pid, ms, started = store.lock_path.read_text().strip().split(":")
        assert int(pid) == os.getpid()
        assert abs(int(ms) / 1000 - time.time()) < 5
        assert float(started) == pytest.approx(psutil.Process().create_time(), abs=1)
        with store.locked():  # re-entrant in the same thread
            pass
        assert store.lock_path.exists()
    assert not store.lock_path.exists()


def test_stale_lock_of_a_dead_pid_is_stolen(store: RecallStore) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_lock(store, gone.pid, age_s=61)
    assert store.record("q", [hit()]) == 1
    assert not store.lock_path.exists()


@pytest.mark.usefixtures("fast_lock")
def test_stale_lock_with_unparsable_pid_is_stolen(store: RecallStore) -> None:
    store.dir.mkdir(parents=True)
    store.lock_path.write_text("not-a-pid\n")
    past = time.time() - 61
    os.utime(store.lock_path, (past, past))
    assert store.record("q", [hit()]) == 1


@pytest.mark.usefixtures("fast_lock")
@pytest.mark.parametrize("pid", [os.getppid(), 1])
def test_stale_lock_of_a_live_pid_is_kept(store: RecallStore, pid: int) -> None:
    text = write_lock(store, pid, age_s=61)
    started = time.monotonic()
    with pytest.raises(Busy, match="Timed out waiting for short-term promotion lock"):
        store.record("q", [hit()])
    assert time.monotonic() - started < 1.0
    assert store.lock_path.read_text() == text


@pytest.mark.usefixtures("fast_lock")
def test_fresh_lock_of_a_dead_pid_is_stolen_at_once(store: RecallStore) -> None:
    """Waiting for the stale age would make every write BUSY for a minute after a crash
    (tests/test_recall_lock.py has the killed holders)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_lock(store, gone.pid, age_s=5)  # dead holder, not yet stale
    assert store.record("q", [hit()]) == 1
    assert not store.lock_path.exists()


def test_threads_queue_on_one_store(workspace: Path) -> None:
    def work(n: int) -> None:
        s = RecallStore(workspace, clock=Clock("UTC"))
        for i in range(10):
            s.record(f"thread {n} query {i}", [hit()])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (entry,) = RecallStore(workspace).load().values()
    assert entry.recall_count == 40


CHILD_RECORD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memd.clock import Clock
    from memd.dreams.recall_store import RecallStore
    store = RecallStore(Path(sys.argv[1]), clock=Clock("UTC"))
    hit = {"path": "memory/2026-04-01.md", "start_line": 1, "end_line": 2, "score": 0.5,
           "snippet": "Deploys are blue-green."}
    for i in range(50):
        store.record("%s query %d" % (sys.argv[2], i), [hit])
    """
)


def test_two_processes_racing(workspace: Path) -> None:
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD_RECORD, str(workspace), name])
        for name in ("a", "b")
    ]
    for child in children:
        assert child.wait(timeout=60) == 0
    store = RecallStore(workspace)
    json.loads(store.path.read_text())
    (entry,) = store.load().values()
    assert entry.recall_count == 100
    assert entry.total_score == pytest.approx(50.0)
    assert not store.lock_path.exists()


def test_recorder_keeps_its_own_writes_and_sees_everyone_elses(
    workspace: Path, clock: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon's recorder keeps the entries it last saved instead of re-parsing its own
    # file on every batch; a write by anyone else (promotion in memctl, a hand edit) must
    # still be seen by its next batch, not overwritten with the recorder's stale copy.
    recorder = RecallStore(workspace, clock=Clock("UTC", source=clock))
    reads: list[Path] = []
    real_read = recorder._read
    monkeypatch.setattr(recorder, "_read", lambda p: reads.append(p) or real_read(p))
    recorder.record("deploy", [hit()])
    recorder.record("rollback", [hit()])
    recorder.record("canary", [hit(start=10)])
    assert reads == [recorder.path]  # parsed once, then its own writes are trusted

    key = "memory:memory/2026-04-01.md:1:2"
    other = RecallStore(workspace, clock=Clock("UTC", source=clock))
    assert other.mark_promoted({key: {}}) == 1
    recorder.record("deploy again", [hit()])
    entries = RecallStore(workspace, clock=Clock("UTC")).load()
    assert entries[key].promoted_at is not None  # the promotion survived the next batch
    assert len(entries[key].query_hashes) == 3

    # A hand edit in place (same inode) is seen too.
    data = json.loads(recorder.path.read_text())
    data["entries"][key]["recallCount"] = 40
    recorder.path.write_text(json.dumps(data))
    recorder.record("deploy once more", [hit()])
    assert RecallStore(workspace, clock=Clock("UTC")).load()[key].recall_count == 41


def test_recorder_gathers_searches_into_few_rewrites(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy daemon's searches must not each rewrite the store (a rewrite holds the GIL the
    # searches need): the recorder lets them gather, then counts every one of them.
    from memd.dreams.recorder import RecallRecorder

    batches: list[int] = []
    real = RecallStore.record_many

    def spy(self: RecallStore, searches: Any, **kw: Any) -> int:
        batches.append(len(searches))
        return real(self, searches, **kw)

    monkeypatch.setattr(RecallStore, "record_many", spy)
    recorder = RecallRecorder(clock=Clock("UTC"))
    recorder.start()
    try:
        for i in range(40):
            recorder.submit(workspace, f"query {i}", [hit()])
            time.sleep(0.005)
        assert recorder.wait_idle(10)
    finally:
        recorder.stop()
    assert sum(batches) == 40
    assert len(batches) <= 3  # 40 searches over ~0.2 s: gathered, not written one by one
    (entry,) = RecallStore(workspace, clock=Clock("UTC")).load().values()
    assert entry.recall_count == 40  # every search counted; query hashes capped at 32
    assert len(entry.query_hashes) == 32


def test_the_recorder_writes_a_large_store_less_often(workspace: Path) -> None:
    # A store grows with what gets recalled (8.7 MB at 10,000 entries); rewriting it every
    # second wrote that much a second all day. The wait grows with the size written: at most
    # WRITE_BUDGET bytes a second, never longer than GATHER_MAX_S.
    from memd.dreams import recorder as rec

    assert rec.gather_seconds(0) == rec.GATHER_S
    assert rec.gather_seconds(rec.WRITE_BUDGET * 10) == pytest.approx(10.0)
    assert rec.gather_seconds(10**12) == rec.GATHER_MAX_S
    store = RecallStore(workspace, clock=Clock("UTC"))
    for i in range(1500):  # about 1.2 MB of entries
        store.record(f"q{i}", [hit(path=f"memory/2026-04-{1 + i % 28:02d}.md", start=i + 1)])
    size = store.path.stat().st_size
    assert size > 3 * rec.WRITE_BUDGET
    recorder = rec.RecallRecorder(clock=Clock("UTC"))
    recorder.start()
    try:
        assert recorder.gather_s == rec.GATHER_S
        recorder.submit(workspace, "one more", [hit()])
        assert recorder.wait_idle(30)
        assert recorder.gather_s == pytest.approx(rec.gather_seconds(store.path.stat().st_size))
        assert recorder.gather_s > 3
    finally:
        recorder.stop()


def test_the_recorder_queue_is_bounded_in_memory(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Searches wait up to a minute in the queue before a large store is written; past
    # max_bytes a search's recalls are dropped and counted (never waited for), a warning says
    # so, and what is written makes room again. The thread starts late: the queue fills first.
    from memd.dreams import recorder as rec

    recorder = rec.RecallRecorder(clock=Clock("UTC"))
    each = rec.HIT_BYTES + sys.getsizeof(SNIPPET)
    recorder.max_bytes = 10 * each
    for i in range(25):
        recorder.submit(workspace, f"query {i}", [hit(start=2 * i + 1, match_lines=[2 * i + 1])])
    assert (recorder.dropped, recorder._bytes) == (15, 10 * each)
    warned = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
    assert warned == [  # the first drop and the tenth, not each
        "recall recorder behind: 1 searches' recalls not recorded",
        "recall recorder behind: 10 searches' recalls not recorded",
    ]
    recorder.start()
    try:
        assert recorder.wait_idle(10)
        assert recorder._bytes == 0
        recorder.submit(workspace, "room again", [hit(start=99)])
        assert recorder.wait_idle(10)
    finally:
        recorder.stop()
    assert recorder.dropped == 15
    entries = RecallStore(workspace, clock=Clock("UTC")).load().values()
    assert sorted(e.start_line for e in entries) == [*range(1, 21, 2), 99]
    assert all(e.snippet for e in entries)  # what the queue kept is what an entry needs


def test_prev_is_the_replaced_store_by_a_second_name(store: RecallStore) -> None:
    # The recorder's own last write becomes .prev by a hard link, not a copy of its bytes.
    store.record("first", [hit()])
    first = store.path.stat()
    text = store.path.read_text()
    store.record("second", [hit()])
    prev = store.prev_path.stat()
    assert (prev.st_ino, prev.st_dev) == (first.st_ino, first.st_dev)
    assert store.prev_path.read_text() == text
    assert store.path.stat().st_ino != first.st_ino
    assert stat.S_IMODE(prev.st_mode) == 0o600
    assert not list(store.dir.glob(".*tmp-link*"))


# -- a store OpenClaw archived -----------------------------------------------------------------


def test_a_store_openclaw_archived_is_taken_back_once(store: RecallStore, clock: FakeTime) -> None:
    """OpenClaw's state migration renames the store to short-term-recall.json.migrated (its
    doctor does that even when memd holds the memory slot); memd counts those recalls again."""
    store.record("q1", [hit(score=0.5), hit(start=5)])
    clock.now += timedelta(days=1)
    store.record("q2", [hit(score=0.7)])
    before = store.load()
    assert before[entry_key("memory/2026-04-01.md", 1, 2)].recall_count == 2
    store.path.rename(store.dir / "short-term-recall.json.migrated")  # what OpenClaw does
    clock.now += timedelta(days=1)
    store.record("q3", [hit(score=0.9)])  # a new store, started from nothing
    entries = store.load()
    merged = entries[entry_key("memory/2026-04-01.md", 1, 2)]
    assert merged.recall_count == 3
    assert merged.total_score == pytest.approx(0.5 + 0.7 + 0.9)
    assert merged.max_score == 0.9
    assert len(merged.recall_days) == 3 and len(merged.query_hashes) == 3
    assert merged.first_recalled_at == before[merged.key].first_recalled_at
    assert entry_key("memory/2026-04-01.md", 5, 6) in entries  # only in the archive
    # Taken back once: the archive stays (OpenClaw looks for it) and is not counted again.
    assert (store.dir / "short-term-recall.json.migrated").exists()
    store.record("q4", [hit(start=5)])
    again = RecallStore(store.root, clock=Clock("UTC", source=clock)).load()
    assert again[merged.key].recall_count == 3
    assert again[entry_key("memory/2026-04-01.md", 5, 6)].recall_count == 2
