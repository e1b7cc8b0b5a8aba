"""Records the short-term results of searches off the reply path, coalesced per workspace."""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from memd.clock import Clock
from memd.dreams.recall_store import RecallStore
from memd.dreams.recall_text import is_short_term

__all__ = ["RecallRecorder", "gather_seconds"]

logger = logging.getLogger(__name__)

_STOP = object()

# Searches gather at least this long before a store is rewritten: one rewrite per workspace
# per second at most, whatever the search rate (a recall's count is not urgent; wait_idle,
# which dreaming and promotion call, hurries it).
GATHER_S = 1.0
# And long enough that rewriting the stores writes at most this many bytes a second, up to
# GATHER_MAX_S: a store grows with the chunks that get recalled (8.7 MB at 10,000 entries),
# and a daemon searched all day rewrote it every second.
WRITE_BUDGET = 256 * 1024
GATHER_MAX_S = 60.0
# What a recall entry reads of a search hit (recall_store.RecallStore._apply and
# claims.recalled_claims). The queue holds up to a minute of searches; it keeps these fields,
# not the whole reply (match lines, each half's score).
RECALLED = ("path", "start_line", "end_line", "source", "score", "snippet", "snippet_start_line")
# The queue's bound in memory, counted as each hit's snippet plus HIT_BYTES for the rest of it:
# a minute of searches at 10 hits each fits up to about 50 searches a second. Past it a search's
# recalls are dropped (and counted, and logged) rather than held: a search is never slowed.
QUEUE_BYTES = 32 << 20
HIT_BYTES = 400


def gather_seconds(store_bytes: int) -> float:
    """How long searches gather before stores of ``store_bytes`` in all are rewritten."""
    return min(GATHER_MAX_S, max(GATHER_S, store_bytes / WRITE_BUDGET))


class RecallRecorder:
    """A thread that writes recalls to each workspace's recall store.

    A search only puts its results (and its time) on a queue; the thread lets them gather for
    GATHER_S, then writes each workspace's share with one atomic rewrite. It keeps one
    RecallStore per workspace, which trusts its own last write instead of parsing it again.
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._run, name="memd-recalls", daemon=True)
        # Searches are numbered as they are queued; waiters wait for a number, not for an
        # empty queue (which a steady stream of searches would never give them).
        self._cond = threading.Condition()
        self._queued = 0
        self._written = 0
        self._hurry = threading.Event()
        self._stores: dict[Path, RecallStore] = {}
        self.recorded = 0
        self.dropped = 0
        self.max_bytes = QUEUE_BYTES
        self._bytes = 0  # of the searches queued and not yet written
        self.gather_s = GATHER_S  # grows with the stores written (gather_seconds)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop."""
        self._queue.put(_STOP)
        self._hurry.set()
        self._thread.join(timeout)

    def submit(
        self,
        root: Path,
        query: str,
        results: Sequence[Mapping[str, Any]],
        *,
        folder: Path | None = None,
    ) -> None:
        """Queue the results of one search in the workspace at ``root`` (its dreaming files in
        ``folder``: memd/dreams/place.py); only dated daily-log results are kept."""
        short = [
            {k: r[k] for k in RECALLED if k in r}
            for r in results
            if is_short_term(str(r.get("path", "")))
        ]
        if not short:
            return
        when = self.clock.now()  # the search's time, not the write's
        size = sum(HIT_BYTES + sys.getsizeof(r.get("snippet") or "") for r in short)
        with self._cond:
            try:
                if self._bytes + size > self.max_bytes:
                    raise queue.Full
                self._queue.put_nowait(((root, folder), query, short, when, size))
            except queue.Full:
                self.dropped += 1  # never slow a search down: a lost recall only lowers a count
                if self.dropped in (1, 10) or self.dropped % 1000 == 0:
                    logger.warning(
                        "recall recorder behind: %d searches' recalls not recorded", self.dropped
                    )
                return
            self._queued += 1
            self._bytes += size

    def store(self, root: Path, folder: Path | None = None) -> RecallStore:
        """The store of the workspace at ``root`` (its dreaming files in ``folder``) that the
        recorder writes. One object per workspace for every writer in the daemon: it trusts
        its own last write, so an explicit record_recall does not parse the whole file again
        (two thirds of a second at 2,800 entries on a busy 2-core machine)."""
        with self._cond:
            store = self._stores.get(root)
            if store is None or (folder is not None and store.dir != folder):
                store = self._stores[root] = RecallStore(root, folder=folder, clock=self.clock)
            return store

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until everything submitted before this call is written (tests, promotion)."""
        with self._cond:
            target = self._queued
            self._hurry.set()
            return self._cond.wait_for(lambda: self._written >= target, timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is not _STOP:
                self._hurry.wait(self.gather_s)
            self._hurry.clear()
            batch = [item]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = any(i is _STOP for i in batch)
            by_root: dict[
                tuple[Path, Path | None], list[tuple[str, list[dict[str, Any]], datetime]]
            ]
            by_root = {}
            held = 0  # bytes, counted in the queue's bound until written
            for i in batch:
                if i is not _STOP:
                    root, query, results, when, size = i
                    by_root.setdefault(root, []).append((query, results, when))
                    held += size
            written = 0
            for (root, folder), searches in by_root.items():
                try:
                    store = self.store(root, folder)
                    self.recorded += store.record_many(searches)
                    with contextlib.suppress(OSError):
                        written += store.path.stat().st_size
                except Exception as exc:  # a recall store problem never reaches a search
                    logger.warning("recording recalls in %s failed: %s", root, exc)
                with self._cond:
                    self._written += len(searches)
                    self._cond.notify_all()
            with self._cond:
                self._bytes -= held
            if written:
                self.gather_s = gather_seconds(written)
            if stopping:
                return
