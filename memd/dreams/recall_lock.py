"""The recall store's lock protocol: an in-process lock per path in front of an ``O_EXCL`` lock file
holding ``pid:epochMs:startTime``, broken as soon as its holder is provably gone.

OpenClaw writes ``pid:epochMs`` and steals a lock only once it is 60 s old; memd reads both
forms but does not wait for the age: a lock whose process is dead (or whose pid now belongs to
a process started after the lock was taken) has no holder, and waiting for it would turn every
dream and promotion after a crash into BUSY for a minute. Only a lock that names no process
(being written, or garbage) waits for LOCK_STALE_S."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from memd_client.errors import Busy

__all__ = ["LOCK_RETRY_S", "LOCK_STALE_S", "LOCK_TIMEOUT_S", "file_lock"]

logger = logging.getLogger(__name__)

# OpenClaw's lock protocol; module-level so tests can shorten them.
LOCK_STALE_S = 60.0
LOCK_RETRY_S = 0.04
LOCK_TIMEOUT_S = 10.0

# One in-process lock per lock-file path: the file lock is per process, so threads queue here first.
# Module-level on purpose, like the file lock it stands in front of (shared by every RecallStore).
_THREAD_LOCKS: dict[Path, _PathLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@dataclass
class _PathLock:
    rlock: threading.RLock = field(default_factory=threading.RLock)
    depth: int = 0  # how many nested locked() hold the file lock (changed only under rlock)


def _path_lock(path: Path) -> _PathLock:
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(path, _PathLock())


# How far two readings of one process's start time may differ (psutil derives it from the
# boot time, which the kernel recomputes when the clock is set).
START_TIME_SLACK_S = 2.0


def _holder(lock_path: Path) -> tuple[int, float, float | None] | None:
    """(pid, epoch seconds, process start time or None) a lock file names; None when it names
    no process (being written just now, or garbage)."""
    try:
        text = lock_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    parts = text.strip().split(":")
    try:
        pid = int(parts[0])
        taken = int(parts[1]) / 1000 if len(parts) > 1 else 0.0
        started = float(parts[2]) if len(parts) > 2 else None
    except ValueError:
        return None
    if not 0 < pid < 2**31:  # kill(0 or -n) would signal a group; no pid is larger
        return None
    return pid, taken, started


def _holder_alive(pid: int, taken: float, started: float | None) -> bool:
    """Whether the process that took the lock still runs. A dead pid, a zombie, or a pid
    reused by a process that started after the lock was taken (or at another time than the
    holder recorded) is no holder; a process memd may not inspect counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # EPERM: another user's process; psutil may still read its start time
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False  # killed, not yet reaped: it holds nothing
        now_started = float(process.create_time())
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # AccessDenied: as OpenClaw does, a process we cannot see is alive
    if started is not None:
        return abs(now_started - started) <= START_TIME_SLACK_S
    return not (taken and now_started > taken + START_TIME_SLACK_S)


def _own_start_time() -> float:
    try:
        return float(psutil.Process().create_time())
    except psutil.Error:  # pragma: no cover - our own process is always readable
        return 0.0


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold the lock file at ``lock_path`` (re-entrant within a thread); raise Busy after LOCK_TIMEOUT_S."""
    state = _path_lock(lock_path.absolute())
    if not state.rlock.acquire(timeout=LOCK_TIMEOUT_S):
        raise Busy("Timed out waiting for short-term promotion lock")
    try:
        if state.depth == 0:
            _acquire_file_lock(lock_path)
        state.depth += 1
        try:
            yield
        finally:
            state.depth -= 1
            if state.depth == 0:
                with contextlib.suppress(FileNotFoundError):
                    lock_path.unlink()
    finally:
        state.rlock.release()


def _acquire_file_lock(lock_path: Path) -> None:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if _steal_if_stale(lock_path):
                continue
            if time.monotonic() >= deadline:
                raise Busy("Timed out waiting for short-term promotion lock") from None
            time.sleep(LOCK_RETRY_S)
            continue
        try:
            line = f"{os.getpid()}:{int(time.time() * 1000)}:{_own_start_time():.3f}\n"
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return


def _steal_if_stale(lock_path: Path) -> bool:
    """Unlink a lock whose holder is provably gone, or one naming no process that is older
    than LOCK_STALE_S; True if it was unlinked (or is gone already)."""
    holder = _holder(lock_path)
    if holder is not None:
        if _holder_alive(*holder):
            return False
    else:
        try:
            age = time.time() - lock_path.stat().st_mtime
        except FileNotFoundError:
            return True  # released between our open and stat: retry at once
        if age <= LOCK_STALE_S:
            return False  # being written just now, most likely
    logger.warning("removing the recall-store lock %s: its holder is gone", lock_path)
    with contextlib.suppress(FileNotFoundError):
        lock_path.unlink()
    return True
