"""The embedding worker: one thread, queries ahead of queued document batches."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from memd.embed.base import Kind, Preempted, Vectors
from memd.embed.fake import EmbedFailure, FakeEmbedder
from memd.embed.queued import RECENT_QUERIES, EmbeddingQueue, QueuedEmbedder


class Recording(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__(dims=8)
        self.order: list[str] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.started = threading.Event()

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        self.started.set()
        self.gate.wait(5)
        self.order.append(texts[0])
        self.threads.add(threading.current_thread().name)
        return super().embed_batch(texts, kind=kind)


def test_query_jumps_ahead_of_queued_documents() -> None:
    inner = Recording()
    worker = EmbeddingQueue(inner)
    try:
        docs = [worker.submit([f"doc{i}"], "document") for i in range(4)]
        assert inner.started.wait(5)  # doc0 is running; doc1..doc3 wait in the queue
        query = worker.submit(["the query"], "query")
        inner.gate.set()
        query.result(5)
        for f in docs:
            f.result(5)
    finally:
        worker.stop()
    assert inner.order == ["doc0", "the query", "doc1", "doc2", "doc3"]
    assert inner.threads == {"memd-embed"}


def test_errors_reach_the_caller_and_the_worker_survives() -> None:
    inner = FakeEmbedder(dims=8)
    wrapped = QueuedEmbedder(inner)
    try:
        inner.fail = True
        with pytest.raises(EmbedFailure):
            wrapped.embed_batch(["x"])
        inner.fail = False
        assert wrapped.embed_query("y").shape == (8,)
        assert wrapped.settings_key == inner.settings_key
        assert (wrapped.dims, wrapped.provider, wrapped.model) == (8, "fake", inner.model)
    finally:
        wrapped.close()


def test_stop_fails_queued_jobs_and_joins() -> None:
    inner = Recording()
    worker = EmbeddingQueue(inner)
    running = worker.submit(["first"], "document")
    queued = worker.submit(["second"], "document")
    assert inner.started.wait(5)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    inner.gate.set()
    stopper.join(5)
    assert running.result(5).shape == (1, 8)
    with pytest.raises(RuntimeError, match="stopped"):
        queued.result(5)
    with pytest.raises(RuntimeError, match="stopped"):
        worker.submit(["late"])


def test_start_query_returns_before_the_vector_is_ready() -> None:
    # A search runs its keyword half while its query is embedded: start_query must not block
    # on the embedder, and its future carries the vector (or the embedder's error).
    inner = Recording()
    wrapped = QueuedEmbedder(inner)
    try:
        future = wrapped.start_query("the query")
        assert inner.started.wait(5)
        assert not future.done()  # the embedder is held at its gate: the caller is free
        inner.gate.set()
        vector = future.result(5)
        assert vector.shape == (8,)
        assert (vector == FakeEmbedder(dims=8).embed_query("the query")).all()
        inner.fail = True
        with pytest.raises(EmbedFailure):
            wrapped.start_query("again").result(5)
        inner.fail = False
        plain = FakeEmbedder(dims=8)
        plain.fail = True
        with pytest.raises(EmbedFailure):  # the default, synchronous path: error in the future
            plain.start_query("x").result(0)
    finally:
        wrapped.close()


def test_a_document_batch_goes_in_small_jobs_so_a_query_waits_for_one() -> None:
    inner = Recording()
    wrapped = QueuedEmbedder(inner)
    texts = [f"chunk{i:02d} " + "x" * 400 for i in range(32)]  # 32 texts of 408 characters
    done: dict[str, Vectors] = {}
    try:
        batch = threading.Thread(target=lambda: done.update(v=wrapped.embed_batch(texts)))
        batch.start()
        assert inner.started.wait(5)  # the first job is running
        query = wrapped.start_query("the query")
        inner.gate.set()
        assert query.result(5).shape == (8,)
        batch.join(10)
    finally:
        wrapped.close()
    # Two texts of 408 characters to a job (a third would pass 1,024): 16 jobs, the query
    # right after the first, and the vectors in the order of the texts.
    firsts = [t for t in inner.order if t != "the query"]
    assert inner.order[1] == "the query"
    assert firsts == texts[::2]
    assert (done["v"] == FakeEmbedder(dims=8).embed_batch(texts)).all()


def test_one_long_text_is_one_job() -> None:
    inner = Recording()
    inner.gate.set()
    wrapped = QueuedEmbedder(inner)
    try:
        vectors = wrapped.embed_batch(["y" * 5000, "z" * 5000, "short"])
    finally:
        wrapped.close()
    assert vectors.shape == (3, 8)
    # A text over the limit is never cut, and nothing joins a job already over it.
    assert inner.order == ["y" * 5000, "z" * 5000, "short"]


class Stoppable(FakeEmbedder):
    """Document jobs that run until released, and stop when asked (as the model worker's do)."""

    def __init__(self) -> None:
        super().__init__(dims=8)
        self.asked = threading.Event()
        self.release = threading.Event()
        self.document_runs = 0
        self.running = threading.Semaphore(0)

    def preempt(self) -> None:
        self.asked.set()

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "document":
            self.document_runs += 1
            self.running.release()
            while not self.release.wait(0.001):
                if self.asked.is_set():
                    self.asked.clear()
                    raise Preempted()
        return super().embed_batch(texts, kind=kind)


def test_a_query_stops_a_document_job_once_at_most() -> None:
    """Queries arriving faster than a job takes must not starve it: stopped once, it runs to
    its end, and the queries after that wait for it."""
    inner = Stoppable()
    worker = EmbeddingQueue(inner)
    try:
        doc = worker.submit(["the document"], "document")
        assert inner.running.acquire(timeout=5)
        first = worker.submit(["first query"], "query")
        assert first.result(5).shape == (1, 8)  # went ahead of the stopped job
        assert inner.running.acquire(timeout=5)  # the job runs again
        second = worker.submit(["second query"], "query")
        time.sleep(0.1)
        assert not second.done() and not doc.done()  # not stopped twice
        inner.release.set()
        assert doc.result(5).shape == (1, 8) and second.result(5).shape == (1, 8)
    finally:
        inner.release.set()
        worker.stop()
    assert worker.preempted == 1 and inner.document_runs == 2


class CountingQueries(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__(dims=8)
        self.queries: list[str] = []

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "query":
            self.queries.extend(texts)
        return super().embed_batch(texts, kind=kind)


def test_a_repeated_query_is_embedded_once_and_the_kept_ones_are_bounded() -> None:
    inner = CountingQueries()
    wrapped = QueuedEmbedder(inner)
    try:
        first = wrapped.embed_query("where is the spare key")
        again = wrapped.embed_query("where is the spare key")
        assert inner.queries == ["where is the spare key"]
        assert np.array_equal(first, again) and not again.flags.writeable  # shared: read-only
        assert wrapped.start_query("where is the spare key").done()  # no wait, no queue
        wrapped.embed_query("who fed the cat")
        assert inner.queries == ["where is the spare key", "who fed the cat"]

        inner.fail = True  # a failure is not kept: the next ask embeds
        with pytest.raises(EmbedFailure):
            wrapped.embed_query("a question the model fails")
        inner.fail = False
        wrapped.embed_query("a question the model fails")
        assert inner.queries.count("a question the model fails") == 2

        for i in range(RECENT_QUERIES):  # the oldest falls out
            wrapped.embed_query(f"question {i}")
        asked = len(inner.queries)
        wrapped.embed_query(f"question {RECENT_QUERIES - 1}")
        assert len(inner.queries) == asked
        wrapped.embed_query("who fed the cat")
        assert len(inner.queries) == asked + 1
    finally:
        wrapped.close()
