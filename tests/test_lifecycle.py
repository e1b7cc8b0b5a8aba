"""memd run as a real process: readiness, a second instance, signals, stale sockets, other users."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import memd_client
from memd.daemon import EXIT_ALREADY_RUNNING, EXIT_OK, EXIT_STARTUP_FAILURE

from .daemon_fixture import short_socket_dir, wait_for


@pytest.fixture(autouse=True)
def no_autostart(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests start (and kill) memd themselves: no client may start one of its own."""
    monkeypatch.setenv("MEMD_AUTOSTART", "0")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(
    sock: Path, *extra: str, umask: int = -1, session: bool = False, **env: str
) -> subprocess.Popen[str]:
    """`memd run` on ``sock`` with the fake embedder unless ``env`` says otherwise; with
    ``session``, in a session (and process group) of its own, as under a service manager."""
    return subprocess.Popen(
        [sys.executable, "-m", "memd", "--log-level", "info", "run", *extra],
        env={**os.environ, "MEMD_EMBEDDING_PROVIDER": "fake", "MEMD_SOCKET": str(sock), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        umask=umask,
        start_new_session=session,
    )


def exited(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The exit code and stderr of a memd that should stop by itself (stopped if it does not)."""
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        return stop(proc)
    return proc.returncode, proc.communicate()[1]


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


# A memd that stops itself at the two moments a manager's SIGTERM can meet it outside the main
# loop: the instant start-up is done (the socket is served from within it, so a client may be
# answered and a stop sent before the loop begins) and the first instant of shutdown (a second
# stop, as systemd sends on a restart that comes while memd stops).
_STOPPED_AT_THE_EDGES = """\
import os, signal, sys
from pathlib import Path
from memd.config import Config
from memd.daemon import Daemon

class StoppedAtTheEdges(Daemon):
    def startup(self):
        super().startup()
        os.kill(os.getpid(), signal.SIGTERM)

    def shutdown(self):
        os.kill(os.getpid(), signal.SIGTERM)
        super().shutdown()

sys.exit(StoppedAtTheEdges(Config.load(), socket=Path(sys.argv[1])).run())
"""


def test_a_sigterm_the_moment_memd_serves_or_stops_still_stops_it_cleanly(
    sock_dir: Path,
) -> None:
    """Handlers installed only around the main loop left both edges to SIGTERM's default
    action: the process died at once (-15), its socket and lock left behind."""
    sock = sock_dir / "memd.sock"
    env = dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake")
    proc = subprocess.run(
        [sys.executable, "-c", _STOPPED_AT_THE_EDGES, str(sock)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not sock.exists(), "a clean stop removes the socket it made"


MODEL = os.environ.get("MEMD_TEST_MODEL", "")


def memd_with_children(
    sock: Path, tmp_path: Path, embedder: str
) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """A memd in a process group of its own, as under a service manager, with its reader
    processes started and idle (and its model worker, with the local model); its children."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    for day in range(1, 21):
        (ws / "memory" / f"2026-11-{day:02d}.md").write_text(f"Day {day}: the Orion cluster.\n")
    model = {"MEMD_LOCAL_MODEL": MODEL} if embedder == "local" else {}
    proc = start(sock, session=True, MEMD_EMBEDDING_PROVIDER=embedder, **model)
    try:
        wait_ready(sock, proc)
        with memd_client.connect(sock) as c:
            c.workspace_add(str(ws), name="ws")
            c.reindex("ws")

        def readers_idle() -> bool:
            def search() -> None:
                with memd_client.connect(sock) as c:
                    for _ in range(5):
                        c.search("ws", "Orion cluster")

            threads = [threading.Thread(target=search) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            with memd_client.connect(sock) as c:
                readers = c.status()["daemon"]["readers"]
            return readers["running"] > 0 and readers["busy"] == 0  # none still starting

        wait_for(readers_idle, "reader processes")
        children = psutil.Process(proc.pid).children()
        assert len(children) >= (2 if embedder == "local" else 1)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc, children


EMBEDDERS = [
    "fake",
    pytest.param(
        "local", marks=pytest.mark.skipif(not MODEL, reason="set MEMD_TEST_MODEL to a GGUF model")
    ),
]


@pytest.mark.parametrize("embedder", EMBEDDERS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_sent_to_the_whole_process_group_is_a_clean_stop(
    sock_dir: Path, tmp_path: Path, sig: signal.Signals, embedder: str
) -> None:
    """systemd's default KillMode signals every process of the service, and Ctrl-C in a
    terminal every process of the foreground group: the readers and the model worker died of
    it, so each clean stop logged a crashed worker, a failed embedding and dead readers."""
    proc, children = memd_with_children(sock_dir / "memd.sock", tmp_path, embedder)
    try:
        # The children are in sessions of their own, out of the group's reach; a manager that
        # signals each process (a unit without KillMode=mixed) finds them ignoring it.
        for child in children:
            assert os.getpgid(child.pid) != proc.pid
            child.send_signal(sig)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == EXIT_OK, err
    after_ready = err.split(" ready on ", 1)[1]
    complaints = [
        line for line in after_ready.splitlines() if " WARNING " in line or " ERROR " in line
    ]
    assert complaints == [], err
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], "a child outlived memd's stop"


@pytest.mark.parametrize("embedder", EMBEDDERS)
def test_no_child_outlives_a_killed_memd(sock_dir: Path, tmp_path: Path, embedder: str) -> None:
    """Out of the daemon's group, a child must still end with it: readers at the end of their
    stdin, the model worker by its parent-death signal, even when memd cannot stop them."""
    proc, children = memd_with_children(sock_dir / "memd.sock", tmp_path, embedder)
    proc.kill()
    proc.communicate()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], f"left running after SIGKILL: {[p.cmdline() for p in alive]}"


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: BLAS starts one thread anyway")
def test_the_daemon_runs_numpy_with_one_blas_thread(sock_dir: Path) -> None:
    """numpy's OpenBLAS would keep a spinning thread per core (memd/blas.py); this process,
    which has not limited it, shows the default."""
    from memd.blas import blas_threads

    assert (blas_threads() or 0) > 1, "numpy here starts a thread per core"
    sock = sock_dir / "memd.sock"
    proc = start(sock)
    try:
        wait_ready(sock, proc)
        with memd_client.connect(sock) as c:
            assert c.status()["daemon"]["blas_threads"] == 1
    finally:
        stop(proc)


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


def test_a_file_at_the_socket_path_is_never_removed(sock_dir: Path) -> None:
    """MEMD_SOCKET=~/notes.md used to delete notes.md as a "stale socket"."""
    notes = sock_dir / "notes.md"
    notes.write_text("my notes\n")
    code, err = exited(start(notes))
    assert code == EXIT_STARTUP_FAILURE
    assert "not a socket" in err and str(notes) in err
    assert notes.read_text() == "my notes\n"
    os.symlink(notes, sock_dir / "link.sock")
    code, err = exited(start(sock_dir / "link.sock"))
    assert code == EXIT_STARTUP_FAILURE and "is a symlink" in err
    assert notes.read_text() == "my notes\n"


def test_one_daemon_per_state_directory_whatever_the_socket(sock_dir: Path) -> None:
    """Two daemons on one MEMD_HOME with different sockets would both write its indexes."""
    first = start(sock_dir / "a.sock")
    other_dir = short_socket_dir()
    try:
        wait_ready(sock_dir / "a.sock", first)
        code, err = exited(start(other_dir / "b.sock"))
        assert code == EXIT_ALREADY_RUNNING
        assert "already running (state directory" in err
    finally:
        stop(first)
        shutil.rmtree(other_dir, ignore_errors=True)


def test_everything_memd_creates_is_private_whatever_the_umask(
    sock_dir: Path, memd_home: Path, tmp_path: Path
) -> None:
    from memd.private import not_private

    state = memd_home / "state"
    (state / "indexes").mkdir(parents=True, mode=0o755)
    os.chmod(state, 0o755)
    os.chmod(state / "indexes", 0o755)
    old = state / "indexes" / "left-by-an-old-install.sqlite"
    old.write_bytes(b"")
    os.chmod(old, 0o644)
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    os.chmod(ws / "memory", 0o755)
    (ws / "MEMORY.md").write_text("The staging cluster is called Orion.\n")
    sock = sock_dir / "memd.sock"
    proc = start(sock, umask=0o022)
    try:
        wait_ready(sock, proc)
        with memd_client.connect(sock) as c:
            c.workspace_add(str(ws), name="ws")
            c.reindex("ws")
            assert c.search("ws", "staging cluster")["results"]
            c.append("ws", "A note written by memd.")
        wals = list((state / "indexes").glob("*-wal"))
        assert wals, "the index is in WAL mode while memd runs"
        assert not_private(state) == []
        assert oct((ws / "memory").stat().st_mode & 0o777) == "0o755", "user dirs untouched"
    finally:
        code, err = stop(proc)
    assert code == EXIT_OK
    tightened = re.search(r"made (\d+) file\(s\) in \S+ private", err)
    assert tightened and int(tightened[1]) >= 3, err  # state/, indexes/, the old index


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


def _config_file(memd_home: Path) -> Path:
    path = memd_home / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize(
    "what", ["nested arrays", "integer of 5000 digits", "not UTF-8", "many workspaces"]
)
def test_a_config_memd_cannot_read_stops_the_start_with_one_line(
    sock_dir: Path, memd_home: Path, what: str
) -> None:
    from .test_config import UNREADABLE_FILES

    config = _config_file(memd_home)
    config.write_bytes(UNREADABLE_FILES[what])
    code, err = exited(start(sock_dir / "memd.sock"))
    assert code == EXIT_STARTUP_FAILURE, err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert str(config) in line


def test_a_config_directory_stops_the_start_with_one_line(sock_dir: Path, memd_home: Path) -> None:
    _config_file(memd_home).mkdir()
    code, err = exited(start(sock_dir / "memd.sock"))
    assert code == EXIT_STARTUP_FAILURE
    (line,) = err.strip().splitlines()
    assert "is not a regular file" in line


def test_a_reload_that_fails_keeps_the_daemon_and_its_configuration(
    sock_dir: Path, memd_home: Path, tmp_path: Path
) -> None:
    """SIGHUP with a file nested deeper than the parser recurses used to kill the daemon."""
    from .test_config import UNREADABLE_FILES

    config = _config_file(memd_home)
    config.write_text("[search]\nmax_results = 2\n")
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    for i in range(5):
        (ws / "memory" / f"topic-{i}.md").write_text(f"Orion staging note {i}.\n")
    sock = sock_dir / "memd.sock"
    log = tmp_path / "memd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memd", "--log-level", "info", "run"],
            env=dict(os.environ, MEMD_EMBEDDING_PROVIDER="fake", MEMD_SOCKET=str(sock)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(sock, proc)  # type: ignore[arg-type]
        with memd_client.connect(sock) as c:
            c.workspace_add(str(ws), name="ws")
            c.reindex("ws")
        failures = 0
        for what, data in UNREADABLE_FILES.items():
            config.write_bytes(data)
            proc.send_signal(signal.SIGHUP)
            failures += 1
            deadline = time.monotonic() + 20
            while log.read_text(errors="replace").count("config reload failed") < failures:
                assert proc.poll() is None, f"memd died reloading {what}:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"no reload logged for {what}"
                time.sleep(0.05)
            with memd_client.connect(sock) as c:  # still serving, with the old max_results
                hits = c.search("ws", "Orion staging note", min_score=0.0)["results"]
                assert len(hits) == 2, what
        text = log.read_text(errors="replace")
        assert "Traceback" not in text
        failed = [line for line in text.splitlines() if "config reload failed" in line]
        assert len(failed) == len(UNREADABLE_FILES)
        assert all(str(config) in line for line in failed), failed
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == EXIT_OK
