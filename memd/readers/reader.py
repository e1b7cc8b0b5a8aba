"""One reader process as the daemon's pool sees it: started, spoken to in frames, stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from typing import Any

from memd import frames
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

    def __post_init__(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._pipe = frames.Pipe(self.proc.stdin, self.proc.stdout)

    @classmethod
    def start(cls, ident: int) -> Reader:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        proc = frames.start_child("memd.readers.host", env=env)
        return cls(ident, proc)

    # -- frames ---------------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._pipe.send(message, ANSWER_TIMEOUT_S)
        except frames.ChildFailed as exc:
            raise self._failed(exc) from None

    def receive(self, timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        try:
            return self._pipe.receive(timeout)
        except frames.ChildFailed as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: frames.ChildFailed) -> ReaderDied:
        if exc.why == "closed":
            return ReaderDied(self._reap())
        self.kill()  # hung, or talking nonsense
        return ReaderDied(str(exc))

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
        return frames.describe_exit(code)

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
        self._pipe.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for index in self.indexes.values():
            index.forget_remote_sketch(self.ident)
