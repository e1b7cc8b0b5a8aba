"""A first index, a rebuild and searches through a real daemon whose embedder is a remote API
(an OpenAI-shaped HTTP server on 127.0.0.1): full requests, line vectors by provider kind,
queries beside the documents."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memd_client
from memd.config import Config, EmbeddingConfig, IndexConfig

from .daemon_fixture import running_daemon, wait_for
from .provider_server import FakeProvider, Reply, Seen
from .test_remote_speed import DIMS, KEY, reply


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    srv = FakeProvider()
    srv.responder = reply
    try:
        yield srv
    finally:
        srv.close()


def daily_notes(root: Path, files: int = 40) -> None:
    (root / "memory").mkdir(parents=True)
    day = datetime.date(2026, 1, 5)
    for n in range(files):
        lines = [f"# {day + datetime.timedelta(days=n)}", ""]
        lines += [
            f"- item {i} of day {n}: the deploy of vega and the orion cluster" for i in range(15)
        ]
        (root / "memory" / f"{day + datetime.timedelta(days=n)}.md").write_text("\n".join(lines))


def openai_config(server: FakeProvider, **index: Any) -> Config:
    return Config.load(
        embedding=EmbeddingConfig(
            provider="openai", base_url=server.url + "/v1", model="m", dimensions=DIMS
        ),
        index=IndexConfig(**index),
    )


def indexed(c: memd_client.Client, name: str) -> dict[str, Any] | None:
    st = dict(c.status(workspace=name)["workspaces"][0])
    done = st["files_on_disk"] and st["files_indexed"] == st["files_on_disk"]
    return st if done and not st["files_pending"] and not st["rebuilding"] else None


def test_a_first_index_goes_in_a_few_full_requests_at_once(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.latency = 0.1
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    daily_notes(ws)
    with running_daemon(openai_config(server), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="notes")
            st = wait_for(lambda: indexed(c, "notes"), "the first index", timeout=60)
            assert st["vectors"] == st["chunks"] == 40
            hit = c.search("notes", "deploy of vega", mode="vector")
            assert hit["results"] and hit["freshness"]["fresh"]
    # 40 chunks and their 600 distinct lines (about 18,000 tokens), in requests of up to
    # 8,192 tokens (before: 121 requests of about 1 KB, one at a time), and the one query.
    assert server.counts.texts == 40 + 600 + 1
    assert server.counts.requests <= 5
    assert server.counts.connections <= 5


def test_line_vectors_can_be_switched_off(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    daily_notes(ws, files=3)
    with running_daemon(openai_config(server, line_vectors=False), choose_embedder=True) as d:
        with memd_client.connect(d.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="notes")
            st = wait_for(lambda: indexed(c, "notes"), "the first index", timeout=60)
            assert st["vectors"] == 3
    assert server.counts.texts == 3  # the chunks alone: none of their 45 lines


def test_line_vectors_are_part_of_the_index_identity(tmp_path: Path) -> None:
    from memd.embed.fake import FakeEmbedder
    from memd.index.index import Index
    from memd.index.sync import Syncer

    index = Index(tmp_path / "i.sqlite")
    index.open()
    try:
        on = Syncer(index, tmp_path, config=IndexConfig(), embedder=FakeEmbedder())
        off = Syncer(
            index, tmp_path, config=IndexConfig(line_vectors=False), embedder=FakeEmbedder()
        )
        assert on.line_vectors and not off.line_vectors
        # Switching them off (or on) rebuilds the index: its rows would be wrong otherwise.
        assert off.expected_identity().mismatch(on.expected_identity()) == "lines"
    finally:
        index.close()


def test_a_search_while_documents_are_embedded_is_answered_beside_them(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, arrived = threading.Event(), threading.Event()
    release.set()

    def held(seen: Seen) -> Reply:
        if any(t.startswith("# later") for t in seen.body["input"]):  # the new notes' chunks
            arrived.set()
            release.wait(20)
        return reply(seen)

    server.responder = held
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    daily_notes(ws, files=5)
    config = Config.load(
        embedding=EmbeddingConfig(
            provider="openai",
            base_url=server.url + "/v1",
            model="m",
            dimensions=DIMS,
            timeout_seconds=5,  # a search gives up on its query's vector after this long
        )
    )
    try:
        with running_daemon(config, choose_embedder=True) as daemon:
            with memd_client.connect(daemon.socket_path, timeout=60) as c:
                c.workspace_add(ws, name="notes")
                wait_for(lambda: indexed(c, "notes"), "the first index", timeout=60)
                release.clear()
                for n in range(3):
                    (ws / "memory" / f"later-{n}.md").write_text(
                        f"# later {n}\n\n" + "the orion cluster moved to lisbon\n" * 30
                    )
                wait_for(arrived.is_set, "the new notes' documents in flight")
                found = c.search("notes", "orion cluster", mode="hybrid")
                assert found["results"] and found["mode"] == "hybrid" and not found["note"]
                release.set()
                wait_for(lambda: indexed(c, "notes"), "the new notes' vectors", timeout=60)
    finally:
        release.set()


def test_a_writer_step_stores_a_few_files_and_leaves_the_rest_in_the_cache(
    server: FakeProvider, tmp_path: Path, config: Config
) -> None:
    """A wave brings the texts of many files at once; storing them all in one step made an
    append wait for a hundred transactions. A step stores WAVE_STORES files, the next steps
    the rest, from the cache, without asking the provider again."""
    from memd.embed.providers import create_remote
    from memd.index.backlog import WAVE_STORES
    from memd.index.cache import EmbeddingCache
    from memd.index.index import Index
    from memd.index.sync import Syncer
    from memd.writer.embedding import EMBED_STEP_CHARS

    ws = tmp_path / "many"
    daily_notes(ws, files=60)
    remote = create_remote(
        "openai",
        EmbeddingConfig(base_url=server.url + "/v1", model="m", dimensions=DIMS),
        {"OPENAI_API_KEY": KEY},
    )
    index = Index(tmp_path / "many.sqlite")
    index.open()
    cache = EmbeddingCache(tmp_path / "cache.sqlite")
    try:
        syncer = Syncer(index, ws, config=config.index, embedder=remote, cache=cache)
        syncer.sync(embed=False)
        with index.reader() as store:
            assert store.pending_count() == 60
        left = 60
        for step in range(4):
            syncer.embed_pending(max_files=None, max_chars=EMBED_STEP_CHARS)
            with index.reader() as store:
                now = store.pending_count()
            assert left - now == min(left, WAVE_STORES), step
            left = now
            if step == 0:
                asked = server.counts.requests
                assert 1 <= asked <= 4  # one wave: the texts of every file
        assert left == 0 and server.counts.requests == asked  # the rest came from the cache
    finally:
        cache.close()
        index.close()
        remote.close()


def test_an_append_does_not_wait_for_a_wave_in_flight(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer sends its wave of requests from a thread of its own: an append made while
    the provider sits on the wave is written and indexed (by keyword) at once."""
    release, arrived = threading.Event(), threading.Event()

    def held(seen: Seen) -> Reply:
        if any(t.startswith("# ") for t in seen.body["input"]):  # the notes' chunks
            arrived.set()
            release.wait(30)
        return reply(seen)

    server.responder = held
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    daily_notes(ws, files=5)
    appended = threading.Event()
    try:
        with running_daemon(openai_config(server), choose_embedder=True) as daemon:
            with memd_client.connect(daemon.socket_path, timeout=60) as c:
                c.workspace_add(ws, name="notes")
                wait_for(arrived.is_set, "the first wave in flight")

                def append() -> None:
                    with memd_client.connect(daemon.socket_path, timeout=60) as other:
                        other.append("notes", "the deploy moved to friday")
                        appended.set()

                writer = threading.Thread(target=append)
                writer.start()
                # Before, the writer waited for the wave: the append only once it was back.
                assert appended.wait(15), "the append waited for the wave"
                found = c.search("notes", "deploy moved friday", mode="keyword")
                assert found["results"][0]["snippet"].startswith("the deploy moved to friday")
                release.set()
                writer.join(30)
                wait_for(lambda: indexed(c, "notes"), "every file's vectors", timeout=60)
    finally:
        release.set()
