"""The transport to remote providers: kept-alive connections, the environment's proxy and CA
bundle, and the pace a provider's rate limits set; against real servers on 127.0.0.1."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.config import EmbeddingConfig
from memd.embed.pace import Pace, parse_duration
from memd.embed.providers import create_remote
from memd_client.errors import ProviderUnavailable

from .provider_server import ConnectProxy, FakeProvider, Reply, Seen

KEY = "sk-test-" + "h" * 20
DIMS = 8


def reply(seen: Seen) -> Reply:
    data = [
        {"object": "embedding", "index": i, "embedding": [1.0 + len(t)] + [0.5] * (DIMS - 1)}
        for i, t in enumerate(seen.body["input"])
    ]
    return 200, {}, {"object": "list", "data": data}


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    srv = FakeProvider()
    srv.responder = reply
    try:
        yield srv
    finally:
        srv.close()


def make(name: str, server: FakeProvider, **config: Any) -> Any:
    cfg = EmbeddingConfig(base_url=server.url + "/v1", dimensions=DIMS, model="m", **config)
    return create_remote(name, cfg, {"OPENAI_API_KEY": KEY})


def test_connections_are_kept_and_reused(server: FakeProvider) -> None:
    e = make("openai", server)
    for i in range(10):
        e.embed_batch([f"text {i}"])
    assert server.counts.requests == 10 and server.counts.connections == 1
    e.close()


def test_pace_waits_for_the_longest_limit_once() -> None:
    now = [100.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    pace = Pace(sleep, clock=lambda: now[0])
    pace.observe({"x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "20ms"})
    pace.wait(10)  # one request was left: it goes
    pace.wait(10)  # none left: wait for the reset
    assert sleeps == [pytest.approx(0.02)]
    pace.hold(5)
    pace.wait()
    assert sleeps[-1] == pytest.approx(5)
    other = Pace(sleep, clock=lambda: now[0])
    other.wait()
    assert len(sleeps) == 2  # a pace of its own: nothing held


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 60.0), ("20ms", 0.02), ("1.5", 1.5), ("1m3.5s", 60.0), ("", None)],
)
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)
    assert parse_duration("soon") is None and parse_duration("-1") is None


# -- proxies and certificates ------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for embeddings.example (the test's CA bundle too)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=embeddings.example"]
        + ["-addext", "subjectAltName=DNS:embeddings.example"],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_https_through_the_environments_proxy_with_its_ca_bundle(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = FakeProvider(tls=tls)
    server.responder = reply
    proxy = ConnectProxy(server.port)
    try:
        for var in ("NO_PROXY", "no_proxy", "HTTPS_PROXY"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("https_proxy", proxy.url.replace("://", "://user:p%40ss@"))
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        base = f"https://embeddings.example:{server.port}/v1"
        cfg = EmbeddingConfig(base_url=base, model="m", dimensions=DIMS, max_retries=0)
        e = create_remote("openai", cfg, {"OPENAI_API_KEY": KEY})
        for n in range(3):
            assert e.embed_batch([f"text {n}"]).shape == (1, DIMS)
        # One tunnel, kept: its credentials from the proxy URL, never the API key.
        [(target, headers)] = proxy.tunnels
        assert target == f"embeddings.example:{server.port}"
        assert headers["proxy-authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
        assert server.requests[0].headers["host"] == f"embeddings.example:{server.port}"
        assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
        e.close()
        # NO_PROXY names the host: no tunnel, and this name does not resolve here.
        monkeypatch.setenv("no_proxy", "embeddings.example")
        direct = create_remote("openai", cfg, {"OPENAI_API_KEY": KEY})
        with pytest.raises(ProviderUnavailable, match="connection failed"):
            direct.embed_batch(["text"])
        assert len(proxy.tunnels) == 1
        direct.close()
        # Without the bundle the certificate is not trusted.
        monkeypatch.delenv("no_proxy")
        monkeypatch.delenv("SSL_CERT_FILE")
        untrusted = create_remote("openai", cfg, {"OPENAI_API_KEY": KEY})
        with pytest.raises(ProviderUnavailable, match="TLS certificate verification failed"):
            untrusted.embed_batch(["text"])
        untrusted.close()
    finally:
        proxy.close()
        server.close()
