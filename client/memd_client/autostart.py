"""Start memd on demand: a client that finds nothing listening on the socket starts ``memd run``
in the background and waits until it answers, as gpg-agent is started by its clients.

One starter wins: the clients that race to start memd take turns on a lock file beside the
socket; the first starts memd, the others find it answering once they get the lock (and memd's
own state-directory lock refuses a second daemon in any case). memd is started in a session of
its own, not as a child of the client (a launcher process starts it and exits), so it outlives
the client, is not stopped by a Ctrl-C in the client's terminal, and is never left a zombie.
Its output goes to ``memd.log`` in memd's state directory. What only a start needs is imported
when one happens: every client imports this module.

``MEMD_AUTOSTART=0`` (or ``false``, ``no``, ``off``) turns this off: a client then fails with
DaemonNotRunning, as it did before. Stdlib only, like the rest of the client.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from memd_client.log import get_logger
from memd_client.paths import user_dirs

__all__ = [
    "AUTOSTART_ENV",
    "STARTED_BY_ENV",
    "StartFailed",
    "enabled",
    "ensure_running",
    "memd_command",
]

logger = get_logger(__name__)

AUTOSTART_ENV = "MEMD_AUTOSTART"
STARTED_BY_ENV = "MEMD_STARTED_BY"
"""Set for the memd a client starts: who started it (memd's status says so)."""

START_SECONDS = 60.0
"""How long a client waits for the memd it (or another client) started to answer: a first
start imports numpy and opens every registered index before the socket accepts."""

ALREADY_RUNNING_GRACE = 5.0
"""After the memd started here stops because another holds its state directory, how much longer
to wait for that one to answer here."""

_OFF = ("0", "false", "no", "off")
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ [\w.]+: ")
_POLL_SECONDS = 0.05
LOCK_NAME = "memd.start.lock"
LOG_NAME = "memd.log"
# What a service manager gave the client's own process: never passed on to the memd it starts
# (its READY=1 would go to the client's manager; the sockets are the client's).
_NOT_INHERITED = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "INVOCATION_ID",
)

# Starts memd (argv[1:]) in the launcher's new session and exits: memd is nobody's child.
# Its stdout is pointed at the log (the launcher's stderr); the pid goes to the client.
_LAUNCHER = """\
import os, sys
pid = os.fork()
if pid == 0:
    os.dup2(2, 1)
    try:
        os.execv(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
print(pid, flush=True)
"""


class StartFailed(Exception):
    """memd could not be started, or did not answer in time; the message says why."""


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether clients start memd when it is not running (``MEMD_AUTOSTART``, default on)."""
    env = os.environ if env is None else env
    return env.get(AUTOSTART_ENV, "").strip().lower() not in _OFF


def memd_command() -> list[str]:
    """How to run ``memd run``: the memd installed beside this client (same Python), else the
    ``memd`` on PATH."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("memd") is not None:
        return [sys.executable, "-m", "memd", "run"]
    found = shutil.which("memd")
    if found:
        return [found, "run"]
    raise StartFailed(
        f"memd is not installed beside this client ({sys.executable}) nor on PATH, so it "
        "cannot be started"
    )


def answers(path: Path) -> bool:
    """Whether something accepts connections on the socket ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(str(path))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def ensure_running(
    path: Path,
    *,
    timeout: float = START_SECONDS,
    env: Mapping[str, str] | None = None,
    started_by: str | None = None,
) -> int | None:
    """Make memd answer on ``path``: start it unless another client is starting it (or it
    started meanwhile), and wait until it accepts. Return the pid of the memd started here, or
    None when another starter's (or a running) memd answered. Raise StartFailed with the cause.
    """
    env = os.environ if env is None else env
    deadline = time.monotonic() + timeout
    directory = path.parent
    try:
        # memd makes the socket's directory 0700 (and refuses one that is not): the same here.
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(
            directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
    except OSError as exc:
        raise StartFailed(f"cannot start memd: {directory}: {exc.strerror or exc}") from None
    try:
        while not _locked(lock):
            if answers(path):
                return None  # another client started it
            if time.monotonic() > deadline:
                raise StartFailed(f"memd did not answer on {path} within {timeout:g} s")
            time.sleep(_POLL_SECONDS)
        if answers(path):
            return None  # the starter before us is done
        pid, log = _launch(path, env, started_by)
        logger.info("started memd (pid %d) for %s; its log: %s", pid, path, log)
        _wait_ready(path, pid, log, deadline)
        return pid
    finally:
        os.close(lock)  # and with it the flock


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _launch(path: Path, env: Mapping[str, str], started_by: str | None) -> tuple[int, Path]:
    """Start memd for ``path`` in a session of its own; return its pid and its log."""
    import subprocess

    command = memd_command()
    state = user_dirs(env).state
    log = state / LOG_NAME
    child_env = {k: v for k, v in env.items() if k not in _NOT_INHERITED}
    child_env["MEMD_SOCKET"] = str(path)
    child_env[STARTED_BY_ENV] = (
        started_by or env.get(STARTED_BY_ENV) or f"{Path(sys.argv[0]).name} (pid {os.getpid()})"
    )
    try:
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StartFailed(f"cannot start memd: {log}: {exc.strerror or exc}") from None
    try:
        launcher = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=out,
            env=child_env,
            cwd="/",  # not the client's directory: memd must not keep a mount busy
            start_new_session=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartFailed(f"cannot start memd ({' '.join(command)}): {exc}") from None
    finally:
        os.close(out)
    try:
        return int(launcher.stdout.strip()), log
    except ValueError:
        raise StartFailed(
            f"cannot start memd ({' '.join(command)}): {_last_line(log) or 'no output'}"
        ) from None


def _wait_ready(path: Path, pid: int, log: Path, deadline: float) -> None:
    """Wait until memd ``pid`` answers on ``path``; raise StartFailed if it exits first."""
    while not answers(path):
        if not _alive(pid):
            why = _last_line(log) or "it exited without a word"
            if "already running" in why:
                # Another memd holds the state directory: one starting at this moment (a
                # service, a user) answers shortly; one serving another socket never will.
                grace = min(deadline, time.monotonic() + ALREADY_RUNNING_GRACE)
                while time.monotonic() < grace:
                    if answers(path):
                        return
                    time.sleep(_POLL_SECONDS)
            raise StartFailed(f"memd could not start: {why} (log: {log})")
        if time.monotonic() > deadline:
            raise StartFailed(f"memd (pid {pid}) did not answer on {path} in time (log: {log})")
        time.sleep(_POLL_SECONDS)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. memd is not this process's child, so its exit status is
    not known here: its log says why it stopped. A zombie (exited, its new parent has not
    reaped it yet) counts as stopped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) has answered
    return state not in (b"Z", b"X")


def _last_line(log: Path) -> str:
    """The last line memd wrote to ``log`` (without its time, level and logger): on a failed
    start, why."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return _LOG_PREFIX.sub("", lines[-1].strip()) if lines else ""
