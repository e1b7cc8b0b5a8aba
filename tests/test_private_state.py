"""memd's state is its user's alone: created private whatever the umask (by the daemon, the
one-shot commands and ``memctl model pull``), and a state directory someone else could write
to, or a symlink where a lock or the registry should be, is refused before anything is opened
through it."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memd.daemon import EXIT_STARTUP_FAILURE
from memd.private import not_private

from .daemon_fixture import short_socket_dir


def run(home: Path, *args: str, umask: int = 0o022, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m memd ARGS`` (the installed entry point's code) as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        env=dict(os.environ, MEMD_HOME=str(home), MEMD_EMBEDDING_PROVIDER="fake", **env),
        capture_output=True,
        text=True,
        timeout=120,
        umask=umask,
    )


def everything_under(top: Path) -> dict[str, int]:
    """Every directory and file under ``top`` (itself included), with its mode."""
    found = {str(top): stat.S_IMODE(top.lstat().st_mode)}
    for path in top.rglob("*"):
        if not path.is_symlink():
            found[str(path.relative_to(top))] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("The staging cluster is called Orion.\n")
    return root


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(
    "args",
    [("index", "{ws}"), ("search", "{ws}", "staging"), ("status", "{ws}")],
    ids=["index", "search", "status"],
)
def test_one_shot_commands_create_private_state_under_umask_022(
    tmp_path: Path, ws: Path, args: tuple[str, ...]
) -> None:
    home = tmp_path / "new" / "home"  # nothing of it exists yet
    done = run(home, *(a.format(ws=ws) for a in args))
    assert done.returncode == 0, done.stderr
    modes = everything_under(tmp_path / "new")
    assert any(name.endswith(".sqlite") for name in modes), modes
    exposed = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert not exposed, exposed


def test_the_daemon_refuses_a_state_directory_others_may_write(
    tmp_path: Path, sock_dir: Path
) -> None:
    """Someone made the state directory world-writable and put memd.lock there as a symlink:
    memd used to truncate the link's target."""
    home = tmp_path / "home"
    state = home / "state"
    state.mkdir(parents=True)
    os.chmod(state, 0o777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (state / "memd.lock").symlink_to(victim)
    done = run(home, "run", MEMD_SOCKET=str(sock_dir / "memd.sock"))
    assert done.returncode == EXIT_STARTUP_FAILURE, done.stderr
    assert "writable by other users (mode 0777)" in done.stderr
    assert f"chmod 700 {state}" in done.stderr
    assert "Traceback" not in done.stderr
    assert victim.read_text() == "precious\n"
    # The one-shot commands refuse it alike.
    done = run(home, "index", str(tmp_path))
    assert done.returncode == 1 and "writable by other users" in done.stderr
    assert victim.read_text() == "precious\n"


def test_a_state_directory_in_a_folder_anyone_may_write_is_refused(
    tmp_path: Path, sock_dir: Path
) -> None:
    """No sticky bit on the folder: anyone could rename memd's directory and put theirs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    done = run(shared / "home", "run", MEMD_SOCKET=str(sock_dir / "memd.sock"))
    assert done.returncode == EXIT_STARTUP_FAILURE
    assert f"inside {shared}, which every user may write to" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_state_directory_of_another_user_is_refused(tmp_path: Path, sock_dir: Path) -> None:
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True, mode=0o700)
    os.chown(home / "state", 65534, 65534)
    done = run(home, "run", MEMD_SOCKET=str(sock_dir / "memd.sock"))
    assert done.returncode == EXIT_STARTUP_FAILURE
    assert "belongs to uid 65534, not to you" in done.stderr
    assert not (home / "state" / "memd.lock").exists()


@pytest.mark.parametrize("where", ["state", "socket"])
def test_a_lock_file_that_is_a_symlink_is_never_followed(
    tmp_path: Path, sock_dir: Path, where: str
) -> None:
    home = tmp_path / "home"
    state = home / "state"
    state.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (state if where == "state" else sock_dir).joinpath("memd.lock").symlink_to(victim)
    done = run(home, "run", MEMD_SOCKET=str(sock_dir / "memd.sock"))
    assert done.returncode == EXIT_STARTUP_FAILURE, done.stderr
    assert "memd.lock is a symlink" in done.stderr
    assert victim.read_text() == "precious\n"


def test_a_registry_that_is_a_symlink_is_refused(tmp_path: Path, sock_dir: Path) -> None:
    home = tmp_path / "home"
    state = home / "state"
    state.mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"version": 1, "workspaces": []}\n')
    (state / "workspaces.json").symlink_to(elsewhere)
    done = run(home, "run", MEMD_SOCKET=str(sock_dir / "memd.sock"))
    assert done.returncode == EXIT_STARTUP_FAILURE
    assert "workspaces.json is a symlink" in done.stderr


GGUF = b"GGUF" + bytes(4092)


class _Blob(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        self.send_response(200)
        self.send_header("Content-Length", str(len(GGUF)))
        self.end_headers()
        self.wfile.write(GGUF)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def blob_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Blob)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/tiny.gguf"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_memctl_model_pull_keeps_models_private_under_umask_022(
    tmp_path: Path, blob_url: str
) -> None:
    home = tmp_path / "new" / "home"
    sha = hashlib.sha256(GGUF).hexdigest()
    done = subprocess.run(
        [sys.executable, "-c", "from memd.ctl.memctl import main; main()"]
        + ["model", "pull", blob_url, "--sha256", sha],
        env=dict(os.environ, MEMD_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=120,
        umask=0o022,
    )
    assert done.returncode == 0, done.stderr
    assert (home / "models" / "tiny.gguf").read_bytes() == GGUF
    assert not_private(tmp_path / "new") == []
