"""The embedding queue: one thread that owns an embedder; query embeddings jump ahead of queued
document batches, and the vectors of recent queries are kept (agents repeat their searches).
(The model worker, the process that runs a local model, is memd/embed/process.py and
memd/embed/host.py.)"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from memd.embed.base import Embedder, Kind, Preempted, Vectors, document_jobs
from memd_client.errors import ProviderUnavailable

__all__ = ["EmbeddingQueue", "QueuedEmbedder"]

logger = logging.getLogger(__name__)

_PRIORITY = {"query": 0, "document": 1}

RECENT_QUERIES = 256
"""Query vectors kept, most recently used first out last: 256 × 384 floats is 400 KB."""


@dataclass(order=True)
class _Job:
    priority: int
    seq: int
    texts: Sequence[str] = field(compare=False)
    kind: Kind = field(compare=False)
    future: Future[Vectors] = field(compare=False)
    stopped: bool = field(compare=False, default=False)  # once stopped for a query


class EmbeddingQueue:
    """Serialises every call into an embedder through one thread (llama.cpp is not re-entrant).

    Jobs are served by priority: a search's query waits for at most the document job that is
    already running, never for the queue behind it, and an embedder that can (the local
    model's worker) stops that job for it: the job is run again after the query.
    """

    def __init__(self, embedder: Embedder, *, name: str = "memd-embed") -> None:
        self.embedder = embedder
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopping = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self._running: _Job | None = None
        self.preempted = 0  # document jobs stopped for a query (and run again)

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._thread.start()
                self._started = True

    def submit(self, texts: Sequence[str], kind: Kind = "document") -> Future[Vectors]:
        if self._stopping.is_set():
            raise RuntimeError("embedding worker is stopped")
        self.start()
        future: Future[Vectors] = Future()
        self._queue.put(_Job(_PRIORITY[kind], next(self._seq), list(texts), kind, future))
        running = self._running
        # A job is stopped once at most: queries arriving faster than a job takes would
        # otherwise starve the documents (and the writer waiting for them) for good.
        if kind == "query" and running is not None and running.kind == "document":
            if not running.stopped:
                self.embedder.preempt()
        return future

    def embed(
        self, texts: Sequence[str], kind: Kind = "document", timeout: float | None = None
    ) -> Vectors:
        return self.submit(texts, kind).result(timeout)

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the running job, fail the queued ones, and join the thread."""
        self._stopping.set()
        self._queue.put(_Job(-1, -1, [], "query", Future()))  # wakes a blocked get()
        if self._started:
            self._thread.join(timeout)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job.seq >= 0 and _claim(job.future):
                job.future.set_exception(RuntimeError("embedding worker stopped"))

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job.seq < 0 or self._stopping.is_set():
                if job.seq >= 0 and _claim(job.future):
                    job.future.set_exception(RuntimeError("embedding worker stopped"))
                return
            if not _claim(job.future):
                continue
            self._running = job
            try:
                job.future.set_result(self.embedder.embed_batch(job.texts, kind=job.kind))
            except Preempted:
                self.preempted += 1
                job.stopped = True
                self._queue.put(job)  # its place among the documents: first
            except BaseException as exc:  # handed to the caller, who decides what it means
                job.future.set_exception(exc)
            finally:
                self._running = None


def _claim(future: Future[Vectors]) -> bool:
    """Mark ``future`` running (a job stopped for a query comes back running); False when it
    was cancelled."""
    return future.running() or future.set_running_or_notify_cancel()


class _QueryVector(Future[Vectors]):
    """A query's vector; ``result()`` without a timeout waits at most ``deadline`` seconds, then
    gives up on the embedding (still queued: it never runs) with ProviderUnavailable."""

    def __init__(self, deadline: float | None, provider: str) -> None:
        super().__init__()
        self.deadline = deadline
        self.provider = provider
        self.batch: Future[Vectors] | None = None

    def result(self, timeout: float | None = None) -> Vectors:
        try:
            return super().result(self.deadline if timeout is None else timeout)
        except TimeoutError:
            if self.done():  # done just now, or the embedder's own TimeoutError
                return super().result(0)
            if timeout is not None:
                raise
            if self.batch is not None:
                self.batch.cancel()
            raise ProviderUnavailable(
                f"{self.provider}: no query embedding within {self.deadline:g} s"
            ) from None


def _with_deadline(
    started: Future[Vectors], deadline: float | None, provider: str
) -> Future[Vectors]:
    """``started`` behind a _QueryVector: a search waits ``deadline`` seconds at most."""
    future = _QueryVector(deadline, provider)
    future.batch = started

    def done(vector: Future[Vectors]) -> None:
        if vector.cancelled():
            return
        exc = vector.exception()
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(vector.result())

    started.add_done_callback(done)
    return future


class QueuedEmbedder(Embedder):
    """An Embedder whose calls all run on an EmbeddingQueue; same identity as the inner one.

    An inner embedder with threads of its own (``own_threads``: a remote API, whose requests
    run in parallel and whose queries never wait for documents) is called directly instead.
    With ``query_timeout``, a search waits at most that many seconds for its query's vector (a
    provider that hangs, a document batch stuck ahead of it), then gets ProviderUnavailable.

    The vectors of the last ``RECENT_QUERIES`` distinct query texts are kept, read-only: the
    same text asked again costs no embedding (one embedder, one identity: a new model is a new
    QueuedEmbedder). A failed embedding is not kept.
    """

    def __init__(self, inner: Embedder, *, query_timeout: float | None = None) -> None:
        self.inner = inner
        self.worker = EmbeddingQueue(inner)
        self.provider = inner.provider
        self.model = inner.model
        self.dims = inner.dims
        self.max_tokens = inner.max_tokens
        self.batch_size = inner.batch_size
        self.own_threads = inner.own_threads
        self.kind = inner.kind
        self.step_chars = inner.step_chars
        self.query_timeout = query_timeout
        self._recent: OrderedDict[str, Vectors] = OrderedDict()
        self._recent_lock = threading.Lock()

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if self.own_threads:
            return self.inner.embed_batch(texts, kind=kind)
        if kind == "query" or len(texts) < 2:
            return self.worker.embed(texts, kind)
        parts = [self.worker.embed(job, kind) for job in document_jobs(texts)]
        return np.concatenate(parts)

    def embed_query(self, text: str) -> Vectors:
        return self.start_query(text).result()

    def start_query(self, text: str) -> Future[Vectors]:
        with self._recent_lock:
            known = self._recent.get(text)
            if known is not None:
                self._recent.move_to_end(text)
        if known is not None:
            ready: Future[Vectors] = Future()
            ready.set_result(known)
            return ready
        future = self._embed_query(text)
        future.add_done_callback(lambda done: self._remember(text, done))
        return future

    def _remember(self, text: str, done: Future[Vectors]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        vector = done.result()
        vector.setflags(write=False)  # shared by every search that asks the same
        with self._recent_lock:
            self._recent[text] = vector
            self._recent.move_to_end(text)
            while len(self._recent) > RECENT_QUERIES:
                self._recent.popitem(last=False)

    def _embed_query(self, text: str) -> Future[Vectors]:
        if self.own_threads:  # a thread of its queries' own, never behind documents
            return _with_deadline(self.inner.start_query(text), self.query_timeout, self.provider)
        # An idle local worker takes the query from this thread: nothing to wake, and the
        # model embeds while the caller goes on (the worker's own deadline bounds the wait).
        sent = self.inner.send_query(text)
        if sent is not None:
            return sent
        future = _QueryVector(self.query_timeout, self.provider)

        def done(batch: Future[Vectors]) -> None:
            if batch.cancelled():
                return
            exc = batch.exception()
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(batch.result()[0])

        future.batch = self.worker.submit([text], "query")
        future.batch.add_done_callback(done)
        return future

    def searching(self) -> AbstractContextManager[None]:
        return self.inner.searching()

    def query_takes_every_core(self) -> bool:
        return self.inner.query_takes_every_core()

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens_many(texts)

    def plan_requests(self, texts: Sequence[str]) -> int:
        return self.inner.plan_requests(texts)

    def settings(self) -> dict[str, object]:
        return self.inner.settings()

    def health(self) -> dict[str, object] | None:
        return self.inner.health()

    def close(self) -> None:
        self.worker.stop()
        self.inner.close()

    def describe(self) -> str:
        return self.inner.describe()
