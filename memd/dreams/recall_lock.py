"""The recall store's lock protocol: an in-process lock per path in front of an ``O_EXCL`` lock file
holding ``pid:epochMs``, stolen only when stale and its holder is provably gone."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

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


def _lock_holder_alive(lock_path: Path) -> bool:
    """Read the ``pid:epochMs`` of a stale lock; only a provably gone pid counts as dead."""
    try:
        text = lock_path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return True  # released meanwhile: nothing to steal, just retry
    try:
        pid = int(text.strip().split(":", 1)[0])
    except ValueError:
        return False
    if pid <= 0:
        return False  # kill(0 or -n) would signal a process group: never a valid holder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM and anything else: alive, as OpenClaw does
    return True


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
            os.write(fd, f"{os.getpid()}:{int(time.time() * 1000)}\n".encode())
        finally:
            os.close(fd)
        return


def _steal_if_stale(lock_path: Path) -> bool:
    """Unlink a lock older than LOCK_STALE_S whose holder is provably gone; True if unlinked."""
    try:
        age = time.time() - lock_path.stat().st_mtime
    except FileNotFoundError:
        return True  # released between our open and stat: retry at once
    if age <= LOCK_STALE_S or _lock_holder_alive(lock_path):
        return False
    logger.warning("removing stale recall-store lock %s", lock_path)
    with contextlib.suppress(FileNotFoundError):
        lock_path.unlink()
    return True
