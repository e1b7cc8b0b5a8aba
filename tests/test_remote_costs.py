"""What memd sends a remote provider, said in status (today and in total, across restarts),
and said before a rebuild (`memctl reindex --force --dry-run`), through a real daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import memd_client
from memd.config import Config, EmbeddingConfig, IndexConfig
from memd.ctl.display_status import status_lines
from memd.ctl.memctl import cli
from memd.embed.usage import Usage
from memd_client.errors import BadRequest

from .daemon_fixture import running_daemon, wait_for
from .provider_server import FakeProvider
from .test_remote_index import daily_notes, indexed
from .test_remote_speed import DIMS, KEY, reply


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    srv = FakeProvider()
    srv.responder = reply
    try:
        yield srv
    finally:
        srv.close()


def config(server: FakeProvider, **index: Any) -> Config:
    return Config.load(
        embedding=EmbeddingConfig(
            provider="openai", base_url=server.url + "/v1", model="m", dimensions=DIMS
        ),
        index=IndexConfig(**index),
    )


def test_status_says_what_was_sent_today_and_in_total(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    daily_notes(ws, files=12)
    with running_daemon(config(server, line_vectors=False), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="notes")
            wait_for(lambda: indexed(c, "notes"), "the first index", timeout=60)
            status = dict(c.status())
    sent = status["embedding"]["usage"]["openai"]
    assert sent["today"] == sent["total"]
    assert sent["total"]["texts"] == server.counts.texts == 12
    assert sent["total"]["requests"] == server.counts.requests
    # The provider's own count of tokens (the replies' "usage"), not memd's estimate.
    assert sent["total"]["tokens"] == sum(len(t) // 4 + 1 for t in texts_sent(server))
    requests = status["embedding"]["requests"]
    assert requests["kind"] == "cloud" and requests["concurrency"] == 4
    assert status["workspaces"][0]["provider"]["line_vectors"] is False
    text = "\n".join(status_lines(status, 0.0))
    assert "Provider: openai m, 8 dims, chunk vectors only" in text
    assert "Embedding API:" in text
    assert f"sent to openai today: 12 texts · {sent['total']['tokens']:,} tokens" in text
    # A restart keeps the totals (the state file), and adds to them.
    (ws / "memory" / "2026-03-01.md").write_text("# New\n\nthe staging cluster is vega now\n")
    with running_daemon(config(server, line_vectors=False), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            wait_for(lambda: indexed(c, "notes"), "the new note's vector", timeout=60)
            again = c.status()["embedding"]["usage"]["openai"]
    assert again["total"]["texts"] == 13
    assert again["total"]["requests"] == server.counts.requests


def texts_sent(server: FakeProvider) -> list[str]:
    return [t for r in server.requests if r.path.endswith("/embeddings") for t in r.body["input"]]


def test_usage_keeps_days_apart_and_survives_a_bad_file(tmp_path: Path) -> None:
    idle = Usage(tmp_path / "idle.json")
    idle.flush()
    assert not (tmp_path / "idle.json").exists()  # nothing sent: nothing written
    day = [date(2026, 3, 1)]
    path = tmp_path / "usage.json"
    usage = Usage(path, today=lambda: day[0])
    usage.record("openai", texts=3, tokens=30, requests=1)
    day[0] = date(2026, 3, 2)
    usage.record("openai", texts=1, tokens=5, requests=1)
    usage.flush()
    snap = Usage(path, today=lambda: day[0]).snapshot()["openai"]
    assert snap["today"] == {"texts": 1, "tokens": 5, "requests": 1}
    assert snap["total"] == {"texts": 4, "tokens": 35, "requests": 2}
    path.write_text("{not json")
    assert Usage(path).snapshot() == {}  # counted again from zero, not a failure


def test_a_dry_run_says_what_a_rebuild_would_send_and_sends_nothing(
    server: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = tmp_path / "notes"
    daily_notes(ws, files=10)
    cfg = config(server)
    with running_daemon(cfg, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="notes")
            wait_for(lambda: indexed(c, "notes"), "the first index", timeout=60)
            sent_before = server.counts.requests
            # Everything is in the embedding cache: a rebuild would send nothing.
            [warm] = c.reindex("notes", force=True, dry_run=True)["estimates"]
            assert warm["files"] == 10 and warm["chunks"] == 10
            assert warm["texts"] == 10 + 10 * 15 and warm["line_vectors"] is True
            assert warm["cached"] == warm["texts"] and warm["send_texts"] == 0
            # New text: what it would cost, without sending it.
            (ws / "memory" / "2026-04-01.md").write_text(
                "# April\n\n- the orion cluster moved\n- the vega cluster stays\n"
            )
            [cold] = c.reindex("notes", force=True, dry_run=True)["estimates"]
            assert cold["send_texts"] == 3  # the chunk and its two lines
            assert cold["send_tokens"] > 0 and cold["requests"] == 1 and not cold["batch"]
            assert server.counts.requests == sent_before  # nothing sent
            with pytest.raises(BadRequest, match="goes with force"):
                c.reindex("notes", dry_run=True)
            result = CliRunner().invoke(
                cli,
                [
                    "--socket",
                    str(daemon.socket_path),
                    "reindex",
                    "-w",
                    "notes",
                    "--force",
                    "--dry-run",
                ],
            )
            assert result.exit_code == 0, result.output
            assert "a rebuild would index 11 files (11 chunks)" in result.output
            assert "sends 3 texts, about" in result.output and "in 1 requests" in result.output
            as_json = CliRunner().invoke(
                cli,
                ["--socket", str(daemon.socket_path), "reindex", "-w", "notes", "--force"]
                + ["--dry-run", "--json"],
            )
            assert json.loads(as_json.output)["estimates"][0]["send_texts"] == 3
            assert server.counts.requests == sent_before
            assert not c.status(workspace="notes")["workspaces"][0]["rebuilding"]
