"""Idempotency keys: the same key twice runs the work once, and the second caller gets the
first one's result (a client retrying after a timeout, whose first request may still run);
for appends, the keys are kept on disk with the writes they guard, so a retry after a crash
of the daemon does not write twice either (AppendKeys)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.atomicfile import fsync, write_atomic
from memd_client.errors import BadRequest

logger = logging.getLogger(__name__)

__all__ = [
    "APPEND_KEYS_KEPT",
    "APPEND_KEY_SECONDS",
    "AppendKeys",
    "KeyRecord",
    "Once",
    "crash_point",
    "landed",
]

# How many append keys are kept, and how long: a client retries within ten minutes.
APPEND_KEYS_KEPT = 10_000
APPEND_KEY_SECONDS = 600.0


class Once:
    """Results by key, each kept for ``seconds`` and at most ``kept`` of them, oldest first.

    A key comes with the request it stands for (``fingerprint``, e.g. the text to append): the
    same key with another request is a BadRequest, not a silent duplicate. A run that fails
    forgets its key, so a retry runs again.
    """

    def __init__(self, *, kept: int = 10_000, seconds: float = 600.0) -> None:
        self.kept = kept
        self.seconds = seconds
        self._slots: OrderedDict[Hashable, tuple[float, Future[dict[str, Any]], object]]
        self._slots = OrderedDict()
        self._lock = threading.Lock()

    def run(
        self,
        key: Hashable,
        fingerprint: object,
        work: Callable[[], dict[str, Any]],
        *,
        wait: float,
    ) -> tuple[dict[str, Any], bool]:
        """(the result of ``work`` for ``key``, whether it is an earlier run's)."""
        with self._lock:
            now = time.monotonic()
            while self._slots and (
                len(self._slots) > self.kept
                or next(iter(self._slots.values()))[0] < now - self.seconds
            ):
                self._slots.popitem(last=False)
            entry = self._slots.get(key)
            if entry is None:
                slot: Future[dict[str, Any]] = Future()
                self._slots[key] = (now, slot, fingerprint)
            else:
                _, slot, seen = entry
                if seen != fingerprint:
                    raise BadRequest("idempotency_key was already used for another text")
        if entry is not None:
            return dict(slot.result(timeout=wait)), True
        try:
            result = work()
        except BaseException as exc:
            with self._lock:
                self._slots.pop(key, None)  # failed: a retry may try again
            slot.set_exception(exc)
            raise
        slot.set_result(result)
        return result, False


# -- keys that outlive the daemon -----------------------------------------------------------------


@dataclass
class KeyRecord:
    """What memd wrote down about one key before its text went to disk, and the result once
    the text is there."""

    fingerprint: str  # sha256 of the text
    path: str  # the workspace-relative file the text goes to
    device: int  # its identity and size before the write (0, 0, 0 when it did not exist)
    inode: int
    size: int
    at: float  # wall-clock time of the intent: records expire by it
    result: dict[str, Any] | None = None  # path, start_line, end_line once known


class AppendKeys:
    """Idempotency keys of appends, durable with the writes they guard.

    Before an append's text is written, an intent (the key, a fingerprint of the text, the
    target file and its identity and size) is appended to a journal in memd's state and
    fsynced; once the text is written, its result follows. A retry after a crash finds the
    key: with a result, it gets that result; with an intent only, the target file is read
    from the recorded offset to learn whether the text landed (then its lines are the
    result) or not (then it is written). So a key's text is written once whichever instant
    the daemon died. Records are kept ``seconds`` (the retry window), at most ``kept``; the
    journal is rewritten with the live ones when it holds many more lines than that.
    """

    JOURNAL_SLACK = 1000  # dead lines tolerated before the journal is rewritten

    def __init__(
        self,
        path: Path | None,
        *,
        kept: int = 10_000,
        seconds: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.kept = kept
        self.seconds = seconds
        self.clock = clock
        self._records: dict[str, KeyRecord] = {}
        self._lines = 0
        self._fd: int | None = None
        self._lock = threading.Lock()
        if path is not None:
            self._load(path)
            self._rewrite()

    # -- the journal ----------------------------------------------------------------------------

    def _load(self, path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        with os.fdopen(fd, "rb") as f:
            lines = f.read().splitlines()
        horizon = self.clock() - self.seconds
        for line in lines:  # a line cut short by a crash does not parse: skipped
            try:
                entry = json.loads(line)
                kid, at = str(entry["k"]), float(entry["t"])
                if "r" in entry:
                    record = self._records.get(kid)
                    if record is not None:
                        record.result = dict(entry["r"])
                    continue
                record = KeyRecord(
                    str(entry["f"]),
                    str(entry["p"]),
                    int(entry["d"]),
                    int(entry["i"]),
                    int(entry["s"]),
                    at,
                )
            except (ValueError, KeyError, TypeError):
                continue
            if at >= horizon:
                self._records.pop(kid, None)  # the newest intent of a key is the one in force
                self._records[kid] = record

    def _rewrite(self) -> None:
        """Replace the journal with the live records (temp file, fsync, rename)."""
        assert self.path is not None
        self._expire()
        lines = []
        for kid, r in self._records.items():
            lines.append(self._intent_line(kid, r))
            if r.result is not None:
                lines.append(self._result_line(kid, r.result, r.at))
        write_atomic(self.path, b"".join(lines))
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        self._lines = len(lines)

    def _write(self, line: bytes, *, durable: bool) -> None:
        if self._fd is None:
            return  # kept in memory only
        if self._lines > 2 * len(self._records) + self.JOURNAL_SLACK:
            self._rewrite()
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            if os.write(self._fd, line) != len(line):
                raise OSError(errno.ENOSPC, "short write")
            if durable:
                fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):  # no half line for the next one to follow
                os.ftruncate(self._fd, end)
            raise
        self._lines += 1

    def _expire(self) -> None:
        horizon = self.clock() - self.seconds
        while self._records:
            kid, oldest = next(iter(self._records.items()))
            if oldest.at >= horizon and len(self._records) <= self.kept:
                break
            del self._records[kid]

    @staticmethod
    def _intent_line(kid: str, r: KeyRecord) -> bytes:
        entry = {"k": kid, "f": r.fingerprint, "p": r.path, "d": r.device, "i": r.inode}
        entry |= {"s": r.size, "t": r.at}
        return json.dumps(entry, separators=(",", ":")).encode() + b"\n"

    @staticmethod
    def _result_line(kid: str, result: dict[str, Any], at: float) -> bytes:
        return json.dumps({"k": kid, "r": result, "t": at}, separators=(",", ":")).encode() + b"\n"

    # -- keys -----------------------------------------------------------------------------------

    @staticmethod
    def key_id(root: Path, key: str) -> str:
        return hashlib.sha256(f"{root}\0{key}".encode()).hexdigest()[:32]

    def recall(self, root: Path, key: str, text: str) -> dict[str, Any] | None:
        """The result of an earlier append of ``text`` under ``key`` in the workspace at
        ``root`` (path, start_line, end_line), or None when its text is not on disk (never
        sent, or lost in a crash before it was written). The same key with another text is a
        BadRequest."""
        kid = self.key_id(root, key)
        with self._lock:
            self._expire()
            record = self._records.get(kid)
            if record is None:
                return None
            if record.fingerprint != fingerprint(text):
                raise BadRequest("idempotency_key was already used for another text")
            if record.result is not None:
                return dict(record.result)
        lines = landed(root, record, text)
        if lines is None:
            return None
        result = {"path": record.path, "start_line": lines[0], "end_line": lines[1]}
        self.done(root, key, result)
        return result

    def intend(self, root: Path, key: str, text: str, rel: str) -> None:
        """Record, durably, that ``text`` is about to be appended to ``root/rel``."""
        try:
            st = os.lstat(root / rel)
            device, inode, size = st.st_dev, st.st_ino, st.st_size
        except OSError:
            device = inode = size = 0
        kid = self.key_id(root, key)
        record = KeyRecord(fingerprint(text), rel, device, inode, size, self.clock())
        with self._lock:
            self._records.pop(kid, None)
            self._records[kid] = record
            self._expire()
            try:
                self._write(self._intent_line(kid, record), durable=True)
            except OSError as exc:
                # The text still goes to the user's file (on its own disk): only a retry after
                # a crash could write it twice. The key holds while this daemon runs.
                logger.warning(
                    "could not record an append's idempotency key (%s): it holds until a restart",
                    exc.strerror or exc,
                )

    def done(self, root: Path, key: str, result: dict[str, Any]) -> None:
        """Record where the text of ``key`` landed (no fsync: a lost line is found again in
        the file)."""
        kid = self.key_id(root, key)
        kept = {k: result[k] for k in ("path", "start_line", "end_line")}
        with self._lock:
            record = self._records.get(kid)
            if record is None:
                return
            record.result = kept
            try:
                self._write(self._result_line(kid, kept, record.at), durable=False)
            except OSError as exc:  # a retry finds the text in the file instead
                logger.warning("could not record where an append landed: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


MAX_SCAN_BYTES = 64 * 1024 * 1024


def landed(root: Path, record: KeyRecord, text: str) -> tuple[int, int] | None:
    """The (start, end) lines where ``text`` is in the file ``record`` names, appended after
    the intent, or None when it is not there.

    The entry is looked for as memd/markdown/append.py writes it: the text with CRLF as LF and
    no trailing newlines, then one newline, at the start of a line. In the same file (same
    inode, not shorter than before) it is looked for from the recorded size on (other
    appends may have landed first); in a file replaced since (an editor's save), anywhere.
    """
    body = text.replace("\r\n", "\n").rstrip("\n")
    entry = (body + "\n").encode("utf-8", "surrogatepass")
    try:
        fd = os.open(root / record.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        same = (st.st_dev, st.st_ino) == (record.device, record.inode) and st.st_size >= record.size
        start = max(record.size - 1, 0) if same else 0
        data = os.pread(fd, MAX_SCAN_BYTES, start)
    finally:
        os.close(fd)
    at = 0
    while (found := data.find(entry, at)) >= 0:
        if (start + found == 0) or (found > 0 and data[found - 1 : found] == b"\n"):
            break
        at = found + 1
    else:
        return None
    # Lines before the entry: those in the part not read, and those read before it.
    before = 0
    if start:
        before = _newlines(root / record.path, start)
    first = before + data[:found].count(b"\n") + 1
    return first, first + body.count("\n")


def _newlines(path: Path, end: int) -> int:
    """How many newlines the first ``end`` bytes of ``path`` hold."""
    count = 0
    with open(path, "rb") as f:
        left = end
        while left > 0 and (block := f.read(min(left, 1 << 16))):
            count += block.count(b"\n")
            left -= len(block)
    return count


def crash_point(name: str) -> None:
    """Die at once (SIGKILL) when ``MEMD_CRASH_AT`` names this point: how the crash tests
    stop a real daemon at a chosen instant of an append."""
    if name in os.environ.get("MEMD_CRASH_AT", "").split(","):
        os.kill(os.getpid(), signal.SIGKILL)
