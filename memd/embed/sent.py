"""A search's query in the model worker's pipe, and the count of searches in flight: the two
things :class:`memd.embed.process.ProcessEmbedder` keeps for queries a search sends itself."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Protocol

from memd.embed.base import Vectors

__all__ = ["Searches", "SentQuery"]


class Collector(Protocol):
    def collect(self, sent: SentQuery, timeout: float | None) -> None: ...


class Searches:
    """Searches in flight in the daemon (a query alone may take every core)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        with self._lock:
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self.count -= 1


class SentQuery(Future[Vectors]):
    """A query sent to the worker, its reply not read yet. Whoever takes the pipe next reads it
    first: the search that sent it, when it wants the vector, or any request after it (a
    document job, another query), so the pipe is not held while the search does other work."""

    def __init__(self, owner: Collector, deadline: float) -> None:
        super().__init__()
        self.owner = owner
        self.deadline = deadline  # monotonic: the worker is taken for hung after it
        self.set_running_or_notify_cancel()

    def result(self, timeout: float | None = None) -> Vectors:
        if not self.done():
            self.owner.collect(self, timeout)
        return super().result(timeout)
