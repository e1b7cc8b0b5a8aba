"""Remote embedding providers against real HTTP servers on 127.0.0.1 that speak each API's shapes."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memd.config import EmbeddingConfig
from memd.embed.base import Embedder, normalize
from memd.embed.http import parse_retry_after
from memd.embed.providers import MissingKey, create_remote
from memd.embed.secrets import Secret, load_api_key, redact
from memd_client.errors import ConfigError, ProviderUnavailable

from .provider_server import HANG, FakeProvider, Reply, Seen

KEY = "sk-test-" + "k" * 20


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    srv = FakeProvider()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def sleeps() -> list[float]:
    return []


def vec(text: str, dims: int) -> list[float]:
    """A reply vector that depends on the text and is not unit length."""
    out = [0.0] * dims
    out[0], out[1] = float(len(text)), 1.0
    return out


def expected(texts: list[str], dims: int) -> np.ndarray:
    return normalize([vec(t, dims) for t in texts])


def openai_reply(seen: Seen, dims: int) -> Reply:
    data = [
        {"object": "embedding", "index": i, "embedding": vec(t, dims)}
        for i, t in enumerate(seen.body["input"])
    ]
    random.Random(7).shuffle(data)
    data.reverse()  # never in order, even for two items
    return 200, {}, {"object": "list", "data": data}


def make(
    name: str,
    server: FakeProvider,
    sleeps: list[float],
    *,
    env: dict[str, str] | None = None,
    path: str = "/v1",
    **config: Any,
) -> Embedder:
    cfg = EmbeddingConfig(base_url=server.url + path, **config)
    keys = {"OPENAI_API_KEY": KEY, "GEMINI_API_KEY": KEY, "VOYAGE_API_KEY": KEY}
    keys["MISTRAL_API_KEY"] = KEY
    return create_remote(name, cfg, keys if env is None else env, sleep=sleeps.append)


TEXTS = ["a", "bb", "ccc", "dddd", "eeeee"]

# -- request shapes ----------------------------------------------------------------------------


def test_openai_request_shape_order_and_normalisation(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: openai_reply(s, 4)
    e = make("openai", server, sleeps, dimensions=4)
    out = e.embed_batch(TEXTS)
    assert out.shape == (5, 4) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected(TEXTS, 4), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    [req] = server.requests
    assert req.path == "/v1/embeddings" and KEY not in req.path
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.headers["content-type"] == "application/json"
    assert req.body == {"model": "text-embedding-3-small", "input": TEXTS, "dimensions": 4}
    assert e.settings() == {
        "provider": "openai",
        "model": "text-embedding-3-small",
        "dims": 4,
        "base_url": server.url + "/v1",
        "dimensions": 4,
    }
    assert (e.max_tokens, e.batch_size) == (8191, 2048)


def test_mistral_uses_the_openai_shape_with_its_defaults(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: openai_reply(s, 1024)
    e = make("mistral", server, sleeps)
    np.testing.assert_allclose(e.embed_batch(TEXTS[:3]), expected(TEXTS[:3], 1024), rtol=1e-6)
    [req] = server.requests
    assert req.body == {"model": "mistral-embed", "input": TEXTS[:3]}
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert (e.dims, e.batch_size, e.max_tokens) == (1024, 64, 8192)


def test_gemini_batch_request_key_in_header_and_task_types(
    server: FakeProvider, sleeps: list[float]
):
    def reply(s: Seen) -> Reply:
        texts = [r["content"]["parts"][0]["text"] for r in s.body["requests"]]
        return 200, {}, {"embeddings": [{"values": vec(t, 8)} for t in texts]}

    server.responder = reply
    e = make("gemini", server, sleeps, env={"GOOGLE_API_KEY": KEY}, path="/v1beta", dimensions=8)
    np.testing.assert_allclose(e.embed_batch(TEXTS), expected(TEXTS, 8), rtol=1e-6)
    assert e.embed_query("q").shape == (8,)
    doc, query = server.requests
    assert doc.path == "/v1beta/models/gemini-embedding-001:batchEmbedContents"
    assert KEY not in doc.path and "key=" not in doc.path
    assert doc.headers["x-goog-api-key"] == KEY and "authorization" not in doc.headers
    assert doc.body["requests"][1] == {
        "model": "models/gemini-embedding-001",
        "taskType": "RETRIEVAL_DOCUMENT",
        "outputDimensionality": 8,
        "content": {"parts": [{"text": "bb"}]},
    }
    assert query.body["requests"][0]["taskType"] == "RETRIEVAL_QUERY"
    assert e.settings()["task_types"] == {
        "document": "RETRIEVAL_DOCUMENT",
        "query": "RETRIEVAL_QUERY",
    }


def test_gemini_default_dims_and_batch_limit(server: FakeProvider, sleeps: list[float]):
    def reply(s: Seen) -> Reply:
        texts = [r["content"]["parts"][0]["text"] for r in s.body["requests"]]
        return 200, {}, {"embeddings": [{"values": vec(t, 3072)} for t in texts]}

    server.responder = reply
    e = make("gemini", server, sleeps, path="/v1beta")
    texts = [f"t{i}" + "x" * (i % 7) for i in range(250)]
    np.testing.assert_allclose(e.embed_batch(texts), expected(texts, 3072), rtol=1e-6)
    assert sorted(len(r.body["requests"]) for r in server.requests) == [50, 100, 100]
    assert "outputDimensionality" not in server.requests[0].body["requests"][0]
    assert (e.dims, e.max_tokens) == (3072, 2048)


def test_voyage_input_types_and_shuffled_indexes(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: openai_reply(s, 8)
    e = make("voyage", server, sleeps, dimensions=8)
    np.testing.assert_allclose(e.embed_batch(TEXTS), expected(TEXTS, 8), rtol=1e-6)
    e.embed_query("hello")
    doc, query = server.requests
    assert doc.path == "/v1/embeddings" and doc.headers["authorization"] == f"Bearer {KEY}"
    assert doc.body == {
        "model": "voyage-3.5",
        "input": TEXTS,
        "input_type": "document",
        "truncation": False,
        "output_dimension": 8,
    }
    assert query.body["input_type"] == "query"
    assert (e.batch_size, e.max_tokens) == (128, 32000)


def test_ollama_probes_dims_once_and_sends_no_key(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: (200, {}, {"embeddings": [vec(t, 6) for t in s.body["input"]]})
    e = make("ollama", server, sleeps, env={}, path="")
    assert e.dims == 6 and e.dims == 6
    np.testing.assert_allclose(e.embed_batch(TEXTS), expected(TEXTS, 6), rtol=1e-6)
    probe, batch = server.requests
    assert probe.path == "/api/embed" and probe.body["input"] == ["ping"]
    assert batch.body == {"model": "nomic-embed-text", "input": TEXTS, "truncate": False}
    assert "authorization" not in batch.headers
    assert e.settings()["base_url"] == server.url


def test_ollama_default_base_is_loopback() -> None:
    e = create_remote("ollama", EmbeddingConfig(), {})
    assert e.model == "nomic-embed-text"
    assert repr(e) == "OllamaEmbedder(model='nomic-embed-text', base_url='http://127.0.0.1:11434')"


def test_openai_compatible_key_optional_prefixes_and_probe(
    server: FakeProvider, sleeps: list[float]
):
    server.responder = lambda s: openai_reply(s, 5)
    bare = make("openai-compatible", server, sleeps, env={}, model="m1")
    keyed = make(
        "openai-compatible",
        server,
        sleeps,
        env={"MEMD_EMBEDDING_API_KEY": KEY},
        model="m1",
        query_prefix="search_query: ",
    )
    assert bare.dims == 5
    keyed.embed_query("hi")
    probe, query = server.requests
    assert "authorization" not in probe.headers and probe.body == {"model": "m1", "input": ["ping"]}
    assert query.headers["authorization"] == f"Bearer {KEY}"
    assert query.body["input"] == ["search_query: hi"]
    assert keyed.settings()["prefixes"] == {"document": "", "query": "search_query: "}
    assert "prefixes" not in bare.settings()
    with pytest.raises(ConfigError, match="embedding.model is required"):
        make("openai-compatible", server, sleeps, env={})
    with pytest.raises(ConfigError, match="embedding.base_url is required"):
        create_remote("openai-compatible", EmbeddingConfig(model="m1"), {})


def test_wrong_vector_size_is_an_error(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: openai_reply(s, 3)
    e = make("openai", server, sleeps)  # text-embedding-3-small: 1536
    with pytest.raises(ProviderUnavailable, match="3-dim vectors .* expected 1536"):
        e.embed_batch(["a"])


# -- retries -----------------------------------------------------------------------------------


def flaky(first: list[Reply], then: Callable[[Seen], Reply]) -> Callable[[Seen], Reply]:
    replies = list(first)
    return lambda s: replies.pop(0) if replies else then(s)


def test_429_honours_retry_after(server: FakeProvider, sleeps: list[float]):
    limited = (429, {"Retry-After": "2"}, {"error": {"message": "Rate limit reached"}})
    server.responder = flaky([limited], lambda s: openai_reply(s, 4))
    e = make("openai", server, sleeps, dimensions=4)
    np.testing.assert_allclose(e.embed_batch(TEXTS), expected(TEXTS, 4), rtol=1e-6)
    assert sleeps == [pytest.approx(2.0, abs=0.05)]
    assert len(server.requests) == 2


def test_500_then_success_backs_off(server: FakeProvider, sleeps: list[float]):
    server.responder = flaky([(500, {}, {"error": "boom"})], lambda s: openai_reply(s, 4))
    e = make("openai", server, sleeps, dimensions=4)
    e.embed_batch(TEXTS)
    assert len(sleeps) == 1 and 0.5 <= sleeps[0] <= 0.6


def test_exhausted_retries_grow_to_the_cap(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: (502, {}, b"<html>Bad Gateway</html>")
    e = make("openai", server, sleeps, dimensions=4, max_retries=6)
    with pytest.raises(ProviderUnavailable, match="failed after 7 attempts: HTTP 502: <html>Bad"):
        e.embed_batch(TEXTS)
    assert len(server.requests) == 7
    for n, delay in enumerate(sleeps[:4]):
        assert 0.5 * 2**n <= delay <= 0.6 * 2**n
    assert sleeps[4:] == [8.0, 8.0]


def test_parse_retry_after() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("120") == 60.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after(format_datetime(now + timedelta(seconds=5), usegmt=True), now=now) == 5
    assert parse_retry_after(format_datetime(now - timedelta(seconds=5), usegmt=True), now=now) == 0


def test_503_with_http_date_retry_after(server: FakeProvider, sleeps: list[float]):
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    server.responder = flaky([(503, {"Retry-After": when}, {})], lambda s: openai_reply(s, 4))
    make("openai", server, sleeps, dimensions=4).embed_batch(["x"])
    assert len(sleeps) == 1 and 25 <= sleeps[0] <= 30


def test_bad_key_is_not_retried(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: (401, {}, {"error": {"message": "Incorrect API key provided"}})
    e = make("openai", server, sleeps, dimensions=4)
    with pytest.raises(ProviderUnavailable) as info:
        e.embed_batch(TEXTS)
    assert str(info.value) == "openai rejected the API key (HTTP 401)"
    assert len(server.requests) == 1 and sleeps == []


def test_other_4xx_carries_a_short_excerpt(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: (404, {}, {"error": {"message": "model 'nope' not found " * 30}})
    with pytest.raises(ProviderUnavailable, match="HTTP 404: model 'nope' not found") as info:
        make("openai", server, sleeps, dimensions=4, model="nope").embed_batch(["a"])
    assert len(str(info.value)) < 300 and sleeps == []


def test_hanging_server_times_out_fast(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: HANG
    e = make("openai", server, sleeps, dimensions=4, timeout_seconds=0.2, max_retries=1)
    start = time.monotonic()
    with pytest.raises(
        ProviderUnavailable, match=r"failed after 2 attempts: timed out after 0.2 s"
    ):
        e.embed_batch(["a"])
    assert time.monotonic() - start < 3
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_connection_refused_is_retried(sleeps: list[float]):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = EmbeddingConfig(base_url=f"http://127.0.0.1:{port}", model="m", max_retries=2)
    e = create_remote("openai-compatible", cfg, {}, sleep=sleeps.append)
    with pytest.raises(ProviderUnavailable, match="failed after 3 attempts: connection failed"):
        e.embed_batch(["a"])
    assert len(sleeps) == 2


def test_redirects_are_not_followed(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: (307, {"Location": server.url + "/elsewhere"}, {})
    with pytest.raises(ProviderUnavailable, match=r"redirected the request \(HTTP 307\)"):
        make("openai", server, sleeps, dimensions=4).embed_batch(["a"])
    assert [r.path for r in server.requests] == ["/v1/embeddings"]


# -- batches that are too large ----------------------------------------------------------------


def test_too_large_batches_split_recursively(server: FakeProvider, sleeps: list[float]):
    def reply(s: Seen) -> Reply:
        if len(s.body["input"]) > 3:
            return 413, {}, {"error": {"message": "Payload Too Large"}}
        return openai_reply(s, 4)

    server.responder = reply
    e = make("openai-compatible", server, sleeps, env={}, model="m", dimensions=4)
    texts = [f"text {i}" + "!" * i for i in range(10)]
    np.testing.assert_allclose(e.embed_batch(texts), expected(texts, 4), rtol=1e-6)
    sizes = [len(r.body["input"]) for r in server.requests]
    assert sizes == [10, 5, 2, 3, 5, 2, 3]
    done = [t for r in server.requests if len(r.body["input"]) <= 3 for t in r.body["input"]]
    assert done == texts and sleeps == []


def test_single_text_too_large_is_named(server: FakeProvider, sleeps: list[float]):
    def reply(s: Seen) -> Reply:
        if any(t.startswith("HUGE") for t in s.body["input"]):
            message = "This model's maximum context length is 8192 tokens"
            return 400, {}, {"error": {"message": message}}
        return openai_reply(s, 4)

    server.responder = reply
    e = make("openai", server, sleeps, dimensions=4)
    with pytest.raises(ProviderUnavailable, match=r"input 2 \(about \d+ tokens, starting 'HUGE"):
        e.embed_batch(["a", "b", "HUGE text", "c"])


def test_token_budget_splits_before_sending(server: FakeProvider, sleeps: list[float]):
    server.responder = lambda s: openai_reply(s, 1024)
    texts = ["word " * 4000] * 5  # about 5000 estimated tokens each; mistral's limit is 16k
    # Asked for more than the provider takes: its own limit decides.
    make("mistral", server, sleeps, request_tokens=100_000).embed_batch(texts)
    assert sorted(len(r.body["input"]) for r in server.requests) == [2, 3]
    server.requests.clear()
    # By default a request holds up to 8,192 tokens: one of these each.
    make("mistral", server, sleeps).embed_batch(texts)
    assert [len(r.body["input"]) for r in server.requests] == [1] * 5


# -- configuration and keys --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/v1",
        "http://10.0.0.5:8080",
        "http://127.0.0.1.example.com/v1",
        "http://api.localhost/v1",  # resolved by DNS where the resolver does not know RFC 6761
        "ftp://127.0.0.1/",
        "https://user:pw@example.com/v1",
    ],
)
def test_unsafe_base_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        create_remote("openai-compatible", EmbeddingConfig(base_url=url, model="m"), {})
    assert "pw" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:1234/v1",
        "http://LOCALHOST.:1234/v1",
        "http://127.0.0.2:9",
        "http://[::1]:8080",
        "https://example.com/",
    ],
)
def test_loopback_and_https_base_urls_are_accepted(url: str) -> None:
    e = create_remote("openai-compatible", EmbeddingConfig(base_url=url, model="m"), {})
    assert repr(e).endswith(f"base_url={url.rstrip('/')!r})")


@pytest.mark.parametrize("name", ["openai", "gemini", "voyage", "mistral"])
def test_missing_key(name: str) -> None:
    with pytest.raises(MissingKey) as info:
        create_remote(name, EmbeddingConfig(), {"OTHER": "x"})
    assert isinstance(info.value, ProviderUnavailable)
    assert str(info.value).startswith(f"no API key for {name} (set ")
    assert str(info.value).endswith(" or embedding.api_key_file)")


def test_missing_key_message_for_openai() -> None:
    with pytest.raises(MissingKey) as info:
        create_remote("openai", EmbeddingConfig(), {})
    assert str(info.value) == "no API key for openai (set OPENAI_API_KEY or embedding.api_key_file)"


def test_unknown_provider_and_ada_dimensions() -> None:
    with pytest.raises(ConfigError, match="unknown remote embedding provider"):
        create_remote("cohere", EmbeddingConfig(), {})
    cfg = EmbeddingConfig(model="text-embedding-ada-002", dimensions=256)
    with pytest.raises(ConfigError, match="does not take embedding.dimensions"):
        create_remote("openai", cfg, {"OPENAI_API_KEY": KEY})


def key_file(tmp_path: Path, mode: int, text: str = "  sk-from-file \n") -> Path:
    path = tmp_path / "key.txt"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, mode)
    with pytest.raises(ConfigError) as info:
        load_api_key("openai", env={}, key_file=str(path))
    assert f"chmod 600 {path}" in str(info.value) and "sk-from-file" not in str(info.value)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_key_file_private_is_accepted_and_wins(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, mode)
    key = load_api_key("openai", env={"OPENAI_API_KEY": "sk-env"}, key_file=str(path))
    assert key is not None and key.reveal() == "sk-from-file"


def test_key_file_symlink_directory_missing_and_bad_content(tmp_path: Path) -> None:
    real = key_file(tmp_path, 0o600)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="is a symlink"):
        load_api_key("openai", env={}, key_file=str(link))
    with pytest.raises(ConfigError, match="not a regular file"):
        load_api_key("openai", env={}, key_file=str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        load_api_key("openai", env={}, key_file=str(tmp_path / "nope"))
    two_lines = key_file(tmp_path, 0o600, "sk-one\nsk-two\n")
    with pytest.raises(ConfigError, match="line breaks") as info:
        load_api_key("openai", env={}, key_file=str(two_lines))
    assert "sk-one" not in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = key_file(tmp_path, 0o600)
    os.chown(path, 65534, -1)
    with pytest.raises(ConfigError, match="belongs to another user"):
        load_api_key("openai", env={}, key_file=str(path))


def test_key_from_file_reaches_the_header(
    server: FakeProvider, sleeps: list[float], tmp_path: Path
):
    server.responder = lambda s: openai_reply(s, 4)
    path = key_file(tmp_path, 0o600)
    e = make("openai", server, sleeps, env={}, dimensions=4, api_key_file=str(path))
    e.embed_batch(["a"])
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-file"


def test_secret_and_redact() -> None:
    s = Secret("sk-abc123")
    assert repr(s) == str(s) == f"{s}" == f"{s!r}" == "***" and s.reveal() == "sk-abc123"
    with pytest.raises(TypeError):
        pickle.dumps(s)
    text = (
        'Authorization: Bearer tok.en-1 and {"api_key": "zz9"} x-goog-api-key: AIza'
        + "B" * 35
        + " sk-proj-XYZ ?key=abc&y=1 my-own-value"
    )
    out = redact(text, [Secret("my-own-value")])
    for leaked in ("tok.en-1", "zz9", "AIzaB", "sk-proj", "key=abc", "my-own-value"):
        assert leaked not in out
    assert redact("nothing secret here") == "nothing secret here"


# -- the canary ---------------------------------------------------------------------------------


def test_canary_key_never_leaks(
    server: FakeProvider,
    sleeps: list[float],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    canary = "sk-canary-" + uuid.uuid4().hex
    secret_part = canary.removeprefix("sk-canary-")
    # memd.logs.configure_logging (run by CLI tests) stops propagation and sets a level.
    monkeypatch.setattr(logging.getLogger("memd"), "propagate", True)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="memd")

    def echo(status: int) -> Callable[[Seen], Reply]:
        def reply(s: Seen) -> Reply:
            key = s.headers.get("authorization") or s.headers.get("x-goog-api-key", "")
            message = f"raw {canary} invalid request from {key}; headers were {s.headers}"
            return status, {"Retry-After": "0"}, {"error": {"message": message}}

        return reply

    scenarios: list[tuple[str, Callable[[Seen], Any]]] = [
        ("openai", echo(401)),
        ("openai", echo(403)),
        ("openai", echo(500)),
        ("openai", echo(429)),
        ("openai", echo(400)),
        ("openai", echo(413)),
        ("openai", lambda s: HANG),
        ("gemini", echo(401)),
        ("gemini", echo(503)),
        ("gemini", echo(422)),
        ("voyage", echo(502)),
    ]
    env = {"OPENAI_API_KEY": canary, "GEMINI_API_KEY": canary, "VOYAGE_API_KEY": canary}
    for name, responder in scenarios:
        server.responder = responder
        server.requests.clear()
        cfg = EmbeddingConfig(base_url=server.url, dimensions=4, timeout_seconds=0.2, max_retries=1)
        e = create_remote(name, cfg, env, sleep=sleeps.append)
        with pytest.raises(ProviderUnavailable) as info:
            e.embed_batch(["hello", "world"])
        sent = server.requests[0].headers
        assert canary in (sent.get("authorization", "") + sent.get("x-goog-api-key", ""))
        seen = [
            caplog.text,
            repr(e),
            repr(vars(e)),
            repr(vars(e._http)),  # type: ignore[attr-defined]
            json.dumps(e.settings()),
            "".join(traceback.format_exception(info.value)),
        ]
        exc: BaseException | None = info.value
        while exc is not None:
            seen += [str(exc), repr(exc), repr(exc.args)]
            exc = exc.__cause__ or exc.__context__
        for text in seen:
            assert secret_part not in text, (name, text)
    # The failures were logged at every level, with the server's text redacted.
    assert "POST" in caplog.text and "retry 1 of 1" in caplog.text and "Bearer ***" in caplog.text


def test_canary_key_is_nowhere_in_the_index_or_cache(
    server: FakeProvider, sleeps: list[float], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Index a workspace through a remote provider, fail once, then grep every file memd wrote."""
    from memd.config import Config
    from memd.embed.select import Choice
    from memd.service import MemoryService

    canary = "sk-canary-" + uuid.uuid4().hex
    calls = {"n": 0}

    def respond(seen: Seen) -> Reply:
        calls["n"] += 1
        if calls["n"] == 1:  # one failure that echoes the key, as a hostile proxy might
            return 401, {}, {"error": f"bad key {seen.headers.get('authorization')}"}
        return openai_reply(seen, 8)

    server.responder = respond
    caplog.set_level(logging.DEBUG)
    embedder = create_remote(
        "openai-compatible",
        EmbeddingConfig(base_url=server.url + "/v1", model="tiny", dimensions=8),
        {"MEMD_EMBEDDING_API_KEY": canary},
        sleep=sleeps.append,
    )
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("remote providers see this text\n")
    service = MemoryService(Config.load(), choice=Choice(embedder, "openai-compatible", False))
    try:
        service.registry.add(ws)
        first = service.sync(str(ws))
        assert first.pending_files == 1 and "rejected the API key" in first.errors[0][1]
        service.registry.get(str(ws)).syncer.reset_backoff()
        assert service.sync(str(ws)).pending_files == 0
        status = json.dumps(service.status(str(ws)))
    finally:
        service.close()
    assert canary not in status and canary not in caplog.text
    state = Path(os.environ["MEMD_HOME"])
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.suffix == ".sqlite" for p in files)
    for path in files:
        assert canary.encode() not in path.read_bytes(), path
