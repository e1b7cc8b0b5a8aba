"""OpenAI's Batch API against a local server that implements its documented endpoints: submit,
poll, collect, and after a restart the same batch, never a second one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memd_client
from memd.config import Config, EmbeddingConfig
from memd.embed.base import Vectors
from memd.embed.batch import Batches
from memd.embed.providers import OpenAIEmbedder, create_remote

from .daemon_fixture import running_daemon, wait_for
from .provider_server import FakeProvider
from .test_remote_speed import DIMS, KEY, reply


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    srv = FakeProvider()
    srv.responder = reply
    try:
        yield srv
    finally:
        srv.close()


def openai(server: FakeProvider) -> OpenAIEmbedder:
    cfg = EmbeddingConfig(base_url=server.url + "/v1", model="m", dimensions=DIMS)
    e = create_remote("openai", cfg, {"OPENAI_API_KEY": KEY})
    assert isinstance(e, OpenAIEmbedder)
    return e


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Kept(dict[str, Vectors]):
    def __call__(self, vectors: Mapping[str, Vectors]) -> None:
        self.update(vectors)


def batches(e: OpenAIEmbedder, directory: Path, kept: Kept) -> Batches:
    return Batches(e, directory, kept, min_tokens=10, poll_seconds=60)


def test_submit_poll_resume_collect(server: FakeProvider, tmp_path: Path) -> None:
    e = openai(server)
    texts = {h(t): t for t in (f"note {i}: the orion cluster" for i in range(30))}
    kept = Kept()
    server.batches.hold.set()
    first = batches(e, tmp_path / "batches", kept)
    [job] = first.submit(texts)
    upload = next(r for r in server.requests if r.path == "/v1/files")
    assert upload.body["purpose"] == "batch"
    lines = [json.loads(x) for x in upload.body["file"][1].splitlines()]
    assert {x["url"] for x in lines} == {"/v1/embeddings"} and lines[0]["custom_id"] == "memd-0"
    assert lines[0]["body"]["model"] == "m" and lines[0]["body"]["dimensions"] == DIMS
    assert first.pending() == set(texts)
    assert first.poll(force=True) == 0  # validating -> in progress
    assert first.status()["jobs"][0]["status"] == "in_progress"
    # memd restarts: the batch is known again from its file, and no second one is made.
    again = batches(openai(server), tmp_path / "batches", kept)
    assert again.pending() == set(texts) and again.status()["jobs"][0]["id"] == job.id
    server.batches.hold.clear()
    assert again.poll() == 30
    assert set(kept) == set(texts) and not again.waiting()
    assert not list((tmp_path / "batches").glob("batch-*.json"))
    want = np.asarray(reply_vector(texts[next(iter(texts))]))
    got = kept[next(iter(texts))]
    np.testing.assert_allclose(got, want / np.linalg.norm(want), rtol=1e-6)
    assert len(server.batches.batches) == 1 and server.counts.requests == 0
    usage = e.usage.snapshot()["openai batch"]["total"]
    assert usage["texts"] == 30 and usage["tokens"] > 0


def reply_vector(text: str) -> list[float]:
    from .test_remote_speed import vector

    return vector(text)


@pytest.mark.parametrize("ending", ["failed", "expired", "cancelled"])
def test_a_batch_that_does_not_complete_is_forgotten(
    server: FakeProvider, tmp_path: Path, ending: str
) -> None:
    e = openai(server)
    kept = Kept()
    b = batches(e, tmp_path / "b", kept)
    texts = {h(t): t for t in ("one text", "another text")}
    b.submit(texts)
    server.batches.fail_with = ending
    b.poll(force=True)
    b.poll(force=True)
    assert not b.waiting() and b.pending() == set() and kept == {}
    assert b.status()["last"]["status"] == ending


def test_unusable_answers_are_not_kept(server: FakeProvider, tmp_path: Path) -> None:
    server.responder = lambda s: (
        200,
        {},
        {"data": [{"index": i, "embedding": [0.0] * DIMS} for i in range(len(s.body["input"]))]},
    )
    kept = Kept()
    b = batches(openai(server), tmp_path / "b", kept)
    b.submit({h("x"): "x"})
    b.poll(force=True)
    b.poll(force=True)
    assert kept == {} and not b.waiting()  # all-zero vectors: embedded live instead


# -- through the daemon, with a restart mid-batch --------------------------------------------------


def notes(root: Path, files: int = 6) -> None:
    (root / "memory").mkdir(parents=True)
    for n in range(files):
        body = "\n".join(f"- day {n} item {i}: the orion cluster moved to lisbon" for i in range(8))
        (root / "memory" / f"2026-02-{n + 1:02d}.md").write_text(f"# Day {n}\n\n{body}\n")


def batch_config(server: FakeProvider) -> Config:
    return Config.load(
        embedding=EmbeddingConfig(
            provider="openai",
            base_url=server.url + "/v1",
            model="m",
            dimensions=DIMS,
            batch_min_tokens=100,
            batch_poll_seconds=1,
        )
    )


def ws_status(c: memd_client.Client) -> dict[str, Any]:
    return dict(c.status(workspace="notes"))


def test_a_first_index_through_the_batch_api_survives_a_restart(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    notes(ws)
    server.batches.hold.set()
    config = batch_config(server)
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="notes")

            def in_progress() -> dict[str, Any] | None:
                st = ws_status(c)
                jobs = st["embedding"]["batches"]["jobs"]
                return st if jobs and jobs[0]["status"] == "in_progress" else None

            st = wait_for(in_progress, "the batch in progress")
            [job] = st["embedding"]["batches"]["jobs"]
            assert st["workspaces"][0]["files_pending"] == 6  # not reported clean meanwhile
            found = c.search("notes", "orion cluster lisbon", mode="keyword")
            assert found["results"]  # keyword search meanwhile
    assert server.counts.requests == 0  # nothing was sent live
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            again = ws_status(c)["embedding"]["batches"]["jobs"]
            assert [j["id"] for j in again] == [job["id"]]
            server.batches.hold.clear()

            def done() -> dict[str, Any] | None:
                st = ws_status(c)
                w = st["workspaces"][0]
                return st if w["files_pending"] == 0 and w["vectors"] == w["chunks"] else None

            st = wait_for(done, "the batch's vectors stored")
            assert st["embedding"]["batches"]["jobs"] == []
            assert st["embedding"]["batches"]["last"]["status"] == "completed"
            sent = st["embedding"]["usage"]["openai batch"]["total"]
            assert sent["texts"] == job["texts"] == 6 + 48  # a chunk and 8 lines a note
            hit = c.search("notes", "orion cluster", mode="vector")
            assert hit["results"] and hit["freshness"]["fresh"]
    assert len(server.batches.batches) == 1  # one batch, paid once
    assert server.counts.requests == 1  # and the one query, live


def test_a_small_first_index_goes_live(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    notes(ws, files=1)
    config = Config.load(
        embedding=EmbeddingConfig(
            provider="openai", base_url=server.url + "/v1", model="m", dimensions=DIMS
        )
    )
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="notes")
            wait_for(
                lambda: (
                    ws_status(c)["workspaces"][0]["files_pending"] == 0
                    and ws_status(c)["workspaces"][0]["vectors"]
                ),
                "the vectors",
            )
    assert server.batches.batches == {} and server.counts.requests >= 1
