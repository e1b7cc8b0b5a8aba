"""A local model without a dead end: `memctl model pull` of a file, a URL or hf:, what it says
offline, the daemon fetching the recommended model in the background (``auto_pull``), and doctor
asking the running daemon what it serves.

The downloads are served by a real HTTP server on loopback (tests/test_models.py's), the
auto_pull test serves the shared GGUF model and loads it in a real worker.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

import memd_client
from memd.config import Config
from memd.ctl import doctor
from memd.ctl.memctl import cli
from memd.embed.autopull import wanted
from memd.embed.fake import FakeEmbedder
from memd.embed.models import list_models, pull
from memd.embed.select import Choice
from memd_client.errors import ConfigError, ProviderUnavailable

from .daemon_fixture import running_daemon, wait_for
from .gguf_fixture import needs_llama
from .test_models import BLOB, BLOB_SHA, REAL_MODEL, BlobServer, Served, server  # noqa: F401


def _memctl(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "downloads" / "tiny-embedder.gguf"
    path.parent.mkdir()
    path.write_bytes(BLOB)
    return path


def test_pull_copies_a_gguf_file_from_this_machine(gguf: Path, memd_home: Path) -> None:
    code, out = _memctl("model", "pull", str(gguf))
    assert code == 0, out
    copied = memd_home / "models" / "tiny-embedder.gguf"
    assert out.strip().endswith(str(copied))
    assert copied.read_bytes() == BLOB
    assert (memd_home / "models" / "tiny-embedder.gguf.sha256").read_text().split()[0] == BLOB_SHA
    assert gguf.read_bytes() == BLOB  # the original stays where it was
    (listed,) = list_models(memd_home / "models")
    assert listed.sha256 == BLOB_SHA and not listed.partial
    # file:// and ~ forms too; again is a no-op that checks the copy.
    assert pull(gguf.as_uri(), memd_home / "models") == copied
    assert pull(str(copied), memd_home / "models") == copied


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"<html>not a model</html>", "not a GGUF model file"), (None, "no model file at")],
)
def test_pull_refuses_what_is_not_a_model_file(
    gguf: Path, memd_home: Path, content: bytes | None, why: str
) -> None:
    if content is None:
        gguf.unlink()
    else:
        gguf.write_bytes(content)
    with pytest.raises(ConfigError, match=why):
        pull(str(gguf), memd_home / "models")
    assert list_models(memd_home / "models") == []
    with pytest.raises(ConfigError, match="64 hex"):
        pull(str(gguf), memd_home / "models", sha256="x")


def test_pull_of_a_file_checks_a_given_checksum(gguf: Path, memd_home: Path) -> None:
    with pytest.raises(ProviderUnavailable, match="checksum mismatch"):
        pull(str(gguf), memd_home / "models", sha256="0" * 64)
    assert list_models(memd_home / "models") == []  # nothing half-copied left behind
    assert pull(str(gguf), memd_home / "models", sha256=BLOB_SHA).read_bytes() == BLOB


def test_pull_downloads_an_http_url(server: BlobServer, memd_home: Path) -> None:  # noqa: F811
    url = server.serve("/mirror/tiny-embedder.gguf", Served(BLOB, etag=BLOB_SHA))
    code, out = _memctl("model", "pull", url)
    assert code == 0, out
    assert (memd_home / "models" / "tiny-embedder.gguf").read_bytes() == BLOB


def test_offline_pull_names_the_routes_that_work(memd_home: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: as good as no network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = _memctl("model", "pull", f"http://127.0.0.1:{port}/model.gguf")
    assert code == 1
    assert "are you offline?" in out
    assert "memctl model pull /path/to/model.gguf" in out and "MEMD_LOCAL_MODEL=" in out


def test_auto_pull_is_wanted_only_where_a_local_model_would_be_used(
    memd_home: Path, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyword_only = Choice(None, "auto", protect=True)
    config = Config.load()
    installed = importlib.util.find_spec("llama_cpp") is not None
    assert wanted(config, keyword_only) is installed
    assert not wanted(config, Choice(FakeEmbedder(), "auto", protect=False))  # chose another
    monkeypatch.setenv("MEMD_EMBEDDING_AUTO_PULL", "false")
    assert not wanted(Config.load(), keyword_only)
    monkeypatch.delenv("MEMD_EMBEDDING_AUTO_PULL")
    monkeypatch.setenv("MEMD_EMBEDDING_PROVIDER", "openai")
    assert not wanted(Config.load(), keyword_only)
    monkeypatch.delenv("MEMD_EMBEDDING_PROVIDER")
    monkeypatch.setenv("MEMD_LOCAL_MODEL", str(gguf))
    assert not wanted(Config.load(), keyword_only)
    monkeypatch.delenv("MEMD_LOCAL_MODEL")
    pull(str(gguf), memd_home / "models")  # a model in the model directory
    assert not wanted(Config.load(), keyword_only)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    return root


@needs_llama
@pytest.mark.skipif(not REAL_MODEL.is_file(), reason=f"no GGUF model at {REAL_MODEL}")
def test_the_daemon_fetches_the_model_in_the_background_and_serves_it(
    server: BlobServer,  # noqa: F811
    ws: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = REAL_MODEL.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    # Served slowly enough to be seen downloading: the first half, then a dropped connection
    # (the download resumes where it stopped).
    url = server.serve(f"/{REAL_MODEL.name}", Served(data, etag=sha, drop_after=len(data) // 2))
    monkeypatch.setenv("MEMD_EMBEDDING_PULL_URI", url)
    with running_daemon(Config.load(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="agent")
            # Keyword search answers while the model is fetched.
            first = c.search("agent", "staging cluster Orion", wait_ms=5000)
            assert [h["path"] for h in first["results"]] == ["MEMORY.md"]
            pulled = c.status()["daemon"]["model_pull"]
            assert pulled["uri"] == url
            served = wait_for(
                lambda: (
                    c.status()["daemon"]["embedder"]["active"] == "local"
                    and c.status()["daemon"]["model_pull"]
                ),
                "the fetched model to be in service",
                timeout=240,
            )
            assert served["state"] == "done" and served["total"] == len(data)

            def hybrid() -> bool:
                found = c.search("agent", "what is staging called", wait_ms=5000)
                return found["mode"] == "hybrid" and found["freshness"]["fresh"]

            wait_for(hybrid, "the index rebuilt with vectors", timeout=240)
    models = Path(os.environ["MEMD_HOME"]) / "models"
    assert hashlib.sha256((models / REAL_MODEL.name).read_bytes()).hexdigest() == sha
    assert len([h for h in server.hits if h.range]) == 1  # resumed once, not started over


def test_a_failed_download_is_said_in_status_with_the_routes(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("auto_pull applies only with llama-cpp-python installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MEMD_EMBEDDING_PULL_URI", f"http://127.0.0.1:{port}/model.gguf")
    with running_daemon(Config.load(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="agent")
            failed = wait_for(
                lambda: (p := c.status()["daemon"]["model_pull"])["state"] == "failed" and p,
                "the download to fail",
            )
            assert "MEMD_LOCAL_MODEL" in failed["error"]
            found = c.search("agent", "staging cluster", wait_ms=5000)
            assert found["mode"] == "keyword" and found["results"]
        code, out = _memctl("--socket", str(daemon.socket_path), "status")
        assert code == 0 and "Model: could not download model.gguf" in out
        checks = {c.name: c for c in doctor.run_checks(Config.load(), socket=daemon.socket_path)}
        assert checks["model"].status == "warn" and "searches by keyword" in checks["model"].detail


def test_doctor_says_what_the_running_daemon_serves(
    gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model in this shell while the daemon embeds: not "no model configured"."""
    with running_daemon(embedder=FakeEmbedder()) as daemon:
        checks = {c.name: c for c in doctor.run_checks(Config.load(), socket=daemon.socket_path)}
        model = checks["model"]
        assert model.status == "ok" and f"memd (pid {os.getpid()}) embeds with fake" in model.detail
        result = CliRunner().invoke(cli, ["--socket", str(daemon.socket_path), "doctor", "--json"])
        (as_json,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "model"]
        assert "embeds with fake" in as_json["detail"]
    # A keyword-only daemon while this shell points at a model: the daemon's view, and why.
    monkeypatch.setenv("MEMD_EMBEDDING_PROVIDER", "none")
    with running_daemon(Config.load(), choose_embedder=True) as daemon:
        monkeypatch.delenv("MEMD_EMBEDDING_PROVIDER")
        monkeypatch.setenv("MEMD_LOCAL_MODEL", str(gguf))
        checks = {c.name: c for c in doctor.run_checks(Config.load(), socket=daemon.socket_path)}
    model = checks["model"]
    assert model.status == "warn" and "searches by keyword only" in model.detail
    assert f"this shell would use {gguf}" in model.detail and "restart memd" in (model.fix or "")


@needs_llama
@pytest.mark.skipif(not REAL_MODEL.is_file(), reason=f"no GGUF model at {REAL_MODEL}")
def test_offline_a_model_pulled_from_a_file_is_taken_without_a_restart(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MEMD_EMBEDDING_PULL_URI", f"http://127.0.0.1:{port}/model.gguf")
    with running_daemon(Config.load(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="agent")
            wait_for(lambda: c.status()["daemon"]["model_pull"]["state"] == "failed", "offline")
            code, out = _memctl("model", "pull", str(REAL_MODEL))
            assert code == 0, out
            wait_for(
                lambda: c.status()["daemon"]["embedder"]["active"] == "local",
                "the model copied in to be in service",
                timeout=120,
            )
