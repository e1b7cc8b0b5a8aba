"""The recall store's lock after a crash: a lock whose process is gone (killed, a zombie, or its
pid taken by another process since) is broken at once; a live holder's lock is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.dreams import recall_lock
from memd.dreams.recall_lock import file_lock
from memd.dreams.recall_store import RecallStore
from memd.workspace import dreams_folder
from memd_client.errors import Busy

from .daemon_fixture import running_daemon

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memd.dreams.recall_lock import file_lock
    with file_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(600)
    """
)


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting 2 s instead of 10 for the lock: a lock that is not broken at once shows as Busy
    (the stale age, 60 s, stays as it is)."""
    monkeypatch.setattr(recall_lock, "LOCK_TIMEOUT_S", 2.0)
    monkeypatch.setattr(recall_lock, "LOCK_RETRY_S", 0.01)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A real process that took the lock (as the daemon does) and holds it."""
    lock = tmp_path / "dreams" / "short-term-promotion.lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    yield proc, lock
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    proc.stdout.close()


def test_the_lock_of_a_sigkilled_process_is_broken_at_once(
    holder: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, lock = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lock.read_text().startswith(f"{proc.pid}:"), "the dead process's lock is left behind"
    with file_lock(lock):
        assert lock.read_text().startswith(f"{os.getpid()}:")
    assert not lock.exists()


def test_the_lock_of_a_killed_process_not_yet_reaped_is_broken(
    holder: tuple[subprocess.Popen[str], Path],
) -> None:
    """A zombie still answers kill(pid, 0); it holds nothing."""
    proc, lock = holder
    proc.send_signal(signal.SIGKILL)
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    with file_lock(lock):
        pass


def test_a_live_holder_keeps_its_lock(holder: tuple[subprocess.Popen[str], Path]) -> None:
    proc, lock = holder
    text = lock.read_text()
    with pytest.raises(Busy, match="Timed out waiting for short-term promotion lock"):
        with file_lock(lock):
            pass
    assert lock.read_text() == text and proc.poll() is None


def test_a_pid_taken_by_another_process_does_not_hold_the_lock(tmp_path: Path) -> None:
    """The lock names a live pid, but the process behind it started at another time than the
    one that took the lock: the holder is gone and its pid was reused."""
    lock = tmp_path / "short-term-promotion.lock"
    other = psutil.Process(os.getppid())
    lock.write_text(f"{other.pid}:{int(time.time() * 1000)}:{other.create_time() + 3600:.3f}\n")
    with file_lock(lock):
        pass
    # The same pid with its own start time is that process: alive, the lock kept.
    lock.write_text(f"{other.pid}:{int(time.time() * 1000)}:{other.create_time():.3f}\n")
    with pytest.raises(Busy):
        with file_lock(lock):
            pass


def test_openclaws_form_without_a_start_time(tmp_path: Path) -> None:
    """``pid:epochMs`` (OpenClaw's): a process started after the lock was taken is not its
    holder; one started before may be, and keeps it."""
    lock = tmp_path / "short-term-promotion.lock"
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock.write_text(f"{later.pid}:{int((time.time() - 3600) * 1000)}\n")
        with file_lock(lock):
            pass
        lock.write_text(f"{later.pid}:{int(time.time() * 1000) + 5000}\n")
        with pytest.raises(Busy):
            with file_lock(lock):
                pass
    finally:
        later.kill()
        later.wait()


def test_a_lock_naming_no_process_waits_for_the_stale_age(tmp_path: Path) -> None:
    """An empty lock file is one being written this instant: never broken while young."""
    lock = tmp_path / "short-term-promotion.lock"
    for text in ("", "not-a-pid\n", "99999999999999999999:1\n"):
        lock.write_text(text)
        with pytest.raises(Busy):
            with file_lock(lock):
                pass
        past = time.time() - 61
        os.utime(lock, (past, past))
        with file_lock(lock):
            pass


def test_a_recall_after_a_crash_is_not_busy(tmp_path: Path) -> None:
    """The store a crashed writer left locked takes the next recall at once."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-04-01.md").write_text("Deploys are blue-green.\n")
    store = RecallStore(ws, folder=tmp_path / "dreams", clock=Clock("UTC"))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.lock_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert store.lock_path.exists()
    hit = {"path": "memory/2026-04-01.md", "start_line": 1, "end_line": 1, "score": 0.9}
    assert store.record("deploys", [hit]) == 1


def test_a_daemon_takes_recalls_after_a_killed_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed while it held the store's lock (a daemon under SIGKILL): the running
    daemon's next recall is not BUSY, with its full 10 s wait in force."""
    monkeypatch.setattr(recall_lock, "LOCK_TIMEOUT_S", 10.0)  # the daemon's own wait
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-04-01.md").write_text("Deploys are blue-green.\n")
    config = Config.load()
    lock = RecallStore(ws, folder=dreams_folder(config, ws.resolve())).lock_path
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait()
    proc.stdout.close()
    hit = {"path": "memory/2026-04-01.md", "start_line": 1, "end_line": 1, "score": 0.9}
    with running_daemon(config) as daemon, memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="ws")
        assert lock.exists()
        assert c.call("record_recall", workspace="ws", query="deploys", results=[hit]) == {
            "recorded": 1
        }
    assert not lock.exists()
