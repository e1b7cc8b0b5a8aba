"""Appends under idempotency keys survive a SIGKILL of the daemon: retried with their keys
after a restart, every text is in the daily log exactly once, whichever instant the daemon
died (each named point around the append, and random instants), and each retry's reply
points at the lines the text is on."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memd_client
from memd.once import AppendKeys, KeyRecord, landed
from memd_client.errors import BadRequest

from .crash_helpers import Daemon, daemon_env

POINTS = ("append:received", "append:intent", "append:written", "append:done")
RANDOM_KILLS = int(os.environ.get("MEMD_CRASH_POINTS", "4"))
SEED = int(os.environ.get("MEMD_CRASH_SEED") or random.SystemRandom().randrange(2**31))
N = 8


def text_of(i: int) -> str:
    return f"Decision {i}: the release train number {i} leaves from platform {i * 7}."


@pytest.fixture(autouse=True)
def no_autostart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client must not start a daemon of its own while the test's is dead."""
    monkeypatch.setenv("MEMD_AUTOSTART", "0")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_env(tmp_path) as d:
        yield d


def make_ws(root: Path, existing: str = "") -> Path:
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n")
    if existing:  # a daily log a human started (today's: the daemon's clock is the real one)
        for day in {time.strftime("%Y-%m-%d"), time.strftime("%Y-%m-%d", time.gmtime())}:
            (root / "memory" / f"{day}.md").write_text(existing)
    return root


def append_all(daemon: Daemon, keys: list[str], *, timeout: float = 30) -> dict[int, Any]:
    """Send the N appends at once, one connection each; what each got (a reply or the error
    of a daemon that died under it)."""
    got: dict[int, Any] = {}

    def one(i: int) -> None:
        try:
            with daemon.client(timeout=timeout) as c:
                got[i] = c.append("ws", text_of(i), idempotency_key=keys[i])
        except memd_client.MemdError as exc:
            got[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got


def check_once(ws: Path, replies: dict[int, Any]) -> list[str]:
    """Every text on exactly one line of the daily logs, and each reply pointing at it."""
    problems = []
    logs = sorted((ws / "memory").glob("*.md"))
    lines = {p.relative_to(ws).as_posix(): p.read_text().splitlines() for p in logs}
    for i in range(N):
        where = [(path, n + 1) for path, ls in lines.items() for n, line in enumerate(ls)]
        found = [(path, n) for path, n in where if lines[path][n - 1] == text_of(i)]
        if len(found) != 1:
            problems.append(f"text {i} is on {len(found)} lines: {found}")
            continue
        reply = replies[i]
        if not isinstance(reply, dict):
            problems.append(f"retry {i} failed: {reply!r}")
        elif (reply["path"], reply["start_line"]) != found[0] or reply["end_line"] != found[0][1]:
            problems.append(f"retry {i} points at {reply['path']}#{reply['start_line']}: {found}")
    return problems


def crash_and_retry(daemon: Daemon, ws: Path, crash_at: str = "", delay: float = -1.0) -> str:
    """Start memd (dying at ``crash_at``, or SIGKILLed after ``delay`` s), send the appends,
    restart, retry them all with their keys; return what the first run did, for messages."""
    daemon.start(crash_at=crash_at)
    with daemon.client() as c:
        c.workspace_add(str(ws), name="ws")
    keys = [f"key-{i}-{random.random()}" for i in range(N)]
    if delay >= 0:
        killer = threading.Timer(delay, daemon.kill)
        killer.start()
        first = append_all(daemon, keys)
        killer.join()
    else:
        first = append_all(daemon, keys)
    daemon.kill()  # reaps it; a no-op when it died at its crash point
    code = daemon.procs[-1].returncode
    if crash_at:
        assert code == -signal.SIGKILL, f"memd did not die at {crash_at}: {daemon.log_tail()}"
    daemon.start()
    retried = append_all(daemon, keys)
    problems = check_once(ws, retried)
    summary = {i: "ok" if isinstance(r, dict) else type(r).__name__ for i, r in first.items()}
    assert not problems, f"{crash_at or delay} first run {summary}: {problems}\n{daemon.log_tail()}"
    with daemon.client() as c:  # the retried texts are searchable when the retry returns
        for i in range(N):
            hits = c.search("ws", f"platform {i * 7}", mode="keyword", min_score=0.0)["results"]
            assert any(text_of(i) in h["snippet"] for h in hits), (i, hits)
    assert daemon.stop() == 0
    return str(summary)


@pytest.mark.parametrize("existing", ["", "A human's note without a final newline"])
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_point_then_retries_write_each_text_once(
    daemon: Daemon, tmp_path: Path, point: str, existing: str
) -> None:
    crash_and_retry(daemon, make_ws(tmp_path / "ws", existing), crash_at=point)


@pytest.mark.parametrize("kill", range(RANDOM_KILLS))
def test_sigkill_at_a_random_instant_then_retries_write_each_text_once(
    daemon: Daemon, tmp_path: Path, kill: int
) -> None:
    delay = random.Random(f"{SEED}-{kill}").uniform(0.0, 0.15)
    crash_and_retry(daemon, make_ws(tmp_path / "ws"), delay=delay)


def test_a_human_edit_after_the_crash_is_kept_and_the_text_not_doubled(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Killed after the text was written; a human then appends and an editor saves the file
    anew (another inode): the retry finds the text where it is now and writes nothing."""
    ws = make_ws(tmp_path / "ws")
    daemon.start(crash_at="append:written")
    with daemon.client() as c:
        c.workspace_add(str(ws), name="ws")
    with pytest.raises(memd_client.MemdError), daemon.client() as c:
        c.append("ws", text_of(0), idempotency_key="k0")
    daemon.kill()
    (log,) = (ws / "memory").glob("*.md")
    saved = "# Today\n" + log.read_text() + "- and a human's line after it\n"
    log.unlink()
    log.write_text(saved)
    daemon.start()
    with daemon.client() as c:
        reply = c.append("ws", text_of(0), idempotency_key="k0")
        assert reply["duplicate"] and reply["start_line"] == 2
        with pytest.raises(BadRequest, match="already used for another text"):
            c.append("ws", "Another text entirely.", idempotency_key="k0")
    assert log.read_text() == saved
    assert daemon.stop() == 0


def test_a_text_lost_with_the_crash_is_written_by_the_retry(daemon: Daemon, tmp_path: Path) -> None:
    """Killed after the intent, before the write; a human appended meanwhile: the retry does
    not take the human's lines for the text, and writes it."""
    ws = make_ws(tmp_path / "ws", existing="- first\n")
    daemon.start(crash_at="append:intent")
    with daemon.client() as c:
        c.workspace_add(str(ws), name="ws")
    with pytest.raises(memd_client.MemdError), daemon.client() as c:
        c.append("ws", text_of(1), idempotency_key="k1")
    daemon.kill()
    logs = sorted((ws / "memory").glob("*.md"))
    for log in logs:
        with log.open("a") as f:
            f.write("- a human wrote this\n")
    daemon.start()
    with daemon.client() as c:
        reply = c.append("ws", text_of(1), idempotency_key="k1")
    assert not reply.get("duplicate")
    text = (ws / reply["path"]).read_text().splitlines()
    assert text.count(text_of(1)) == 1 and text[reply["start_line"] - 1] == text_of(1)
    assert daemon.stop() == 0


# -- the journal itself ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_keys_expire_after_the_retry_window_and_the_journal_stays_bounded(
    tmp_path: Path,
) -> None:
    ws = make_ws(tmp_path / "ws")
    journal = tmp_path / "state" / "append-keys.jsonl"
    clock = Clock()
    keys = AppendKeys(journal, kept=50, seconds=600, clock=clock)
    for i in range(1500):
        keys.intend(ws, f"k{i}", f"text {i}", "memory/2026-01-01.md")
        keys.done(ws, f"k{i}", {"path": "memory/2026-01-01.md", "start_line": i, "end_line": i})
        clock.now += 0.01
    lines = journal.read_text().count("\n")
    assert lines <= 2 * 50 + AppendKeys.JOURNAL_SLACK + 2, lines
    assert keys.recall(ws, "k1499", "text 1499") == {
        "path": "memory/2026-01-01.md",
        "start_line": 1499,
        "end_line": 1499,
    }
    assert keys.recall(ws, "k0", "text 0") is None  # beyond the 50 kept
    keys.close()
    # A restart reads the journal back; the window is counted in wall-clock time.
    clock.now += 599
    again = AppendKeys(journal, kept=50, seconds=600, clock=clock)
    assert again.recall(ws, "k1499", "text 1499") is not None
    with pytest.raises(BadRequest):
        again.recall(ws, "k1499", "another text")
    clock.now += 2
    assert again.recall(ws, "k1499", "text 1499") is None
    again.close()
    assert AppendKeys(journal, kept=50, seconds=600, clock=clock)._records == {}


def test_a_torn_last_line_of_the_journal_is_skipped(tmp_path: Path) -> None:
    ws = make_ws(tmp_path / "ws")
    journal = tmp_path / "append-keys.jsonl"
    keys = AppendKeys(journal)
    keys.intend(ws, "a", "text a", "memory/2026-01-01.md")
    keys.close()
    with journal.open("ab") as f:
        f.write(b'{"k":"0123","f":"ab')  # the crash cut this one short
    again = AppendKeys(journal)
    assert again.recall(ws, "a", "text a") is None  # intended, never written: not landed
    with pytest.raises(BadRequest):
        again.recall(ws, "a", "text b")
    again.close()


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ("", "T\n", (1, 1)),
        ("a\n", "a\nT\n", (2, 2)),
        ("a", "a\nT\n", (2, 2)),  # memd added the missing newline first
        ("a\n", "a\nb\nT\n", (3, 3)),  # another append landed first
        ("a\n", "a\nxT\n", None),  # not at the start of a line
        ("T\n", "T\n", None),  # there before the intent: not this key's
        ("a\n", "a\nb\n", None),
    ],
)
def test_landed_looks_after_the_recorded_size(
    tmp_path: Path, before: str, after: str, expected: tuple[int, int] | None
) -> None:
    path = tmp_path / "log.md"
    path.write_text(before)
    st = path.stat()
    record = KeyRecord("", "log.md", st.st_dev, st.st_ino, st.st_size, 0.0)
    with path.open("r+") as f:
        f.write(after)
    assert landed(tmp_path, record, "T") == expected
