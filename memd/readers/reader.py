"""One reader process as the daemon's pool sees it: started, spoken to in frames, stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import subprocess
import sys
import time
from typing import IO, Any

import msgpack

from memd.embed.host import HEADER, MAX_FRAME, pack_frame
from memd.embed.process import describe_exit
from memd.index.index import Index

__all__ = ["ANSWER_TIMEOUT_S", "Reader", "ReaderDied"]

# Seconds a reader may take to answer one frame (to start, to open an index and load its
# sketch, to run a search): past it the reader is killed and the search runs in the daemon.
ANSWER_TIMEOUT_S = 60.0


class ReaderDied(Exception):
    """The reader exited, closed its pipe or did not answer in time."""


@dataclasses.dataclass(eq=False)
class Reader:
    ident: int
    proc: subprocess.Popen[bytes]
    busy: bool = True  # starting counts as busy
    opened: set[str] = dataclasses.field(default_factory=set)  # index tokens
    indexes: dict[str, Index] = dataclasses.field(default_factory=dict)  # path -> reported to

    @classmethod
    def start(cls, ident: int) -> Reader:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "memd.readers.host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        return cls(ident, proc)

    # -- frames ---------------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(pack_frame(message))
            stdin.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            raise ReaderDied(self._reap()) from None

    def receive(self, timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        stdout = self.proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        (size,) = HEADER.unpack(self._read(stdout, HEADER.size, deadline, timeout))
        if size > MAX_FRAME:
            self.kill()
            raise ReaderDied("a malformed reply")
        reply = msgpack.unpackb(self._read(stdout, size, deadline, timeout), raw=False)
        if not isinstance(reply, dict):
            self.kill()
            raise ReaderDied("a malformed reply")
        return reply

    def _read(self, stream: IO[bytes], size: int, deadline: float, timeout: float) -> bytes:
        chunks: list[bytes] = []
        left = size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([stream], [], [], remaining)[0]:
                if time.monotonic() < deadline:
                    continue
                self.kill()
                raise ReaderDied(f"no answer within {timeout:g} s")
            data = os.read(stream.fileno(), left)
            if not data:
                raise ReaderDied(self._reap())
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)

    # -- ending ---------------------------------------------------------------------------------

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def _reap(self) -> str:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            return "closed its pipe and was killed"
        return describe_exit(code)

    def stop(self) -> None:
        """Close its pipe (a reader exits when it ends) and wait; kill it if it lingers."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for index in self.indexes.values():
            index.forget_remote_sketch(self.ident)
