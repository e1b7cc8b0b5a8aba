"""Writing a file that a human edits too (MEMORY.md, DREAMS.md) without ever losing a line
they wrote: appends are one all-or-nothing write on an O_APPEND descriptor; a rewrite (trimming
to a budget) is swapped in only if the file is still what was read, and a write that raced the
swap is carried over or handed back.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memd.atomicfile import append_whole, fsync, fsync_dir
from memd.markdown.modes import file_mode, open_append
from memd_client.errors import PathRefused

__all__ = ["Snapshot", "append_text", "snapshot", "snapshot_bytes", "swap_in"]

logger = logging.getLogger(__name__)

# After the swap, how long to wait for a writer that opened the old file to finish with it
# (then the swap is undone), and, where the kernel cannot tell whether one has it open, how long
# such a writer may still write to it.
SALVAGE_WAIT_S = 2.0
SALVAGE_GRACE_S = 0.02


@dataclass
class Snapshot:
    data: bytes
    fd: int | None  # open on the file read, so bytes appended to it later can be salvaged
    st: os.stat_result | None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "surrogateescape")


def _open_nofollow(path: Path, flags: int, mode: int = 0o666) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{path} is a symlink; memd does not write through it") from exc
        raise


def _read_from(fd: int, offset: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def snapshot(path: Path) -> Snapshot:
    try:
        fd = _open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return Snapshot(b"", None, None)
    return Snapshot(_read_from(fd, 0), fd, os.fstat(fd))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n < len(view):
            logger.warning("short write (%d of %d bytes); writing the rest", n, len(view))
        view = view[n:]


def append_text(path: Path, body: str, *, header: str = "", nl: str = "\n") -> None:
    """Append ``body`` with one write on an O_APPEND fd: appends cannot clobber a concurrent editor."""
    fd = open_append(path)  # created with the mode its folder gives, as the user's own files
    try:
        st = os.fstat(fd)
        if st.st_nlink > 1:  # a second name elsewhere would change too: another file's text
            raise PathRefused(
                f"{path} has {st.st_nlink} names (hard links); memd writes only to a file "
                "with one, so it changes nothing outside the file it means"
            )
        size = st.st_size
        if size == 0:
            data = header + body
        else:  # decided at write time, so a line the human just added without "\n" stays whole
            data = body if os.pread(fd, 1, size - 1) == b"\n" else nl + body
        append_whole(fd, data.encode("utf-8", "surrogateescape"), size)  # all or nothing
    finally:
        os.close(fd)
    if size == 0:
        fsync_dir(path.parent)


@functools.cache
def _exchange_fn() -> Callable[[str, str], bool] | None:
    """An atomic swap of two paths (Linux renameat2 RENAME_EXCHANGE, macOS renamex_np RENAME_SWAP)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        fn = libc.renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]

        def call(a: bytes, b: bytes) -> int:
            return int(fn(-100, a, -100, b, 2))  # AT_FDCWD, RENAME_EXCHANGE

    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        fn = libc.renamex_np
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]

        def call(a: bytes, b: bytes) -> int:
            return int(fn(a, b, 2))  # RENAME_SWAP

    else:
        return None

    def exchange(a: str, b: str) -> bool:
        if call(os.fsencode(a), os.fsencode(b)) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False  # this filesystem cannot swap; the caller falls back to os.replace
        raise OSError(err, os.strerror(err), a)

    return exchange


def swap_in(path: Path, base: Snapshot, new_text: str) -> bool:
    """Replace ``path`` with ``new_text`` only if it still is ``base``; False = it changed."""
    data = new_text.encode("utf-8", "surrogateescape")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            if base.st is not None:
                os.fchmod(fd, stat.S_IMODE(base.st.st_mode))
            else:  # a new file: the mode the user's own files in that folder get
                os.fchmod(fd, file_mode(os.stat(path.parent)))
            _write_all(fd, data)
            fsync(fd)
        finally:
            os.close(fd)
        if snapshot_bytes(path) != base.data:
            return False
        exchange = _exchange_fn()
        if exchange is None or base.fd is None or base.st is None or not exchange(tmp, str(path)):
            os.replace(tmp, path)  # no atomic swap here: the re-read above is the whole check
        elif not _settle(path, tmp, base, len(data), exchange):
            return False
        fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _settle(
    path: Path, tmp: str, base: Snapshot, written: int, exchange: Callable[[str, str], bool]
) -> bool:
    """After a swap, ``tmp`` holds the displaced file: undo unless it is ``base`` plus appends
    and nobody can write to it any more."""
    assert base.fd is not None and base.st is not None
    displaced = os.stat(tmp, follow_symlinks=False)
    if (displaced.st_dev, displaced.st_ino) == (base.st.st_dev, base.st.st_ino):
        quiet = _no_writers(base.fd, SALVAGE_WAIT_S)
        if quiet is None:  # the kernel cannot tell here: give a late writer a moment
            time.sleep(SALVAGE_GRACE_S)
        now = _read_from(base.fd, 0)
        if quiet is not False and now.startswith(base.data):
            tail = now[len(base.data) :]
            if tail:  # appended to the old file after our check: carry it over
                append_text(path, tail.decode("utf-8", "surrogateescape"))
            return True
    # Someone renamed a new file in, rewrote it in place, or still holds it open to write (an
    # `echo >>` between its open and its write): give theirs back.
    exchange(tmp, str(path))
    late = snapshot_bytes(Path(tmp))[written:]
    if late:  # appended to our file while it was in place
        append_text(path, late.decode("utf-8", "surrogateescape"))
    return False


def _no_writers(fd: int, timeout: float) -> bool | None:
    """Whether no process holds the file of ``fd`` open for writing, waiting up to ``timeout``
    for one to close it; None where the kernel cannot tell.

    Linux grants a read lease only on a file nobody has open for writing, so taking one (and
    letting it go at once) is the question asked of the kernel. A file renamed away can no
    longer be opened by its name, so once the answer is yes no later write can reach it. The
    lease's break signal is SIGURG, which is ignored by default, should anyone open the file
    in the instant the lease is held."""
    if not hasattr(fcntl, "F_SETLEASE"):
        return None
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            if exc.errno != errno.EAGAIN:  # not ours, or a filesystem without leases
                return None
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            continue
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True


def snapshot_bytes(path: Path) -> bytes:
    snap = snapshot(path)
    if snap.fd is not None:
        os.close(snap.fd)
    return snap.data
