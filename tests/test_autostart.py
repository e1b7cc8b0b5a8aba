"""Clients start memd when nothing listens: one starter wins, the others wait for it.

Real processes throughout: clients in processes of their own race to start a real `memd run`,
and the memd they start outlives them. Each test stops the memd it caused (its pid is in the
state directory's lock file).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import memd_client
import memd_client.aio
from memd.ctl.memctl import cli
from memd_client.autostart import LOCK_NAME

from .daemon_fixture import short_socket_dir, wait_for


@pytest.fixture
def autostart(memd_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Autostart on, memd's socket in a short private directory; yields the socket path and
    stops whatever memd was started for it."""
    monkeypatch.setenv("MEMD_AUTOSTART", "1")
    monkeypatch.setenv("MEMD_EMBEDDING_PROVIDER", "fake")  # what the started memd inherits
    directory = short_socket_dir()
    sock = directory / "memd.sock"
    monkeypatch.setenv("MEMD_SOCKET", str(sock))
    try:
        yield sock
    finally:
        _stop_memd(memd_home / "state" / "memd.lock")
        for leftover in directory.iterdir():
            leftover.unlink()
        directory.rmdir()


def _stop_memd(lock: Path) -> None:
    """SIGTERM the memd whose pid is in ``lock`` (if it is still a memd), and wait for it."""
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"memd" not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), f"memd {pid} to stop")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


_CLIENT = """\
import sys, time, memd_client
with memd_client.connect(sys.argv[1], timeout=90) as c:
    hello = c.hello()
print(hello["pid"], hello["started"]["by"], flush=True)
"""


def test_ten_clients_racing_to_start_memd_get_one_daemon(autostart: Path) -> None:
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENT, str(autostart)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(10)
    ]
    answers = []
    for proc in clients:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        answers.append(out.split(maxsplit=1))
    pids = {int(pid) for pid, _ in answers}
    assert len(pids) == 1, answers  # every client talks to the same memd
    (by,) = {who.strip() for _, who in answers}
    # It was started by one of them, which says so; memd is nobody's child.
    starter = int(by.rsplit("pid ", 1)[1].rstrip(")"))
    assert starter in {p.pid for p in clients}
    (pid,) = pids
    assert pid not in {p.pid for p in clients}
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    assert ppid not in {p.pid for p in clients} | {os.getpid()}
    # Exactly one memd was started: the others waited for it rather than starting their own.
    log = Path(os.environ["MEMD_HOME"]) / "state" / "memd.log"
    assert log.read_text().count(" ready on ") == 1


def test_the_asyncio_client_starts_memd_too(autostart: Path) -> None:
    async def main() -> dict[str, object]:
        async with memd_client.aio.connect(autostart, timeout=90) as c:
            return dict(await c.hello())

    hello = asyncio.run(main())
    started = hello["started"]
    assert isinstance(started, dict) and started["how"] == "on demand"


def test_memctl_starts_memd_and_status_says_how(autostart: Path) -> None:
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    assert "Started: on demand by " in result.output
    # `memctl start` with memd running: nothing to do, it says so.
    result = CliRunner().invoke(cli, ["start", "--json"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)
    assert reply["started"] is False and reply["socket"] == str(autostart)


def test_memctl_start_starts_it_whatever_memd_autostart_says(
    autostart: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMD_AUTOSTART", "0")
    result = CliRunner().invoke(cli, ["start"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Started memd (pid ")
    with memd_client.connect(autostart) as c:
        assert c.hello()["started"]["how"] == "on demand"


def test_autostart_off_fails_as_before_and_says_why(
    autostart: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMD_AUTOSTART", "0")
    with pytest.raises(memd_client.DaemonNotRunning, match="MEMD_AUTOSTART is off"):
        memd_client.connect(autostart)
    result = CliRunner().invoke(cli, ["search", "x", "-w", "/tmp"])
    assert result.exit_code == 3
    assert not autostart.exists()
    # Asked for in code, it starts whatever the variable says.
    with memd_client.connect(autostart, autostart=True, timeout=90) as c:
        assert c.hello()["started"]["how"] == "on demand"


def test_a_memd_that_cannot_start_is_reported_in_its_own_words(
    autostart: Path, memd_home: Path
) -> None:
    os.chmod(autostart.parent, 0o755)  # the socket directory is not private: memd refuses it
    with pytest.raises(memd_client.DaemonNotRunning) as info:
        memd_client.connect(autostart, timeout=90)
    message = str(info.value)
    assert "could not start" in message and "not private" in message
    assert "chmod 700" in message and "memd.log" in message
    result = CliRunner().invoke(cli, ["start"])
    assert result.exit_code == 3 and "not private" in result.output


def test_the_start_lock_and_log_are_private(autostart: Path, memd_home: Path) -> None:
    with memd_client.connect(autostart, timeout=90) as c:
        c.hello()
    lock = autostart.parent / LOCK_NAME
    log = memd_home / "state" / "memd.log"
    assert lock.stat().st_mode & 0o777 == 0o600
    assert log.stat().st_mode & 0o777 == 0o600
    assert autostart.parent.stat().st_mode & 0o777 == 0o700


def test_a_client_waits_for_a_memd_being_started_by_hand(autostart: Path) -> None:
    """`memd run` holds the start lock until its socket accepts: a client that finds nothing
    listening meanwhile waits for that memd rather than starting a second one."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd", "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = autostart.parent / LOCK_NAME
        wait_for(lambda: lock.exists() and _held(lock), "memd run to take the start lock")
        with memd_client.connect(autostart, timeout=90) as c:
            hello = c.hello()
        assert hello["pid"] == proc.pid and hello["started"]["how"] == "by hand"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not (Path(os.environ["MEMD_HOME"]) / "state" / "memd.log").exists()  # no autostart


def _held(lock: Path) -> bool:
    import fcntl

    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
