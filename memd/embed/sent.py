"""A search's query in the model worker's pipe, the count of searches in flight, and the log
of queries embedded: what :class:`memd.embed.process.ProcessEmbedder` keeps for queries."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Protocol

from memd.embed.base import Vectors

__all__ = ["QueryLog", "Searches", "SentQuery"]


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

    def __init__(self, owner: Collector, deadline: float, sent_at: float) -> None:
        super().__init__()
        self.owner = owner
        self.deadline = deadline  # monotonic: the worker is taken for hung after it
        self.sent_at = sent_at
        self.set_running_or_notify_cancel()

    def result(self, timeout: float | None = None) -> Vectors:
        if not self.done():
            self.owner.collect(self, timeout)
        return super().result(timeout)


class QueryLog:
    """Queries embedded by the local model: how many had each llama.cpp thread count, which
    the last one had, and what the last ``RECENT`` of each count took in llama.cpp (what a
    hybrid search waits for, at the pace queries really come)."""

    RECENT = 200

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a query may be logged while status reads
        self._counts: dict[int, int] = {}
        self._times: dict[int, collections.deque[float]] = {}
        self._outside: dict[int, collections.deque[float]] = {}
        self.last = 0  # the thread count of the last query (0: none yet)

    def add(self, threads: int, seconds: float | None, outside: float | None = None) -> None:
        with self._lock:
            self._counts[threads] = self._counts.get(threads, 0) + 1
            self.last = threads
            for log, value in ((self._times, seconds), (self._outside, outside)):
                if value is not None:
                    log.setdefault(threads, collections.deque(maxlen=self.RECENT)).append(value)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {str(k): v for k, v in sorted(self._counts.items())}

    def times_ms(self) -> dict[str, dict[str, float]]:
        """By thread count: the median and 90th percentile of the recent queries' times in
        llama.cpp, how many queries that is, and the median time outside it."""
        with self._lock:
            recent = {k: sorted(v) for k, v in sorted(self._times.items()) if v}
            outside = {k: sorted(v) for k, v in self._outside.items() if v}
        out: dict[str, dict[str, float]] = {}
        for k, v in recent.items():
            out[str(k)] = {"p50": _ms(v, 5), "p90": _ms(v, 9), "queries": len(v)}
            if k in outside:
                out[str(k)]["outside_p50"] = _ms(outside[k], 5)
        return out


def _ms(ordered: list[float], tenths: int) -> float:
    """The value ``tenths``/10 of the way up ``ordered``, in milliseconds."""
    return round(1000 * ordered[min(len(ordered) - 1, len(ordered) * tenths // 10)], 2)
