"""A file or folder whose name is not valid UTF-8 is skipped and reported; everything else in
the workspace is indexed and searched as always."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd.config import Config
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd.markdown.discover import discover, memory_file

from .daemon_fixture import running_daemon

# Latin-1 "café", a lone continuation byte, an overlong "/", a surrogate in CESU-8.
BAD_NAMES = [b"caf\xe9.md", b"\x80.md", b"x\xc0\xaf.md", b"\xed\xa0\x80.md"]


def _make(folder: Path, name: bytes, text: str) -> None:
    with open(os.fsencode(folder) + b"/" + name, "w", encoding="utf-8") as f:
        f.write(text)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nProduction runs on Postgres.\n")
    (root / "memory" / "2026-04-01.md").write_text("- the staging cluster is called vega\n")
    (root / "memory" / "zeta.md").write_text("- a topic sorted after the bad names\n")
    for name in BAD_NAMES:
        _make(root / "memory", name, "- kiwi in a file nobody can name\n")
    bad_dir = os.fsencode(root / "memory") + b"/d\xe9j\xe0"
    os.mkdir(bad_dir)
    _make(Path(os.fsdecode(bad_dir)), b"inside.md", "- kiwi inside a bad folder\n")
    return root


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon(Config.load(), embedder=FakeEmbedder()) as d:
        yield d


def test_discover_skips_and_reports_names_that_are_not_utf8(ws: Path) -> None:
    found = discover(ws)
    assert [f.rel for f in found.files] == ["MEMORY.md", "memory/2026-04-01.md", "memory/zeta.md"]
    skipped = dict(found.skipped)
    assert len(skipped) == len(BAD_NAMES) + 1
    assert "memory/caf\\xe9.md" in skipped and "memory/d\\xe9j\\xe0/" in skipped
    assert all("not valid UTF-8" in reason for reason in skipped.values())
    for shown in skipped:  # printable, and safe to send anywhere
        shown.encode("utf-8")
    # One such path from the watcher is left to a full scan, which reports it.
    assert memory_file(ws, os.fsdecode(b"memory/caf\xe9.md")) == ("rescan", None)


def test_reindex_search_and_status_keep_working(daemon: Daemon, ws: Path) -> None:
    with memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="agent")
        report = c.reindex("agent")["workspaces"][0]
        assert report["errors"] == [] and report["scanned"] == 3
        hits = c.search("agent", "staging cluster vega", mode="keyword")["results"]
        assert hits and hits[0]["path"] == "memory/2026-04-01.md"
        assert c.search("agent", "topic sorted after", mode="keyword")["results"]
        assert c.search("agent", "kiwi", mode="keyword")["results"] == []
        st = c.status("agent")["workspaces"][0]
        shown = {s["path"] for s in st["files_skipped"]}
        assert "memory/caf\\xe9.md" in shown
        fresh = c.search("agent", "vega", mode="keyword")["freshness"]
        # Not everything on disk is indexed, and the reply says so.
        assert fresh["skipped_files"] == len(BAD_NAMES) + 1 and fresh["fresh"] is False


def test_a_bad_name_made_while_the_daemon_watches(daemon: Daemon, tmp_path: Path) -> None:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "2026-04-01.md").write_text("- the staging cluster is called vega\n")
    with memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(root), name="agent")
        c.reindex("agent")
        _make(root / "memory", b"caf\xe9.md", "- kiwi\n")
        (root / "memory" / "2026-04-02.md").write_text("- lunch with orion\n")
        got = c.search("agent", "lunch orion", mode="keyword", wait_ms=5000)
        assert [h["path"] for h in got["results"]] == ["memory/2026-04-02.md"]
        assert got["freshness"]["skipped_files"] == 1
        assert c.search("agent", "vega", mode="keyword")["results"]


def test_a_transcript_whose_name_is_not_utf8(daemon: Daemon, ws: Path, tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    record = (
        '{"type": "message", "message": {"role": "user", '
        '"content": [{"type": "text", "text": "the ferry leaves at nine"}]}}\n'
    )
    (sessions / "good.jsonl").write_text(record)
    _make(sessions, b"s\xe9.jsonl", record)
    with memd_client.connect(daemon.socket_path, identity={"agent_id": "main"}) as c:
        c.workspace_add(str(ws), name="agent", sessions_dir=str(sessions), agent_id="main")
        assert c.reindex("agent")["workspaces"][0]["errors"] == []
        hits = c.search("agent", "ferry nine", mode="keyword")["results"]
        assert [h["path"] for h in hits] == ["sessions/good.jsonl"]
        assert c.search("agent", "vega", mode="keyword")["results"]
