"""Socket activation: memd serves on a listening socket a service manager passes it.

Most tests pass the socket the way systemd does, with real processes: a listening socket at
descriptor 3, LISTEN_FDS=1 and LISTEN_PID set to memd's own pid (a small launcher puts them
in place and execs memd, which keeps its pid). One runs systemd's own ``systemd-socket-activate``, and one a real systemd user manager;
each is skipped, saying so, where the machine has no such thing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd.daemon import EXIT_OK, EXIT_STARTUP_FAILURE
from memd.ipc.server import Server
from memd_client.protocol import (
    MAX_RESPONSE_BYTES,
    REQUEST,
    RESPONSE,
    Response,
    make_unpacker,
    pack,
    parse,
)

from .daemon_fixture import short_socket_dir, wait_for

_OPEN: list[socket.socket] = []


def closing_later(conn: socket.socket) -> socket.socket:
    """A client socket closed when the test ends, whatever happens."""
    _OPEN.append(conn)
    return conn


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir()
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def listening(path: Path) -> socket.socket:
    """A socket listening at ``path``, as systemd's memd.socket opens it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock


# What systemd does between fork and exec for a socket-activated service.
_AS_SYSTEMD = """\
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.executable, [sys.executable, "-m", "memd", "--log-level", "info", "run"])
"""


def activate(sock: socket.socket, *extra_env: str) -> subprocess.Popen[str]:
    """Start `memd run` the way systemd starts a socket-activated service."""
    fd = sock.fileno()
    env = dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake")
    env.pop("MEMD_SOCKET", None)  # memd learns its socket from the descriptor
    for assignment in extra_env:
        name, _, value = assignment.partition("=")
        env[name] = value
    return subprocess.Popen(
        [sys.executable, "-c", _AS_SYSTEMD, str(fd)],
        env=env,
        pass_fds=(fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def hello_bytes(msgid: int = 1) -> bytes:
    return pack([REQUEST, msgid, "hello", [{"client": "queued"}]])


def read_reply(conn: socket.socket, proc: subprocess.Popen[str]) -> Response:
    """The reply memd (``proc``) sends on ``conn``; fails with memd's log if memd stops."""
    unpacker = make_unpacker(MAX_RESPONSE_BYTES)
    conn.settimeout(0.5)
    for _ in range(120):
        try:
            data = conn.recv(65536)
        except TimeoutError:
            if proc.poll() is not None:
                pytest.fail(f"memd exited {proc.returncode}: {proc.communicate()[1]}")
            continue
        assert data, "memd closed the connection without replying"
        unpacker.feed(data)
        for obj in unpacker:
            message = parse(obj)
            assert isinstance(message, Response)
            return message
    pytest.fail("no reply from memd within a minute")


def test_memd_serves_the_socket_it_is_given_and_leaves_it_to_the_manager(
    sock_dir: Path,
) -> None:
    path = sock_dir / "memd.sock"
    sock = listening(path)
    try:
        # A client that connects while memd is not running waits in the socket's queue.
        early = closing_later(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        early.connect(str(path))
        early.sendall(hello_bytes())
        proc = activate(sock)
        try:
            reply = read_reply(early, proc)
            assert reply.error is None and reply.result["pid"] == proc.pid
            assert reply.result["started"] == {"how": "socket activation", "by": "systemd"}
            early.close()
            with memd_client.connect(path, autostart=False) as c:
                daemon = c.status()["daemon"]
            assert daemon["socket"] == str(path)
            assert daemon["started"]["how"] == "socket activation"
        finally:
            code, err = stop(proc)
        assert code == EXIT_OK, err
        assert "Traceback" not in err
        # The socket file is the manager's: still there, still listening, served by the next
        # memd the manager starts.
        assert path.exists()
        again = closing_later(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        again.connect(str(path))
        again.sendall(hello_bytes(7))
        proc = activate(sock)
        try:
            reply = read_reply(again, proc)
            assert reply.msgid == 7 and reply.result["pid"] == proc.pid
            again.close()
        finally:
            assert stop(proc)[0] == EXIT_OK
    finally:
        sock.close()


def test_an_activated_memd_stops_when_idle_and_the_next_client_is_served(
    sock_dir: Path,
) -> None:
    path = sock_dir / "memd.sock"
    sock = listening(path)
    try:
        proc = activate(sock, "MEMD_IDLE_EXIT=0.5")
        with memd_client.connect(path, autostart=False) as c:
            started = c.hello()["started"]
        assert started == {"how": "socket activation", "by": "systemd", "idle_exit_s": 0.5}
        # No clients and nothing to index: it stops by itself, cleanly.
        proc.wait(timeout=60)
        code, err = stop(proc)
        assert code == EXIT_OK, err
        assert "no clients and nothing to do" in err
        assert path.exists()
        waiting = closing_later(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        waiting.connect(str(path))
        waiting.sendall(hello_bytes())
        proc = activate(sock, "MEMD_IDLE_EXIT=600")
        try:
            assert read_reply(waiting, proc).result["pid"] == proc.pid
            waiting.close()
        finally:
            stop(proc)
    finally:
        sock.close()


def test_the_accept_loop_gives_way_when_asked_to_pause(sock_dir: Path) -> None:
    """An idle socket-activated memd stops accepting before it stops. The accept loop takes
    its lock for each turn of 0.25 s; waiting on the lock alone, the pause waited for minutes
    on an idle machine, as the loop took it again the moment it let go."""
    server = Server(
        sock_dir / "memd.sock", lambda request, state: [RESPONSE, request.msgid, None, {"ok": 1}]
    )
    server.bind()
    server.start()
    try:
        for _ in range(12):
            paused = threading.Event()
            pausing = threading.Thread(
                target=lambda done=paused: (server.pause_accepting(), done.set())
            )
            pausing.start()
            assert paused.wait(5), "the accept loop kept the turn a pause waited for"
            pausing.join()
            server.resume_accepting()
            with memd_client.connect(sock_dir / "memd.sock", autostart=False) as c:
                assert c.hello() == {"ok": 1}  # resumed: a client is served again
    finally:
        server.stop()


def test_idle_exit_is_ignored_without_socket_activation(sock_dir: Path) -> None:
    """Nothing would start a memd run by hand again: it keeps running, and says why."""
    path = sock_dir / "memd.sock"
    env = dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake", MEMD_SOCKET=str(path))
    env["MEMD_IDLE_EXIT"] = "0.2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd", "--log-level", "info", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: path.exists() and _answers(path), "memd to answer")
        with memd_client.connect(path, autostart=False) as c:
            assert c.hello()["started"] == {"how": "by hand", "by": None}
        # Long past the idle limit it still answers (a clean wait on the log, no timing).
        wait_for(lambda: proc.poll() is None and _answers(path), "memd to keep answering")
    finally:
        code, err = stop(proc)
    assert code == EXIT_OK and "idle exit is for a socket-activated memd" in err


def _answers(path: Path) -> bool:
    try:
        with memd_client.connect(path, timeout=5, autostart=False) as c:
            c.hello()
        return True
    except memd_client.MemdError:
        return False


@pytest.mark.parametrize("kind", ["not listening", "datagram"])
def test_a_socket_memd_cannot_serve_on_is_refused_saying_why(sock_dir: Path, kind: str) -> None:
    if kind == "datagram":
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        bad.bind(str(sock_dir / "memd.sock"))
    else:
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bad.bind(str(sock_dir / "memd.sock"))
    try:
        code, err = stop_when_done(activate(bad))
    finally:
        bad.close()
    assert code == EXIT_STARTUP_FAILURE
    assert "cannot serve on" in err and "ListenStream" in err


def stop_when_done(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    return stop(proc)


def test_variables_meant_for_another_process_are_ignored(sock_dir: Path) -> None:
    """LISTEN_PID of the shell that started memd (not memd's own): memd binds its own socket,
    and its children do not inherit the variables."""
    path = sock_dir / "memd.sock"
    env = dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake", MEMD_SOCKET=str(path))
    env.update(LISTEN_PID="1", LISTEN_FDS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _answers(path), "memd to answer on a socket of its own")
        with memd_client.connect(path, autostart=False) as c:
            assert c.hello()["started"]["how"] == "by hand"
    finally:
        code, err = stop(proc)
    assert code == EXIT_OK, err
    assert not path.exists()  # its own socket, unlinked when it stops


# -- systemd itself --------------------------------------------------------------------------


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None,
    reason="systemd-socket-activate (systemd's own socket activation tool) is not installed",
)
def test_systemd_socket_activate_starts_memd_on_the_first_connection(sock_dir: Path) -> None:
    path = sock_dir / "memd.sock"
    activator = shutil.which("systemd-socket-activate")
    assert activator is not None
    env = dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake")
    env.pop("MEMD_SOCKET", None)
    # It passes memd only the variables named with -E, as a unit's Environment= does.
    passed = [f"-E{name}" for name in ("MEMD_HOME", "MEMD_EMBEDDING_PROVIDER", "MEMD_AUTOSTART")]
    proc = subprocess.Popen(
        [activator, "-l", str(path), *passed, sys.executable, "-m", "memd", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(path.exists, "systemd-socket-activate to listen")
        with memd_client.connect(path, timeout=60, autostart=False) as c:
            hello = c.hello()
        assert hello["started"] == {"how": "socket activation", "by": "systemd"}
    finally:
        code, err = stop(proc)
    assert "Traceback" not in err


def _user_manager() -> str | None:
    """Why there is no systemd user manager to test with, or None when there is one."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "no systemctl"
    try:
        result = subprocess.run(
            [systemctl, "--user", "is-system-running"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl --user: {exc}"
    state = result.stdout.strip()
    if state in ("running", "degraded", "starting"):
        return None
    return f"systemctl --user: {(result.stderr or result.stdout).strip() or state}"


_NO_MANAGER = _user_manager()


@pytest.mark.skipif(_NO_MANAGER is not None, reason=f"no systemd user manager: {_NO_MANAGER}")
def test_a_real_user_manager_starts_memd_through_its_socket(
    sock_dir: Path, memd_home: Path
) -> None:
    """memd's own units (renamed, so a real installation is untouched) in the user manager's
    runtime unit directory: a connection to the socket starts memd, which says so."""
    from memd.ctl.servicebase import memd_executable
    from memd.ctl.systemd import systemd_socket, systemd_unit

    name = f"memd-test-{uuid.uuid4().hex[:8]}"
    runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}")
    units = runtime / "systemd" / "user"
    units.mkdir(parents=True, exist_ok=True)
    path = sock_dir / "memd.sock"
    service = systemd_unit(
        memd_executable(),
        environment={"MEMD_HOME": str(memd_home), "MEMD_EMBEDDING_PROVIDER": "fake"},
    ).replace("memd.socket", f"{name}.socket")
    (units / f"{name}.service").write_text(service)
    (units / f"{name}.socket").write_text(systemd_socket(str(path)))

    def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemctl", "--user", *args], capture_output=True, text=True, timeout=120
        )

    try:
        systemctl("daemon-reload")
        started = systemctl("start", f"{name}.socket")
        assert started.returncode == 0, started.stderr
        with memd_client.connect(path, timeout=60, autostart=False) as c:
            hello = c.hello()
        assert hello["started"] == {"how": "socket activation", "by": "systemd"}
        active = systemctl("is-active", f"{name}.service").stdout.strip()
        assert active == "active"
    finally:
        systemctl("stop", f"{name}.service", f"{name}.socket")
        for suffix in (".service", ".socket"):
            (units / f"{name}{suffix}").unlink(missing_ok=True)
        systemctl("daemon-reload")
    assert re.match(r"memd-test-[0-9a-f]{8}$", name)
