"""Reader processes (memd/readers): real processes over a real index file, the same search code
as the daemon's, and the same answers, through writes, trims of the vector log, rebuilds and a
reader killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import memd.readers as readers_module
from memd.config import Config
from memd.embed.base import Kind, Vectors
from memd.embed.fake import FakeEmbedder
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.readers import ReaderPool
from memd.search import search
from memd.search.options import SearchOptions
from memd.service import MemoryService
from memd_client.errors import ProviderUnavailable
from tests.conftest import WriteFile
from tests.daemon_fixture import running_daemon, wait_for

QUERIES = [
    "deploy the staging cluster",
    "Caroline adoption agency",
    "what did we decide about the database",
    "kubernetes",
]


def _notes(write: WriteFile) -> None:
    write("MEMORY.md", "# Decisions\nWe decided the database stays on Postgres 16.\n")
    write("memory/2026-11-02.md", "Deployed the staging cluster with kubernetes on Monday.\n")
    write("memory/2026-11-03.md", "Caroline called the adoption agency about the papers.\n")
    for i in range(30):
        write(f"memory/topic-{i}.md", f"Topic {i}: notes on garden {i}, bikes and the lake.\n")


@pytest.fixture
def pool() -> Iterator[ReaderPool]:
    p = ReaderPool(2)
    yield p
    p.close()


@pytest.fixture
def warm(
    pool: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> ReaderPool:
    """The notes indexed and the pool's readers started on them, as overlapping searches do."""
    _notes(write)
    syncer.sync()
    _overlap(pool, index, fake)
    return pool


def _answers(outcome: object) -> list[dict[str, object]]:
    return [h.to_dict() for h in outcome.results]  # type: ignore[attr-defined]


def _overlap(pool: ReaderPool, index: Index, embedder: FakeEmbedder, until: int = 2) -> None:
    """Search from four threads at once until ``until`` searches were answered by readers: the
    way readers start in the daemon."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            pool.search(index, "staging cluster", SearchOptions(), embedder)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: pool.searches >= until, "searches answered by reader processes", 60)
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_one_search_at_a_time_runs_in_the_daemon_and_starts_no_process(
    pool: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    _notes(write)
    syncer.sync()
    for q in QUERIES:
        pool.search(index, q, SearchOptions(), fake)
    health = pool.health()
    assert health["running"] == 0 and health["searches"] == 0
    assert health["in_daemon"] == len(QUERIES)


def test_readers_answer_as_the_daemon_does(
    warm: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    pool = warm
    assert pool.health()["running"] >= 1
    for mode in ("hybrid", "keyword", "vector"):
        options = SearchOptions(mode=mode, min_score=0.0)  # type: ignore[arg-type]
        for q in QUERIES:
            before = pool.searches
            remote = pool.search(index, q, options, fake)
            assert pool.searches == before + 1, "a warm, idle reader takes the search"
            local = search(index, q, options, embedder=fake)
            assert remote.mode == local.mode == mode
            assert (remote.provider, remote.model, remote.note) == (
                local.provider,
                local.model,
                local.note,
            )
            assert _answers(remote) == _answers(local), (mode, q)
            assert remote.results, (mode, q)


@pytest.mark.parametrize("asks_above", [0, readers_module.ASK_POSTINGS_ABOVE])
def test_readers_rank_keywords_with_the_daemons_postings(
    warm: ReaderPool,
    index: Index,
    fake: FakeEmbedder,
    write: WriteFile,
    syncer: Syncer,
    monkeypatch: pytest.MonkeyPatch,
    asks_above: int,
) -> None:
    # The postings are built once, in the daemon: a reader's keyword search asks them for its
    # document frequencies and best ids, and answers as the daemon's own search does, also
    # for a chunk written after the postings were built. An index this small (the default
    # threshold) is ranked by FTS5 in the reader: the same answers, no round trip.
    assert index.keywords.ready and index.keywords.chunks < readers_module.ASK_POSTINGS_ABOVE
    monkeypatch.setattr(readers_module, "ASK_POSTINGS_ABOVE", asks_above)
    asks = asks_above == 0
    pool = warm
    write("memory/2026-11-05.md", "Quentin repainted the lighthouse stairs on Tuesday.\n")
    syncer.sync()
    options = SearchOptions(mode="keyword", min_score=0.0)
    for q in [*QUERIES, "Quentin lighthouse stairs"]:
        before, ranked = pool.searches, pool.ranked
        remote = pool.search(index, q, options, fake)
        assert pool.searches == before + 1
        assert pool.ranked == ranked + asks, q
        assert _answers(remote) == _answers(search(index, q, options, embedder=fake)), q
    assert remote.results[0].path == "memory/2026-11-05.md"
    assert pool.health()["ranked_by_daemon"] == pool.ranked


def test_a_reader_sees_each_write_at_once(
    warm: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    pool = warm
    write("memory/2026-11-04.md", "The zeppelin hangar lease was signed by Margarethe.\n")
    syncer.sync()  # committed before the search starts: it must see the file, words and vector
    for mode in ("keyword", "vector"):
        options = SearchOptions(mode=mode, min_score=0.0)  # type: ignore[arg-type]
        before = pool.searches
        hits = pool.search(index, "zeppelin hangar lease Margarethe", options, fake).results
        assert pool.searches == before + 1
        assert hits[0].path == "memory/2026-11-04.md", mode


def _log_rows(index: Index) -> list[int]:
    with index.reader() as store:
        return [int(r[0]) for r in store.conn.execute("SELECT seq FROM vector_log")]


def test_the_log_is_trimmed_no_further_than_a_reader_sketch(
    syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    _notes(write)
    syncer.sync()
    pool = ReaderPool(1)  # one reader: the one that searches below is the only one behind
    try:
        _trims_wait_for(pool, syncer, index, fake, write)
    finally:
        pool.close()


def _trims_wait_for(
    pool: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    _overlap(pool, index, fake)
    wait_for(lambda: pool.health()["busy"] == 0, "the reader idle")
    # A second sync: the daemon's own sketch applies its rows, the readers' have not yet.
    write("memory/2026-11-05.md", "Ordered a brass telescope for the observatory roof.\n")
    syncer.sync()
    kept = _log_rows(index)
    assert kept, "the rows a reader has not applied are kept"
    # The reader searches (applying them and reporting so), then the next sync trims them.
    hits = pool.search(index, "brass telescope", SearchOptions(mode="vector"), fake).results
    assert hits[0].path == "memory/2026-11-05.md"
    write("memory/2026-11-06.md", "Unrelated words about tea.\n")
    syncer.sync()
    assert not set(kept) & set(_log_rows(index)), "rows every sketch applied are trimmed"


def test_a_sketch_left_behind_by_a_trim_loads_again(
    warm: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    pool = warm
    wait_for(lambda: pool.health()["busy"] == 0, "readers idle")
    # The readers stop reporting (as one silent for REMOTE_SKETCH_TTL_S): the writer trims
    # the log past them.
    for reader in range(1, 100):
        index.forget_remote_sketch(reader)
    write("memory/2026-11-05.md", "Ordered a brass telescope for the observatory roof.\n")
    syncer.sync()
    write("memory/2026-11-06.md", "Unrelated words about tea.\n")
    syncer.sync()
    assert not _log_rows(index), "trimmed without the readers"
    for _ in range(2):  # both readers, whichever takes the search
        before = pool.searches
        hits = pool.search(index, "brass telescope", SearchOptions(mode="vector"), fake).results
        assert pool.searches == before + 1
        assert hits[0].path == "memory/2026-11-05.md"


def test_a_rebuilt_index_is_read_from_its_new_file(
    warm: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    pool = warm
    write("memory/2026-11-07.md", "The walrus choir rehearses on Thursdays.\n")
    epoch = index.epoch
    syncer.rebuild()
    assert index.epoch == epoch + 1
    # The readers have the old file open: the first search after the swap runs in the daemon
    # while one opens the new file; then they answer from it.
    _overlap(pool, index, fake, until=pool.searches + 2)
    before = pool.searches
    hits = pool.search(index, "walrus choir", SearchOptions(mode="hybrid"), fake).results
    assert pool.searches == before + 1
    assert hits[0].path == "memory/2026-11-07.md"


def test_a_killed_reader_is_replaced_and_its_search_answered(
    warm: ReaderPool,
    syncer: Syncer,
    index: Index,
    fake: FakeEmbedder,
    write: WriteFile,
    memd_log: pytest.LogCaptureFixture,
) -> None:
    pool = warm
    wait_for(lambda: pool.health()["busy"] == 0, "readers idle")
    for pid in pool.health()["pids"]:
        os.kill(pid, signal.SIGKILL)
    expected = _answers(search(index, "staging cluster", SearchOptions(), embedder=fake))
    # Whichever reader takes it is dead: the search is answered in the daemon all the same.
    assert _answers(pool.search(index, "staging cluster", SearchOptions(), fake)) == expected
    health = pool.health()
    assert health["deaths"] == 1 and health["last_exit"] == "SIGKILL"
    assert "reader process" in memd_log.text
    # New readers start when searches overlap again.
    _overlap(pool, index, fake, until=pool.searches + 2)
    assert pool.health()["error"] is None


def test_a_search_does_not_wait_for_readers_that_cannot_run(
    warm: ReaderPool, index: Index, fake: FakeEmbedder
) -> None:
    # Readers stopped with SIGSTOP (what a reader descheduled on contended cores looks like
    # for longer): two searches hold them, and a third waits at most READER_WAIT_S for one,
    # then runs in the daemon.
    pool = warm
    wait_for(lambda: pool.health()["busy"] == 0, "readers idle")
    pids = pool.health()["pids"]
    assert len(pids) == 2
    # On a loaded machine the warm-up's overlapping searches wait some readers out too.
    waited_before = pool.health()["waited_out"]
    expected = _answers(search(index, "Caroline adoption agency", SearchOptions(), embedder=fake))
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    held = [
        threading.Thread(target=pool.search, args=(index, q, SearchOptions(), fake))
        for q in QUERIES[:2]
    ]
    try:
        for t in held:
            t.start()
        wait_for(lambda: pool.health()["busy"] == 2, "both readers holding a search")
        answers: list[object] = []
        third = threading.Thread(
            target=lambda: answers.append(
                pool.search(index, "Caroline adoption agency", SearchOptions(), fake)
            )
        )
        started = time.monotonic()
        third.start()
        third.join(5.0)  # READER_WAIT_S and one search, with room for a slow machine
        took = time.monotonic() - started
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        for t in held:
            t.join()
    third.join()
    assert took < 5.0 and answers, "the search waited for readers that could not run"
    assert _answers(answers[0]) == expected
    assert pool.health()["waited_out"] == waited_before + 1
    assert pool.health()["deaths"] == 0  # the stopped readers answered once continued


class _Unavailable(FakeEmbedder):
    """A provider whose queries fail (an outage), after the documents were embedded."""

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "query" and self.fail:
            raise ProviderUnavailable("provider down for the test")
        return super().embed_batch(texts, kind=kind)


def test_a_provider_outage_in_a_reader_search_gives_keyword_results(
    config: Config, workspace: Path, write: WriteFile
) -> None:
    _notes(write)
    service = MemoryService(config, choice=_choice(_Unavailable()))
    try:
        service.readers = ReaderPool(2)
        ws = service.registry.add(str(workspace), name="ws")
        service.sync("ws")
        embedder = service.embedder
        assert embedder is not None
        _overlap(service.readers, ws.index, embedder.inner)  # type: ignore[attr-defined]
        embedder.inner.fail = True  # type: ignore[attr-defined]
        before = service.readers.searches
        outcome = service.search("ws", "staging cluster", mode="hybrid")
        # The keyword search that follows runs in a reader (the hybrid one failed while its
        # query was embedded, before it took one, or in one).
        assert service.readers.searches > before
        assert outcome.mode == "keyword"
        assert "provider down for the test" in (outcome.note or "")
        assert outcome.results[0].path == "memory/2026-11-02.md"
    finally:
        service.close()


def _choice(embedder: FakeEmbedder) -> object:
    from memd.embed.select import Choice

    return Choice(embedder, "fake", protect=False)


def test_the_daemon_serves_overlapping_sessions_from_readers(
    config: Config, workspace: Path, write: WriteFile
) -> None:
    import memd_client

    _notes(write)
    with running_daemon(config) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(workspace), name="ws")
            wait_for(
                lambda: (
                    (st := c.status("ws")["workspaces"][0])["files_indexed"] >= 33
                    and st["files_pending"] == 0
                ),
                "indexed, vectors too",
            )
            alone = c.search("ws", "staging cluster")["results"]
        failures: list[BaseException] = []
        stop = threading.Event()

        def session() -> None:
            try:
                with memd_client.connect(daemon.socket_path) as s:
                    while not stop.is_set():
                        assert s.search("ws", "staging cluster")["results"] == alone
            except BaseException as exc:  # reported below, in the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=session) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            with memd_client.connect(daemon.socket_path) as c:
                readers = wait_for(
                    lambda: (r := c.status()["daemon"]["readers"]) and r["searches"] >= 20 and r,
                    "searches answered by readers",
                    60,
                )
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures, failures
        assert readers["processes"] == config.search.reader_processes
        assert 1 <= readers["running"] <= readers["processes"]
        assert readers["deaths"] == 0 and readers["error"] is None


def test_reader_processes_zero_keeps_every_search_in_the_daemon(
    syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    _notes(write)
    syncer.sync()
    pool = ReaderPool(0)
    results: list[int] = []

    def run() -> None:
        for _ in range(5):
            results.append(len(pool.search(index, "staging", SearchOptions(), fake).results))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results) and len(results) == 20
    assert pool.health()["running"] == 0 and pool.health()["in_daemon"] == 20
    pool.close()


def test_idle_readers_stop_when_asked(
    warm: ReaderPool, syncer: Syncer, index: Index, fake: FakeEmbedder, write: WriteFile
) -> None:
    pool = warm
    wait_for(lambda: pool.health()["busy"] == 0, "readers idle")
    pids = pool.health()["pids"]
    assert pool.stop_idle() == len(pids) >= 1
    assert pool.health()["running"] == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_index_created_again_at_the_same_path_is_not_read_from_the_old_file(
    warm: ReaderPool,
    syncer: Syncer,
    index: Index,
    fake: FakeEmbedder,
    write: WriteFile,
    config: Config,
    workspace: Path,
    cache: EmbeddingCache,
) -> None:
    pool = warm
    # The workspace is removed and added again: its index file is deleted and made anew.
    index.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(index.path) + suffix).unlink(missing_ok=True)
    for path in workspace.rglob("*.md"):
        path.unlink()
    write("MEMORY.md", "Only the heron nests by the weir are left.\n")
    again = Index(index.path, use_vec=False)
    again.open()
    try:
        Syncer(again, workspace, config=config.index, embedder=fake, cache=cache).sync()
        _overlap(pool, again, fake, until=pool.searches + 2)
        for q in ("staging cluster", "heron nests weir"):
            remote = pool.search(again, q, SearchOptions(min_score=0.0), fake)
            assert [h.path for h in remote.results] == ["MEMORY.md"], q
    finally:
        again.close()


class _Slow(FakeEmbedder):
    """Queries that take a while to embed, as when the model is busy with documents."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "query":
            self.gate.wait(30)
        return super().embed_batch(texts, kind=kind)


def test_keyword_searches_do_not_queue_behind_a_vector_that_is_late(
    config: Config, workspace: Path, write: WriteFile
) -> None:
    _notes(write)
    slow = _Slow()
    service = MemoryService(config, choice=_choice(slow))
    try:
        service.readers = ReaderPool(2)
        ws = service.registry.add(str(workspace), name="ws")
        service.sync("ws")
        _overlap(service.readers, ws.index, slow)
        wait_for(lambda: service.readers.health()["busy"] == 0, "readers idle")
        slow.gate.clear()  # the model is busy from now: query vectors are late
        hybrid = [
            threading.Thread(target=service.search, args=("ws", "staging cluster"))
            for _ in range(4)
        ]
        for t in hybrid:
            t.start()
        try:
            # Four hybrid searches wait for their vectors, none holding a reader: keyword
            # searches are answered by the readers meanwhile.
            before = service.readers.searches
            for q in QUERIES:
                assert service.search("ws", q, mode="keyword").results
            assert service.readers.searches == before + len(QUERIES)
            assert all(t.is_alive() for t in hybrid), "answered while the vectors were late"
        finally:
            slow.gate.set()
            for t in hybrid:
                t.join()
    finally:
        service.close()
