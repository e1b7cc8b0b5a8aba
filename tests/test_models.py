"""Model pull against a real HTTP server on loopback: resume, checksums, failures, listing."""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import random
import re
import socket
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memd.embed.models import (
    ModelInfo,
    ModelSource,
    find_default_model,
    list_models,
    progress_bar,
    pull,
    resolve_uri,
)
from memd_client.errors import Busy, ConfigError, ProviderUnavailable

BLOB = b"GGUF" + random.Random(7).randbytes(3 * 1024 * 1024 - 4)
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()
REAL_MODEL = Path(
    os.environ.get("MEMD_TEST_MODEL")
    or Path(__file__).resolve().parents[2] / "shared/models/all-MiniLM-L6-v2.Q8_0.gguf"
)


@dataclass
class Served:
    """One file the test server offers, and how it misbehaves."""

    body: bytes
    etag: str | None = None
    content_type: str = "application/octet-stream"
    drop_after: int | None = None  # send this many body bytes, then hang up (once)
    stall_after: int | None = None  # send this many body bytes, then go silent (once)
    ignore_range: bool = False
    redirect_to: str | None = None
    linked_etag: str | None = None  # X-Linked-ETag on the redirect, as Hugging Face sends


@dataclass
class Hit:
    path: str
    range: str | None
    status: int


@dataclass
class ServerState:
    files: dict[str, Served] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # so server_close() joins every handler thread
    state: ServerState

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up on purpose is not a test failure


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _status(self, code: int) -> None:
        self.server.state.hits.append(Hit(self.path, self.headers.get("Range"), code))
        self.send_response(code)

    def do_GET(self) -> None:
        served = self.server.state.files.get(self.path)
        if served is None:
            self.server.state.hits.append(Hit(self.path, self.headers.get("Range"), 404))
            self.send_error(404)
            return
        if served.redirect_to:
            self._status(302)
            self.send_header("Location", served.redirect_to)
            if served.linked_etag:
                self.send_header("X-Linked-ETag", f'"{served.linked_etag}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body, start = served.body, 0
        wanted = self.headers.get("Range")
        if wanted and not served.ignore_range:
            match = re.fullmatch(r"bytes=(\d+)-", wanted)
            assert match, wanted
            start = int(match[1])
            if start >= len(body):
                self._status(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._status(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self._status(200)
        self.send_header("Content-Type", served.content_type)
        self.send_header("Content-Length", str(len(body) - start))
        if served.etag:
            self.send_header("ETag", f'"{served.etag}"')
        self.end_headers()
        chunk = body[start:]
        if served.drop_after is not None:
            chunk, served.drop_after = chunk[: served.drop_after], None
        elif served.stall_after is not None:
            self.wfile.write(chunk[: served.stall_after])
            self.wfile.flush()
            served.stall_after = None
            self.server.state.release.wait(5)
            return
        self.wfile.write(chunk)


class BlobServer:
    def __init__(self, httpd: _Server) -> None:
        self.state = httpd.state
        self.port = httpd.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, served: Served) -> str:
        self.state.files[path] = served
        return self.url(path)

    @property
    def hits(self) -> list[Hit]:
        return self.state.hits


@pytest.fixture
def server() -> Iterator[BlobServer]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.state = ServerState()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield BlobServer(httpd)
    finally:
        httpd.state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- URIs -------------------------------------------------------------------------------------


def test_hf_uri_maps_to_resolve_url() -> None:
    src = resolve_uri("hf:ggml-org/embeddinggemma-300M-qat-q8_0-GGUF/model-Q8_0.gguf")
    assert src == ModelSource(
        "https://huggingface.co/ggml-org/embeddinggemma-300M-qat-q8_0-GGUF/resolve/main/model-Q8_0.gguf",
        "model-Q8_0.gguf",
        None,
    )
    src = resolve_uri(f"hf:org/repo/sub/dir/x.gguf@v1.0#sha256={BLOB_SHA.upper()}")
    assert src.url == "https://huggingface.co/org/repo/resolve/v1.0/sub/dir/x.gguf"
    assert (src.filename, src.sha256) == ("x.gguf", BLOB_SHA)
    assert "/resolve/refs%2Fpr%2F3/" in resolve_uri("hf:org/repo/x.gguf@refs/pr/3").url


def test_urls_are_taken_as_they_are() -> None:
    url = "https://example.com/models/a%20b.gguf?sig=1"
    assert resolve_uri(url) == ModelSource(url, "a b.gguf", None)
    assert resolve_uri(f"{url}#sha256={BLOB_SHA}").sha256 == BLOB_SHA
    assert resolve_uri("http://127.0.0.1:8080/x.gguf").url == "http://127.0.0.1:8080/x.gguf"
    assert resolve_uri("http://localhost/x.gguf").filename == "x.gguf"
    assert resolve_uri("http://[::1]:9/x.gguf").filename == "x.gguf"
    # A pasted Hugging Face page link is turned into the file's link.
    page = "https://huggingface.co/org/repo/blob/main/x.gguf"
    assert resolve_uri(page).url == "https://huggingface.co/org/repo/resolve/main/x.gguf"


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("ftp://example.com/x.gguf", "https:// URL"),
        ("example.com/x.gguf", "https:// URL"),
        ("http://example.com/x.gguf", "plain http"),
        ("http://10.0.0.1/x.gguf", "plain http"),
        ("http://models.localhost/x.gguf", "plain http"),  # the same rule as embedding URLs
        ("https://example.com/x.bin", "not a .gguf"),
        ("https://example.com/", "cannot be a file name"),
        ("https://example.com/..%2Fx.gguf", "cannot be a file name"),
        ("https://example.com/a%5Cx.gguf", "cannot be a file name"),
        ("https://example.com/.gguf", "cannot be a file name"),
        ("https://example.com:port/x.gguf", "bad model URI"),
        ("https://example.com/x.gguf#md5=abc", "#sha256="),
        ("https://example.com/x.gguf#sha256=abc", "#sha256="),
        ("hf:org/repo", "hf:ORG/REPO/FILE.gguf"),
        ("hf:org/repo/x.txt", "not a .gguf"),
        ("hf:org/repo/../x.gguf", "malformed"),
        ("hf:org//x.gguf", "repository name"),
        ("hf:org/repo/x.gguf@", "revision"),
        ("hf:org/repo/x.gguf@../main", "revision"),
    ],
)
def test_bad_uris_are_refused(uri: str, why: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(why)):
        resolve_uri(uri)


def test_pull_refuses_a_bad_sha256_argument(models_dir: Path) -> None:
    with pytest.raises(ConfigError, match="64 hex"):
        pull("http://127.0.0.1:9/x.gguf", models_dir, sha256="abc")
    with pytest.raises(ConfigError, match="differ"):
        pull(f"http://127.0.0.1:9/x.gguf#sha256={BLOB_SHA}", models_dir, sha256="0" * 64)


# --- pull -------------------------------------------------------------------------------------


def test_pull_downloads_verifies_and_records(server: BlobServer, models_dir: Path) -> None:
    url = server.serve("/m.gguf", Served(BLOB, etag=BLOB_SHA))
    seen: list[tuple[int, int | None]] = []
    path = pull(url, models_dir, progress=lambda done, total: seen.append((done, total)))
    assert path == models_dir / "m.gguf"
    assert path.read_bytes() == BLOB
    assert (models_dir / "m.gguf.sha256").read_text() == f"{BLOB_SHA}  m.gguf\n"
    assert not (models_dir / "m.gguf.part").exists()
    assert stat.S_IMODE(models_dir.stat().st_mode) == 0o700
    assert seen[0] == (0, len(BLOB)) and seen[-1] == (len(BLOB), len(BLOB))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert [(h.range, h.status) for h in server.hits] == [(None, 200)]


def test_dropped_connection_resumes_with_a_range(server: BlobServer, models_dir: Path) -> None:
    cut = 1_500_000
    url = server.serve("/m.gguf", Served(BLOB, etag=BLOB_SHA, drop_after=cut))
    with pytest.raises(ProviderUnavailable, match="partial file is kept.*offline"):
        pull(url, models_dir)
    assert (models_dir / "m.gguf.part").stat().st_size == cut
    assert not (models_dir / "m.gguf").exists()
    seen: list[tuple[int, int | None]] = []
    path = pull(url, models_dir, progress=lambda done, total: seen.append((done, total)))
    assert server.hits[-1] == Hit("/m.gguf", f"bytes={cut}-", 206)
    assert path.read_bytes() == BLOB
    assert seen[0] == (cut, len(BLOB))
    assert _sha(path) == BLOB_SHA == (models_dir / "m.gguf.sha256").read_text().split()[0]
    assert [m.name for m in list_models(models_dir)] == ["m.gguf"]


def test_server_ignoring_range_restarts_from_zero(server: BlobServer, models_dir: Path) -> None:
    models_dir.mkdir()
    (models_dir / "m.gguf.part").write_bytes(b"junk" * 1000)
    url = server.serve("/m.gguf", Served(BLOB, ignore_range=True))
    assert pull(url, models_dir).read_bytes() == BLOB
    assert server.hits == [Hit("/m.gguf", "bytes=4000-", 200)]


def test_complete_part_is_verified_on_416(server: BlobServer, models_dir: Path) -> None:
    models_dir.mkdir()
    (models_dir / "m.gguf.part").write_bytes(BLOB)
    url = server.serve("/m.gguf", Served(BLOB, etag=BLOB_SHA))
    assert pull(url, models_dir).read_bytes() == BLOB
    assert server.hits == [Hit("/m.gguf", f"bytes={len(BLOB)}-", 416)]


def test_oversized_part_starts_over(server: BlobServer, models_dir: Path) -> None:
    models_dir.mkdir()
    (models_dir / "m.gguf.part").write_bytes(BLOB + b"extra")
    url = server.serve("/m.gguf", Served(BLOB))
    assert pull(url, models_dir).read_bytes() == BLOB
    assert [(h.range, h.status) for h in server.hits] == [
        (f"bytes={len(BLOB) + 5}-", 416),
        (None, 200),
    ]


@pytest.mark.parametrize("where", ["argument", "fragment", "etag", "redirect"])
def test_checksum_mismatch_deletes_the_part(
    server: BlobServer, models_dir: Path, where: str
) -> None:
    wrong = "ab" * 32
    url = server.serve("/m.gguf", Served(BLOB, etag=wrong if where == "etag" else None))
    if where == "fragment":
        url += f"#sha256={wrong}"
    elif where == "redirect":
        url = server.serve("/r/m.gguf", Served(b"", redirect_to=url, linked_etag=wrong))
    with pytest.raises(ProviderUnavailable, match=f"expected {wrong}, got {BLOB_SHA}"):
        pull(url, models_dir, sha256=wrong if where == "argument" else None)
    assert list(models_dir.iterdir()) == []


def test_redirect_linked_etag_is_used_and_cdn_etag_is_not(
    server: BlobServer, models_dir: Path
) -> None:
    # Behind a redirect the CDN's ETag may be some other 64-hex hash (Xet): it must not count.
    cdn = server.serve("/cdn/blob", Served(BLOB, etag="cd" * 32))
    url = server.serve("/r/m.gguf", Served(b"", redirect_to=cdn, linked_etag=BLOB_SHA))
    assert pull(url, models_dir).read_bytes() == BLOB
    assert [h.status for h in server.hits] == [302, 200]


def test_content_that_is_not_gguf_is_refused(server: BlobServer, models_dir: Path) -> None:
    url = server.serve("/m.gguf", Served(b"PK\x03\x04" + bytes(1000)))
    with pytest.raises(ProviderUnavailable, match="not a GGUF file"):
        pull(url, models_dir)
    page = server.serve("/p.gguf", Served(b"<html>login</html>", content_type="text/html"))
    with pytest.raises(ProviderUnavailable, match="web page"):
        pull(page, models_dir)
    assert list(models_dir.iterdir()) == []


def test_http_404_is_named(server: BlobServer, models_dir: Path) -> None:
    with pytest.raises(ProviderUnavailable, match="HTTP 404") as info:
        pull(server.url("/missing.gguf"), models_dir)
    assert "offline" not in str(info.value)
    assert list(models_dir.iterdir()) == []


def test_connection_refused_says_offline(models_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ProviderUnavailable, match="are you offline"):
        pull(f"http://127.0.0.1:{port}/m.gguf", models_dir, timeout=2)
    assert list(models_dir.iterdir()) == []


def test_stalled_server_times_out_and_keeps_the_part(server: BlobServer, models_dir: Path) -> None:
    url = server.serve("/m.gguf", Served(BLOB, stall_after=100_000))
    with pytest.raises(ProviderUnavailable, match="timed out.*offline"):
        pull(url, models_dir, timeout=0.5)
    assert (models_dir / "m.gguf.part").stat().st_size == 100_000
    server.state.release.set()
    assert pull(url, models_dir).read_bytes() == BLOB
    assert server.hits[-1].range == "bytes=100000-"


def test_already_present_needs_no_network(server: BlobServer, models_dir: Path) -> None:
    url = server.serve("/m.gguf", Served(BLOB))
    path = pull(url, models_dir)
    before = len(server.hits)
    assert pull(url, models_dir) == path
    assert pull(url, models_dir, sha256=BLOB_SHA) == path
    assert len(server.hits) == before
    # Asking for different content goes to the network, and a failure keeps the old file.
    with pytest.raises(ProviderUnavailable, match="checksum mismatch"):
        pull(url, models_dir, sha256="ab" * 32)
    assert len(server.hits) == before + 1
    assert path.read_bytes() == BLOB


def test_present_file_without_record_is_checked_against_the_sha(
    server: BlobServer, models_dir: Path
) -> None:
    models_dir.mkdir()
    (models_dir / "m.gguf").write_bytes(BLOB)
    url = server.serve("/m.gguf", Served(BLOB))
    assert pull(f"{url}#sha256={BLOB_SHA}", models_dir).read_bytes() == BLOB
    assert server.hits == []
    assert (models_dir / "m.gguf.sha256").read_text().startswith(BLOB_SHA)


def test_concurrent_pull_of_the_same_file_is_busy(server: BlobServer, models_dir: Path) -> None:
    models_dir.mkdir()
    url = server.serve("/m.gguf", Served(BLOB))
    with open(models_dir / "m.gguf.part", "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(Busy, match="another pull"):
            pull(url, models_dir)
    assert server.hits == []


@pytest.mark.skipif(not REAL_MODEL.is_file(), reason="no real model file on this machine")
def test_real_model_round_trips(server: BlobServer, models_dir: Path) -> None:
    data = REAL_MODEL.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    url = server.serve(f"/{REAL_MODEL.name}", Served(data, etag=sha, drop_after=len(data) // 2))
    with pytest.raises(ProviderUnavailable):
        pull(url, models_dir)
    path = pull(url, models_dir)
    assert path.name == REAL_MODEL.name
    assert _sha(path) == sha
    assert find_default_model(models_dir) == path


# --- listing ----------------------------------------------------------------------------------


def test_list_models_and_default(models_dir: Path) -> None:
    assert list_models(models_dir) == [] and find_default_model(models_dir) is None
    models_dir.mkdir()
    (models_dir / "b.gguf").write_bytes(b"GGUF" + bytes(10))
    (models_dir / "b.gguf.sha256").write_text(f"{BLOB_SHA}  b.gguf\n")
    (models_dir / "a.gguf").write_bytes(b"GGUF")
    (models_dir / "c.gguf.part").write_bytes(b"GG")
    (models_dir / "notes.txt").write_text("x")
    (models_dir / "sub.gguf").mkdir()
    assert list_models(models_dir) == [
        ModelInfo("a.gguf", models_dir / "a.gguf", 4, None, False),
        ModelInfo("b.gguf", models_dir / "b.gguf", 14, BLOB_SHA, False),
        ModelInfo("c.gguf", models_dir / "c.gguf.part", 2, None, True),
    ]
    os.utime(models_dir / "a.gguf", (1_000_000, 1_000_000))
    assert find_default_model(models_dir) == models_dir / "b.gguf"
    os.utime(models_dir / "a.gguf", (4_000_000_000, 4_000_000_000))
    assert find_default_model(models_dir) == models_dir / "a.gguf"
    (models_dir / "a.gguf").unlink()
    (models_dir / "b.gguf").unlink()
    assert find_default_model(models_dir) is None  # a partial download is never the default


# --- progress bar -----------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_only_on_a_terminal() -> None:
    plain = io.StringIO()
    draw = progress_bar(plain)
    draw(0, 2_000_000)
    draw(1_000_000, 2_000_000)
    assert plain.getvalue() == ""
    draw(2_000_000, 2_000_000)
    assert plain.getvalue().count("\n") == 1 and "100%" in plain.getvalue()

    term = _Terminal()
    draw = progress_bar(term)
    draw(0, 2_000_000)
    draw(2_000_000, 2_000_000)
    out = term.getvalue()
    assert out.startswith("\r[") and out.endswith("MB/s\n")
    assert "  0%" in out and "100%" in out and "2.0/2.0 MB" in out

    unknown = _Terminal()
    progress_bar(unknown)(3_000_000, None)
    assert "3.0 MB" in unknown.getvalue() and "%" not in unknown.getvalue()


def test_the_recommended_model_is_multilingual_e5() -> None:
    """`memctl model pull` with no URI and doctor's hint fetch it (docs/benchmarks.md: why)."""
    from memd.ctl.doctor.embedding import DEFAULT_MODEL_URI
    from memd.embed.models import RECOMMENDED_MODEL_URI, resolve_uri

    source = resolve_uri(RECOMMENDED_MODEL_URI)
    assert source.filename == "multilingual-e5-small-q8_0.gguf"
    assert source.url.startswith("https://")
    assert DEFAULT_MODEL_URI == RECOMMENDED_MODEL_URI
