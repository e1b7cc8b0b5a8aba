"""Frames between the daemon and the processes it starts: the model worker and the readers.

A frame is a 4-byte big-endian length, then that many bytes of msgpack holding one map. A
child reads and writes its frames blocking (:func:`read`, :func:`write`); the daemon reads a
child's answer under a deadline (:class:`Pipe`), so a child hung in native code, gone, or
answering garbage is a :class:`ChildFailed` that says which, never a daemon waiting for good.
Errors cross as the client's wire errors, ``{"error": [code, message]}``.
"""

from __future__ import annotations

import os
import selectors
import signal
import struct
import subprocess
import sys
import time
from typing import IO, Any

import msgpack

from memd_client.errors import MemdError, from_wire, to_wire

__all__ = [
    "HEADER",
    "MAX_FRAME",
    "ChildFailed",
    "Pipe",
    "begin_child",
    "describe_exit",
    "error_frame",
    "pack",
    "raise_error",
    "read",
    "start_child",
    "write",
]

MAX_FRAME = 256 << 20
HEADER = struct.Struct(">I")


class ChildFailed(Exception):
    """A child's answer did not come: ``why`` is "timeout", "closed" or "malformed"."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why = why


# A child ignores SIGINT and SIGTERM from its first instruction, before its module's imports
# (numpy, apsw: a third of a second in which a stop would kill it), then runs as ``-m module``.
_IGNORING_STOPS = """\
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
import runpy
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def start_child(
    module: str, *args: str, stdin: int = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m module args`` with its frames on its stdout.

    A stop is the daemon's to make, and the daemon stops a child by closing its stdin (or
    kills it). A terminal's Ctrl-C and a service manager that signals every process of the
    service (systemd's default KillMode; memd's own unit says KillMode=mixed) reached the
    children too, and a child that died of it was a "crash" in the log and a failed embedding
    or search in the middle of a clean stop. So a child runs in a session of its own, out of
    the reach of signals to the daemon's group, and ignores SIGINT and SIGTERM sent to it.
    """
    return subprocess.Popen(
        [sys.executable, "-c", _IGNORING_STOPS, module, *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
        start_new_session=True,
    )


def begin_child() -> IO[bytes]:
    """What a process memd starts does first: returns the stream its frames go to, and points
    its own fd 1 at stderr, so nothing printed can corrupt the frames."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def pack(message: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def write(out: IO[bytes], message: dict[str, Any]) -> None:
    """Write one frame to a blocking stream (a child's side)."""
    out.write(pack(message))
    out.flush()


def read(inp: IO[bytes]) -> dict[str, Any] | None:
    """The next frame from a blocking stream (a child's side); None at a clean end of file."""
    header = inp.read(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise EOFError("the stream ended inside a frame header")
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over the limit")
    body = inp.read(size)
    if len(body) < size:
        raise EOFError("the stream ended inside a frame")
    return _map(body)


def _map(body: bytes) -> dict[str, Any]:
    message = msgpack.unpackb(body, raw=False)
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a map")
    return message


def error_frame(exc: MemdError) -> dict[str, Any]:
    """The frame that carries ``exc`` to the daemon."""
    return {"error": to_wire(exc)}


def raise_error(reply: dict[str, Any]) -> None:
    """Raise the error a child's ``reply`` carries, as the client's exception, if it has one."""
    if "error" in reply:
        raise from_wire(reply["error"])


def describe_exit(returncode: int) -> str:
    """How a child ended, in a word or two: its signal's name, or its exit status."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


class Pipe:
    """The daemon's end of a child's stdin and stdout: frames sent and answers read under a
    deadline. The streams are read and written by file descriptor (no buffering), and made
    non-blocking here: a write or read is tried first, and waited for only when it would block."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.stdin, self.stdout = stdin, stdout
        os.set_blocking(stdin.fileno(), False)
        os.set_blocking(stdout.fileno(), False)
        self._readable = selectors.DefaultSelector()
        self._readable.register(stdout, selectors.EVENT_READ)
        self._writable = selectors.DefaultSelector()
        self._writable.register(stdin, selectors.EVENT_WRITE)

    def close(self) -> None:
        self._readable.close()
        self._writable.close()

    def send(self, message: dict[str, Any], timeout: float) -> None:
        """Send one frame; a child that stops reading (hung in native code) cannot block the
        daemon longer than ``timeout``, nor can a frame larger than the pipe's buffer."""
        deadline = time.monotonic() + timeout
        view = memoryview(pack(message))
        # Written first, waited for only when the pipe is full: a search's frames fit it, so
        # they cost no selector call at all.
        while view:
            try:
                view = view[os.write(self.stdin.fileno(), view) :]
            except BlockingIOError:
                _wait(self._writable, deadline, timeout)
            except (OSError, ValueError):  # a broken pipe, or one closed already
                raise ChildFailed("closed", "closed its pipe") from None

    def receive(self, timeout: float) -> dict[str, Any]:
        """The child's next frame, within ``timeout`` seconds."""
        return self._receive(time.monotonic() + timeout, timeout)

    def exchange(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``message`` and read its answer, both within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self.send(message, timeout)
        return self._receive(deadline, timeout)

    def _receive(self, deadline: float, timeout: float) -> dict[str, Any]:
        (size,) = HEADER.unpack(self._read(HEADER.size, deadline, timeout))
        if size > MAX_FRAME:
            raise ChildFailed("malformed", "a malformed reply")
        try:
            return _map(self._read(size, deadline, timeout))
        except (ValueError, msgpack.UnpackException) as exc:
            raise ChildFailed("malformed", "a malformed reply") from exc

    def _read(self, size: int, deadline: float, timeout: float) -> bytes:
        chunks: list[bytes] = []
        left = size
        while left:
            try:
                data = os.read(self.stdout.fileno(), left)
            except BlockingIOError:
                _wait(self._readable, deadline, timeout)
                continue
            if not data:
                raise ChildFailed("closed", "closed its pipe")
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)


def _wait(selector: selectors.BaseSelector, deadline: float, timeout: float) -> None:
    """Until ``selector``'s one pipe is ready, or ChildFailed("timeout") at ``deadline``."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining > 0 and selector.select(remaining):
            return
        if time.monotonic() >= deadline:
            raise ChildFailed("timeout", f"no answer within {timeout:g} s")
