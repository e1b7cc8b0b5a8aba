"""A search sends its query to an idle model worker itself and reads the reply when it wants
the vector (ProcessEmbedder.send_query); every other request reads that reply before its own.

Real llama.cpp in its real worker process; crashes and hangs come from the worker's test-only
fault hook (MEMD_TEST_WORKER_FAULT), as in test_model_worker.py.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from memd.embed.host import FAULT_ENV
from memd.embed.load_modes import ModeMemory
from memd.embed.process import ProcessEmbedder
from memd.embed.queued import QueuedEmbedder
from memd.embed.sent import SentQuery
from memd_client.errors import ProviderUnavailable

MODEL = os.environ.get("MEMD_TEST_MODEL", "")
pytestmark = pytest.mark.skipif(
    not MODEL or not Path(MODEL).is_file(), reason="set MEMD_TEST_MODEL to a GGUF embedding model"
)

QUESTIONS = [
    "where did Caroline go camping last summer",
    "what instrument does Melanie play",
    "when is the orion cluster visible",
    "who painted the sunrise over the lake",
]


def proven(tmp_path: Path, **kwargs: object) -> ProcessEmbedder:
    """A worker that has embedded once (on a CPU whose default mode crashes, in its safe mode):
    the state in which it takes queries sent ahead."""
    e = ProcessEmbedder(MODEL, threads=2, memory=ModeMemory(tmp_path / "modes.json"), **kwargs)  # type: ignore[arg-type]
    e.embed_batch(["warm up"])
    return e


def test_a_query_sent_ahead_gives_the_vector_of_an_ordinary_request(tmp_path: Path) -> None:
    e = proven(tmp_path)
    try:
        expected = e.embed_batch(QUESTIONS, kind="query")
        for question, want in zip(QUESTIONS, expected, strict=True):
            sent = e.send_query(question)
            assert sent is not None
            np.testing.assert_allclose(sent.result(), want, atol=1e-5)
    finally:
        e.close()


def test_an_idle_worker_takes_a_search_query_without_the_queue_thread(tmp_path: Path) -> None:
    """The search's own thread sends the request: the embedding queue's thread, which a search
    would have to wake and which would have to win the GIL from it, is never started."""
    inner = proven(tmp_path)
    wrapped = QueuedEmbedder(inner)
    try:
        vector = wrapped.start_query(QUESTIONS[0]).result()
        assert vector.shape == (inner.dims,)
        assert not wrapped.worker._started, "the query went through the queue's thread"
        again = wrapped.start_query(QUESTIONS[0])  # kept: the same text costs nothing
        assert again.done() and np.array_equal(again.result(), vector)
    finally:
        wrapped.close()


def test_every_request_reads_the_reply_of_a_query_sent_before_it(tmp_path: Path) -> None:
    """A document job, a token count and a second query sent after a query whose reply nobody
    read yet each get their own answer, and the first query gets its vector."""
    e = proven(tmp_path)
    try:
        expected = e.embed_batch(QUESTIONS[:2], kind="query")
        documents = ["the lake at dawn", "a camping trip in July"]
        want_documents = e.embed_batch(documents)

        sent = e.send_query(QUESTIONS[0])
        assert sent is not None
        np.testing.assert_allclose(e.embed_batch(documents), want_documents, atol=1e-5)
        assert sent.done(), "the document job read the reply ahead of its own"
        np.testing.assert_allclose(sent.result(), expected[0], atol=1e-5)

        sent = e.send_query(QUESTIONS[1])
        assert sent is not None
        assert e.count_tokens("three words here") > 0
        np.testing.assert_allclose(sent.result(), expected[1], atol=1e-5)

        first = e.send_query(QUESTIONS[0])
        assert first is not None
        assert e.send_query(QUESTIONS[1]) is None, "one query in the pipe at a time"
        np.testing.assert_allclose(first.result(), expected[0], atol=1e-5)
    finally:
        e.close()


def test_a_search_that_finds_the_pipe_taken_for_a_moment_still_gets_its_vector(
    tmp_path: Path,
) -> None:
    """The lock is held briefly by a query being sent, which reads no reply: the search that
    wants its vector takes the pipe once it is free, rather than wait for a read that nobody
    is going to do."""
    e = proven(tmp_path)
    try:
        want = e.embed_batch([QUESTIONS[0]], kind="query")[0]
        sent = e.send_query(QUESTIONS[0])
        assert sent is not None
        e._lock.acquire()
        threading.Timer(0.05, e._lock.release).start()
        np.testing.assert_allclose(sent.result(5), want, atol=1e-5)
    finally:
        e.close()


def test_a_worker_busy_with_documents_leaves_the_query_to_the_queue(tmp_path: Path) -> None:
    inner = proven(tmp_path)
    long_text = " ".join(f"word{i} about the orion cluster" for i in range(50))
    try:
        running = threading.Thread(target=inner.embed_batch, args=([long_text] * 8,))
        running.start()
        deadline = time.monotonic() + 30
        while not inner._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert inner.send_query(QUESTIONS[0]) is None
        running.join(120)
    finally:
        inner.close()


def test_a_worker_that_dies_on_a_query_sent_ahead_says_so_and_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "segv:embed2")  # each worker dies on its second embedding
    e = proven(tmp_path)  # embed1
    try:
        pid = e.health()["pid"]
        sent = e.send_query(QUESTIONS[0])  # embed2: dies
        assert sent is not None
        with pytest.raises(ProviderUnavailable, match=r"died \(SIGSEGV\)"):
            sent.result()
        assert e.health()["state"] == "restarting" and e.health()["last_exit"] == "SIGSEGV"
        assert e.send_query(QUESTIONS[0]) is None, "no worker: the queue starts one"
        time.sleep(1.1)
        assert e.embed_batch(["after the backoff"]).shape == (1, 384)  # a new worker's embed1
        assert e.health()["pid"] not in (None, pid)
        sent = e.send_query(QUESTIONS[1])  # embed2: dies; the next request finds out first
        assert sent is not None
        with pytest.raises(ProviderUnavailable, match="restarting in"):
            e.embed_batch(["a document after it"])
        with pytest.raises(ProviderUnavailable, match=r"died \(SIGSEGV\)"):
            sent.result()
    finally:
        e.close()


def test_a_worker_that_hangs_on_a_query_sent_ahead_is_killed_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang:embed2")
    e = proven(tmp_path, timeout=1.0, per_text=0.0)
    try:
        pid = e.health()["pid"]
        sent = e.send_query(QUESTIONS[0])
        assert sent is not None
        with pytest.raises(ProviderUnavailable, match="no answer within"):
            sent.result()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
    finally:
        e.close()


def test_closing_with_a_query_in_the_pipe_fails_it(tmp_path: Path) -> None:
    e = proven(tmp_path)
    sent = e.send_query(QUESTIONS[0])
    assert sent is not None
    e.close()
    with pytest.raises(ProviderUnavailable, match="stopped"):
        sent.result(5)


def test_searches_and_documents_from_many_threads_each_get_their_own_vectors(
    tmp_path: Path,
) -> None:
    """Invariant: however queries sent ahead, queued queries, preempted document jobs and the
    reads of others' replies interleave, every caller gets the vectors of its own texts, and
    nothing waits for good."""
    inner = proven(tmp_path)
    wrapped = QueuedEmbedder(inner)
    rng = random.Random(7)
    words = "lake violin harbor comet bakery tundra marathon orchid glacier lantern".split()
    questions = [f"{q} near the {w}" for w in words[:6] for q in QUESTIONS]
    documents = [f"{a} and {b} on day {n}" for n, (a, b) in enumerate(zip(words, words[3:]))]
    documents *= 3
    try:
        want_q = dict(zip(questions, inner.embed_batch(questions, kind="query"), strict=True))
        want_d = inner.embed_batch(documents)
        got_q: dict[str, np.ndarray] = {}
        got_d: list[np.ndarray] = []
        failures: list[BaseException] = []

        def search(share: list[str]) -> None:
            try:
                for q in share:
                    time.sleep(rng.random() * 0.01)
                    got_q[q] = wrapped.start_query(q).result()
            except BaseException as exc:
                failures.append(exc)

        def index() -> None:
            try:
                for start in range(0, len(documents), 3):
                    got_d.append(wrapped.embed_batch(documents[start : start + 3]))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=index)]
        threads += [threading.Thread(target=search, args=(questions[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a caller waits for good"
        assert not failures, failures
        # (A batch's size changes llama.cpp's floats a little: compared by cosine, and each
        # vector must be nearest to its own text's.)
        ours = np.stack([got_q[q] for q in questions])
        theirs = np.stack([want_q[q] for q in questions])
        assert_own(ours, theirs, questions)
        assert_own(np.concatenate(got_d), want_d, documents)
    finally:
        wrapped.close()


def assert_own(got: np.ndarray, want: np.ndarray, texts: list[str]) -> None:
    cosines = got @ want.T
    assert np.all(np.diag(cosines) > 0.999), np.diag(cosines).min()
    for row, text in enumerate(texts):
        nearest = texts[int(cosines[row].argmax())]
        assert nearest == text, f"{text!r} got the vector of {nearest!r}"


def test_status_counts_the_queries_by_the_threads_they_had(tmp_path: Path) -> None:
    """Whether queries had every core is the first question about a slow hybrid search: the
    worker says which it gave each query, and status counts them; documents are not counted."""
    memory = ModeMemory(tmp_path / "modes.json")
    e = ProcessEmbedder(MODEL, threads=1, query_threads=2, memory=memory)
    try:
        assert e.health()["query_threads"] == {} and e.health()["query_ms"] == {}
        e.embed_batch(["a note", "another note"])
        assert e.health()["query_threads"] == {} and e.health()["query_ms"] == {}
        e.embed_batch([QUESTIONS[0]], kind="query")
        sent = e.send_query(QUESTIONS[1])
        assert sent is not None
        sent.result()
        with e.searching(), e.searching():  # crowded: the documents' share
            e.embed_batch([QUESTIONS[2]], kind="query")
        used = e.health()["query_threads"]
        assert sum(used.values()) == 3 and set(used) <= {"1", "2"}
        # the crowded one had one (the others two, or one on a machine busy now)
        assert used.get("1", 0) >= 1
        # and what they took in llama.cpp, by the same thread counts
        took = e.health()["query_ms"]
        assert {k: v["queries"] for k, v in took.items()} == used
        assert all(0 < v["p50"] <= v["p90"] < 10_000 for v in took.values())
        assert all(0 <= v["outside_p50"] < 10_000 for v in took.values())
    finally:
        e.close()


def test_status_tells_a_query_left_waiting_from_its_time_in_the_model(tmp_path: Path) -> None:
    """The time outside llama.cpp is the search's to explain: a reply left unread for 300 ms
    counts there, not in the model's time."""
    e = ProcessEmbedder(MODEL, threads=1, memory=ModeMemory(tmp_path / "modes.json"))
    try:
        e.embed_batch([QUESTIONS[0]], kind="query")  # a started worker: no load in the times
        for question in QUESTIONS[1:4]:
            sent = e.send_query(question)
            assert sent is not None
            time.sleep(0.3)
            sent.result()
        (took,) = e.health()["query_ms"].values()
        assert took["queries"] == 4
        assert took["outside_p50"] >= 250, took
        assert took["p50"] < 250, "the wait counted as the model's"
    finally:
        e.close()


def test_a_search_hears_whether_the_last_query_had_every_core(tmp_path: Path) -> None:
    """A search leaves the cores to a query that has them all (memd/search); it learns that
    from what the worker gave the last query, and never expects every core among others."""
    e = ProcessEmbedder(MODEL, threads=1, query_threads=2, memory=ModeMemory(tmp_path / "m.json"))
    try:
        assert not e.query_takes_every_core(), "nothing is known before the first query"
        with e.searching(), e.searching():
            e.embed_batch([QUESTIONS[0]], kind="query")
        assert not e.query_takes_every_core(), "the last query had the documents' share"
        for question in QUESTIONS[1:]:
            before = e.health()["query_threads"].get("2", 0)
            e.embed_batch([question], kind="query")
            had_every_core = e.health()["query_threads"].get("2", 0) > before
            assert e.query_takes_every_core() == had_every_core
            with e.searching(), e.searching():
                assert not e.query_takes_every_core()
    finally:
        e.close()
    one = ProcessEmbedder(MODEL, threads=1, memory=ModeMemory(tmp_path / "one.json"))
    try:
        one.embed_batch([QUESTIONS[0]], kind="query")
        assert not one.query_takes_every_core(), "threads set by hand: a query has the same"
    finally:
        one.close()


def test_a_query_among_other_searches_takes_the_documents_share_of_the_cores(
    tmp_path: Path,
) -> None:
    """Alone, a query takes every core; while another search runs, the documents' share (the
    searches need the rest), and its vector is the same."""
    e = proven(tmp_path)
    try:
        want = e.embed_batch([QUESTIONS[0]], kind="query")[0]
        assert "crowded" not in e._embed_request([QUESTIONS[0]], "query")
        with e.searching():
            assert "crowded" not in e._embed_request([QUESTIONS[0]], "query")
            with e.searching():
                assert e._embed_request([QUESTIONS[0]], "query")["crowded"] is True
                assert "crowded" not in e._embed_request(["a note"], "document")
                sent = e.send_query(QUESTIONS[0])
                assert sent is not None
                np.testing.assert_allclose(sent.result(), want, atol=1e-4)
        assert "crowded" not in e._embed_request([QUESTIONS[0]], "query")
    finally:
        e.close()


def test_a_query_takes_every_core_only_while_no_other_task_wants_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's threads spin while they wait for each other, so a two-thread query on cores
    that busy processes share stalls (hundreds of ms): the worker counts runnable tasks first."""
    import subprocess
    import sys

    from memd.embed import host
    from memd.embed.llama import LlamaEmbedder

    from .gguf_fixture import bert_header

    engine = LlamaEmbedder(bert_header(tmp_path / "tiny.gguf", 16, 128), threads=1, query_threads=2)
    cores = host._QueryCores()
    assert cores.threads(engine, crowded=True) == 1
    spin = [sys.executable, "-c", "while True: pass"]
    busy = [subprocess.Popen(spin) for _ in range(4)]
    try:
        deadline = time.monotonic() + 10
        while host._runnable() < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host._runnable() >= 4, "four spinning processes are runnable"
        assert cores.threads(engine, crowded=False) == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # An idle machine cannot be had on demand during a test run: the count is given here.
    monkeypatch.setattr(host, "_runnable", lambda: 3.0)  # worker, search, one more
    assert cores.threads(engine, crowded=False) == 2
    monkeypatch.setattr(host, "_runnable", lambda: 4.0)
    assert cores.threads(engine, crowded=False) == 1


def test_an_all_core_query_that_stalls_sends_the_next_ones_to_one_thread_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memd.embed import host
    from memd.embed.llama import LlamaEmbedder

    from .gguf_fixture import bert_header

    monkeypatch.setattr(host, "_runnable", lambda: 2.0)
    engine = LlamaEmbedder(bert_header(tmp_path / "tiny.gguf", 16, 128), threads=1, query_threads=2)
    cores = host._QueryCores()
    cores.took(engine, 2, chars=100, seconds=0.004)
    cores.took(engine, 2, chars=100, seconds=0.010)  # slower, not a stall
    cores.took(engine, 2, chars=100, seconds=0.028)  # a wake-up, a page fault: not a stall
    cores.took(engine, 2, chars=12, seconds=0.012)  # short, yet no faster: not a stall
    cores.took(engine, 2, chars=400, seconds=0.050)  # four times longer: in proportion
    cores.took(engine, 1, chars=100, seconds=0.500)  # one thread: not the all-core rule's
    assert cores.threads(engine, crowded=False) == 2
    cores.took(engine, 2, chars=100, seconds=0.400)  # spinning threads stalled
    assert cores.threads(engine, crowded=False) == 1
    assert cores.until > time.monotonic() + host._QueryCores.BACK_OFF_S - 5
    cores.until = time.monotonic() - 0.001  # the back-off is over
    assert cores.threads(engine, crowded=False) == 2
    cores.took(engine, 2, chars=100, seconds=0.300)  # again: twice as long a back-off
    assert cores.until > time.monotonic() + 2 * host._QueryCores.BACK_OFF_S - 5
    cores.until = time.monotonic() - 0.001
    cores.took(engine, 2, chars=100, seconds=0.005)  # fine again: the back-off starts over
    assert cores.back_off == host._QueryCores.BACK_OFF_S


LANE_TEXTS = ["the lake at dawn", "a violin in the harbor", "camping in July", *QUESTIONS]
LANE_REFERENCE: dict[str, np.ndarray] = {}
LANE_DOCUMENTS: dict[str, np.ndarray] = {}


class QueryLane(RuleBasedStateMachine):
    """Generated sequences of queries sent ahead, their collection (now, later, never), queued
    queries, document jobs and token counts on one real worker. Invariants: each answer is the
    vector of its own text, at most one reply waits in the pipe, and nothing waits for good."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="memd-lane-"))
        self.inner = proven(self.dir)
        self.wrapped = QueuedEmbedder(self.inner)
        self.pending: list[tuple[str, Future[np.ndarray]]] = []

    @rule(n=st.integers(0, len(LANE_TEXTS) - 1))
    def send(self, n: int) -> None:
        sent = self.inner.send_query(LANE_TEXTS[n])
        if sent is not None:
            self.pending.append((LANE_TEXTS[n], sent))

    @rule(n=st.integers(0, len(LANE_TEXTS) - 1))
    def search(self, n: int) -> None:  # as a search does: the queue's path if the worker is busy
        self.pending.append((LANE_TEXTS[n], self.wrapped.start_query(LANE_TEXTS[n])))

    @rule(data=st.data())
    def collect(self, data: st.DataObject) -> None:
        if self.pending:
            text, future = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
            assert_own(future.result(30)[None, :], LANE_REFERENCE[text][None, :], [text])

    @rule(n=st.integers(0, len(LANE_TEXTS) - 1))
    def documents(self, n: int) -> None:
        got = self.wrapped.embed_batch(LANE_TEXTS[n:] + LANE_TEXTS[:n])
        texts = LANE_TEXTS[n:] + LANE_TEXTS[:n]
        assert_own(got, np.stack([LANE_DOCUMENTS[t] for t in texts]), texts)

    @rule()
    def tokens(self) -> None:
        assert self.inner.count_tokens("three words here") > 0

    @invariant()
    def one_reply_in_the_pipe_at_most(self) -> None:
        waiting = [f for _, f in self.pending if isinstance(f, SentQuery) and not f.done()]
        assert len(waiting) <= 1

    def teardown(self) -> None:
        try:
            for text, future in self.pending:
                assert_own(future.result(30)[None, :], LANE_REFERENCE[text][None, :], [text])
        finally:
            self.wrapped.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def lane_reference(tmp_path_factory: pytest.TempPathFactory) -> None:
    e = proven(tmp_path_factory.mktemp("lane"))
    try:
        queries = np.stack([e.embed_batch([t], kind="query")[0] for t in LANE_TEXTS])
        documents = e.embed_batch(LANE_TEXTS)
    finally:
        e.close()
    LANE_REFERENCE.update(zip(LANE_TEXTS, queries, strict=True))
    LANE_DOCUMENTS.update(zip(LANE_TEXTS, documents, strict=True))


@pytest.mark.usefixtures("lane_reference")
def test_query_lane_sequences() -> None:
    run_state_machine_as_test(
        QueryLane,
        settings=settings(
            max_examples=8,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
