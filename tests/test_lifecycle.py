"""memd run as a real process: readiness, a second instance, signals, stale sockets, other users."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd.daemon import EXIT_ALREADY_RUNNING, EXIT_OK, EXIT_STARTUP_FAILURE

from .daemon_fixture import short_socket_dir


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(sock: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake", MEMD_SOCKET=str(sock))
    return subprocess.Popen(
        [sys.executable, "-m", "memd", "--log-level", "info", "run", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(sock: Path, proc: subprocess.Popen[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"memd exited {proc.returncode}: {proc.communicate()[1]}")
        try:
            with memd_client.connect(sock, timeout=2) as c:
                c.call("hello")
                return
        except memd_client.MemdError:
            time.sleep(0.05)
    raise AssertionError("memd did not become ready")


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def test_sigterm_stops_cleanly_and_removes_the_socket(sock_dir: Path) -> None:
    sock = sock_dir / "memd.sock"
    proc = start(sock)
    wait_ready(sock, proc)
    assert oct(sock.stat().st_mode & 0o777) == "0o600"
    assert oct(sock_dir.stat().st_mode & 0o777) == "0o700"
    code, err = stop(proc)
    assert code == EXIT_OK, err
    assert not sock.exists()
    assert "Traceback" not in err


def test_second_instance_refuses_to_start(sock_dir: Path) -> None:
    sock = sock_dir / "memd.sock"
    first = start(sock)
    try:
        wait_ready(sock, first)
        second = start(sock)
        code, err = (
            stop(second)
            if second.wait(20) is None
            else (second.returncode, second.communicate()[1])
        )
        assert code == EXIT_ALREADY_RUNNING
        assert "already running" in err
        with memd_client.connect(sock) as c:  # the first one is unharmed
            assert c.call("hello")["server"] == "memd"
    finally:
        stop(first)


def test_stale_socket_from_a_killed_daemon_is_replaced(sock_dir: Path) -> None:
    sock = sock_dir / "memd.sock"
    proc = start(sock)
    wait_ready(sock, proc)
    proc.kill()
    proc.communicate()
    assert sock.exists(), "SIGKILL leaves the socket file behind"
    again = start(sock)
    try:
        wait_ready(sock, again)
    finally:
        assert stop(again)[0] == EXIT_OK


def test_socket_directory_must_be_private(sock_dir: Path) -> None:
    os.chmod(sock_dir, 0o755)
    proc = start(sock_dir / "memd.sock")
    code, err = stop(proc) if proc.wait(20) is None else (proc.returncode, proc.communicate()[1])
    assert code == EXIT_STARTUP_FAILURE
    assert "not private" in err and "chmod 700" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another uid")
def test_other_users_are_refused(sock_dir: Path) -> None:
    sock = sock_dir / "memd.sock"
    proc = start(sock)
    try:
        wait_ready(sock, proc)
        # Open the door as wide as a careless admin would; the peer-uid check must still hold.
        os.chmod(sock_dir, 0o755)
        os.chmod(sock, 0o666)
        probe = (
            "import os, socket, msgpack\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX); s.settimeout(10)\n"
            f"s.connect({str(sock)!r})\n"
            "try:\n"
            "    s.sendall(msgpack.packb([0, 1, 'hello', []]))\n"
            "    data = s.recv(100)\n"
            "except (ConnectionResetError, BrokenPipeError):\n"
            "    data = b''\n"
            "print('ANSWERED' if data else 'REFUSED')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30
        )
        assert out.stdout.strip() == "REFUSED", out.stderr
        with memd_client.connect(sock) as c:
            assert c.call("hello")["server"] == "memd"
    finally:
        os.chmod(sock_dir, 0o700)
        stop(proc)


def test_sd_notify_ready_is_sent_when_the_socket_accepts(sock_dir: Path) -> None:
    notify = sock_dir / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify))
    listener.settimeout(20)
    sock = sock_dir / "memd.sock"
    env = dict(
        os.environ, MEMD_EMBEDDING_PROVIDER="fake", MEMD_SOCKET=str(sock), NOTIFY_SOCKET=str(notify)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        message = listener.recv(100).decode()
        assert message == "READY=1"
        with memd_client.connect(sock) as c:  # READY means the socket already accepts
            assert c.call("hello")["server"] == "memd"
    finally:
        listener.close()
        stop(proc)
