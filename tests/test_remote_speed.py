"""Remote providers at their own speed: full requests, several in flight, kept connections,
queries beside documents, rate limits that hold one provider only; through real HTTP servers
on 127.0.0.1 and a real daemon."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from memd.config import EmbeddingConfig
from memd.embed.providers import create_remote
from memd.embed.queued import QueuedEmbedder

from .daemon_fixture import wait_for
from .provider_server import FakeProvider, Reply, Seen

KEY = "sk-test-" + "s" * 20
DIMS = 8


def vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [1.0 + b / 255 for b in digest[:DIMS]]


def reply(seen: Seen) -> Reply:
    texts = seen.body["input"]
    data = [
        {"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(texts)
    ]
    tokens = sum(len(t) // 4 + 1 for t in texts)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return 200, {}, {"object": "list", "data": data, "usage": usage}


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    srv = FakeProvider()
    srv.responder = reply
    try:
        yield srv
    finally:
        srv.close()


def make(name: str, server: FakeProvider, sleeps: list[float] | None = None, **config: Any) -> Any:
    cfg = EmbeddingConfig(base_url=server.url + "/v1", dimensions=DIMS, model="m", **config)
    env = {"OPENAI_API_KEY": KEY}
    record = sleeps.append if sleeps is not None else (lambda s: None)
    return create_remote(name, cfg, env, sleep=record)


def texts(n: int, size: int = 400) -> list[str]:
    return [f"doc {i} " + "word " * (size // 5) for i in range(n)]


# -- requests: as full as the provider takes, several at once ----------------------------------


def test_documents_go_several_at_a_time_and_no_more(server: FakeProvider) -> None:
    server.gather = 4  # requests wait for each other: as many in flight as are let
    e = make("openai", server)
    many = texts(160, 800)  # about 32,000 tokens: four requests of about 8,000
    out = e.embed_batch(many)
    assert out.shape == (160, DIMS)
    assert server.counts.requests == 4 and server.counts.peak == 4
    # Two callers at once (the writer, a rebuild) share the same four slots.
    server.reset_counts()
    more = [t + " again" for t in many]
    callers = [threading.Thread(target=e.embed_batch, args=(batch,)) for batch in (many, more)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert server.counts.requests == 8 and server.counts.peak == 4
    e.close()


@pytest.mark.parametrize("name", ["ollama", "openai-compatible"])
def test_a_server_of_your_own_gets_one_small_request_at_a_time(
    server: FakeProvider, name: str
) -> None:
    if name == "ollama":
        server.responder = lambda s: (200, {}, {"embeddings": [vector(t) for t in s.body["input"]]})
    server.latency = 0.05
    e = make(name, server)
    e.embed_batch(texts(12, 400))
    assert server.counts.peak == 1
    assert max(server.counts.per_request_texts) <= 3  # about 1 KB a request: a query waits little
    e.close()


def test_configured_concurrency_and_request_size_win(server: FakeProvider) -> None:
    server.gather = 3
    e = make("openai-compatible", server, concurrency=3, request_tokens=2000)
    e.embed_batch(texts(57, 400))  # 57 texts of about 102 tokens: 19 in 2,000 tokens
    assert server.counts.peak == 3
    assert server.counts.per_request_texts == [19, 19, 19]
    e.close()


def test_a_query_never_waits_behind_documents(server: FakeProvider) -> None:
    release = threading.Event()

    def slow_documents(seen: Seen) -> Reply:
        if any(t.startswith("doc") for t in seen.body["input"]):
            release.wait(20)
        return reply(seen)

    server.responder = slow_documents
    e = QueuedEmbedder(make("openai", server), query_timeout=10)
    documents = threading.Thread(target=e.embed_batch, args=(texts(160, 800),))
    documents.start()
    try:
        wait_for(lambda: server.counts.requests >= 2, "document requests in flight")
        vector = e.start_query("what is the staging cluster called").result(timeout=5)
        assert vector.shape == (DIMS,)
        assert documents.is_alive()  # the documents still wait
    finally:
        release.set()
        documents.join(30)
        e.close()


# -- rate limits: per provider -------------------------------------------------------------------


def test_a_rate_limit_holds_every_request_to_that_provider_and_no_other(
    server: FakeProvider,
) -> None:
    limited = threading.Event()

    def once_limited(seen: Seen) -> Reply:
        if not limited.is_set():
            limited.set()
            return 429, {"Retry-After": "30"}, {"error": {"message": "Rate limit reached"}}
        return reply(seen)

    server.responder = once_limited
    sleeps_a: list[float] = []
    e = make("openai", server, sleeps_a, request_tokens=100)
    e.embed_batch(texts(24, 400))  # 24 requests, 4 at a time
    held = [s for s in sleeps_a if s > 25]
    # The request that was refused waited, and so did the ones sent after it.
    assert len(held) >= 2, sleeps_a
    other = FakeProvider()
    other.responder = reply
    try:
        sleeps_b: list[float] = []
        b = make("openai", other, sleeps_b)
        b.embed_batch(texts(8))
        assert sleeps_b == []  # another provider: not held
        b.close()
    finally:
        other.close()
    e.close()


def test_rate_limit_headers_pace_the_next_requests(server: FakeProvider) -> None:
    def spent(seen: Seen) -> Reply:
        status, headers, body = reply(seen)
        return (
            status,
            {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-remaining-tokens": "5",
                "x-ratelimit-reset-tokens": "1m3s",
            },
            body,
        )

    server.responder = spent
    sleeps: list[float] = []
    e = make("openai", server, sleeps)
    e.embed_batch(["first"])
    assert sleeps == []
    e.embed_batch(["second, longer than five tokens of budget " * 3])
    # The tokens' reset (63 s, capped at 60) is the longer wait: one sleep, then it goes.
    assert sleeps == [pytest.approx(60.0, abs=0.1)]
    e.close()
