"""Transcripts as a second source over the real socket: visibility, deltas, scopes, redaction."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd.config import Config, ScopeRule
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd_client.errors import PathRefused

from .daemon_fixture import running_daemon

KEY = "sk-proj-" + "Zq8" * 12


def message(role: str, text: str) -> str:
    return json.dumps({"type": "message", "message": {"role": role, "content": text}})


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(
        f"# Memory\n\nThe quarterly budget review happens in March.\nDeploy key: {KEY}\n"
    )
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    lines = [
        json.dumps({"type": "session", "id": "abc"}),
        message("user", "Can you remember that my cat is called Zebulon?"),
        "{not json",
        json.dumps(
            {
                "type": "message",
                "message": {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Noted: your cat Zebulon."},
                        {"type": "tool_use", "name": "memory_write", "input": {}},
                    ],
                },
            }
        ),
    ]
    (sessions / "abc.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def daemon(ws: Path) -> Iterator[Daemon]:
    config = Config.load(
        sessions__delta_messages=5,
        sessions__check_seconds=0.1,
        scopes=(ScopeRule(action="deny", chat_type="group", sources=("longterm",)),),
    )
    with running_daemon(config, embedder=FakeEmbedder()) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(ws, name="agent", sessions_dir=ws.parent / "sessions", agent_id="alice")
            c.reindex("agent")
        yield d


def as_(daemon: Daemon, **identity: str) -> memd_client.Client:
    return memd_client.connect(daemon.socket_path, identity=identity or None)


def test_transcript_hits_only_for_their_agent_with_jsonl_lines(daemon: Daemon) -> None:
    with as_(daemon, agent_id="alice") as c:
        hits = c.search("agent", "what is my cat called", mode="keyword")["results"]
        assert hits[0]["path"] == "sessions/abc.jsonl" and hits[0]["source"] == "sessions"
        assert (hits[0]["start_line"], hits[0]["end_line"]) == (2, 4)  # JSONL line numbers
        got = c.get("agent", "sessions/abc.jsonl", from_line=2, lines=1)
        assert json.loads(got["text"])["message"]["content"].endswith("Zebulon?")
    for identity in ({}, {"agent_id": "bob"}):
        with as_(daemon, **identity) as c:
            hits = c.search("agent", "what is my cat called", mode="keyword")["results"]
            assert all(h["source"] != "sessions" for h in hits), identity
            with pytest.raises(PathRefused):
                c.get("agent", "sessions/abc.jsonl")
    with as_(daemon, agent_id="alice") as c:  # the sources a caller asks for
        only_memory = c.search("agent", "cat Zebulon", sources="memory", mode="keyword")
        assert all(h["source"] == "memory" for h in only_memory["results"])
    with as_(daemon) as c:  # identity declared per connection with hello
        c.call("hello", agent_id="alice")
        hits = c.call("search", workspace="agent", query="cat Zebulon", mode="keyword")["results"]
        assert hits and hits[0]["source"] == "sessions"


def test_transcript_is_reindexed_after_the_message_delta(daemon: Daemon, ws: Path) -> None:
    transcript = ws.parent / "sessions" / "abc.jsonl"
    with as_(daemon, agent_id="alice") as c:
        with transcript.open("a") as f:
            for i in range(3):  # below the delta of 5 messages
                f.write(message("user", f"note {i}: the wifi password hint is kumquat") + "\n")
        time.sleep(1.0)
        assert not c.search("agent", "kumquat", mode="keyword")["results"]
        with transcript.open("a") as f:
            for i in range(2):
                f.write(message("assistant", f"ack {i}") + "\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            hits = c.search("agent", "kumquat", mode="keyword")["results"]
            if hits:
                break
            time.sleep(0.1)
        assert hits and hits[0]["path"] == "sessions/abc.jsonl"
        transcript.unlink()
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and c.search("agent", "Zebulon", mode="keyword", sources="sessions")["results"]
        ):
            time.sleep(0.1)
        assert not c.search("agent", "Zebulon", mode="keyword", sources="sessions")["results"]


def test_group_chats_do_not_see_long_term_memory(daemon: Daemon) -> None:
    direct = {"session_key": "agent:alice:slack:dm:u1"}
    group = {"session_key": "agent:alice:slack:group:c9"}
    with as_(daemon, **direct) as c:
        hits = c.search("agent", "quarterly budget review", mode="keyword")["results"]
        assert hits[0]["path"] == "MEMORY.md"
    with as_(daemon, **group) as c:
        hits = c.search("agent", "quarterly budget review", mode="keyword")["results"]
        assert all(h["path"] != "MEMORY.md" for h in hits)
        with pytest.raises(PathRefused):
            c.get("agent", "MEMORY.md")


def test_secrets_are_redacted_in_the_index_not_on_disk(daemon: Daemon, ws: Path) -> None:
    with as_(daemon) as c:
        hits = c.search("agent", "deploy key", mode="keyword")["results"]
        assert hits and KEY not in hits[0]["snippet"] and "[REDACTED]" in hits[0]["snippet"]
        status = c.status("agent")["workspaces"][0]
        assert status["sources"]["sessions"]["files"] == 1
    assert KEY in (ws / "MEMORY.md").read_text()
    home = Path(os.environ["MEMD_HOME"])
    for path in home.rglob("*.sqlite*"):
        assert KEY.encode() not in path.read_bytes(), path


def test_transcript_get_is_redacted(daemon: Daemon, ws: Path) -> None:
    """A transcript holds what tools printed: get returns it redacted, as search does."""
    transcript = ws.parent / "sessions" / "abc.jsonl"
    with transcript.open("a") as f:
        f.write(
            message("user", f"here is the key {KEY} and password = correct horse battery") + "\n"
        )
    total = len(transcript.read_text().splitlines())
    with as_(daemon, agent_id="alice") as c:
        got = c.get("agent", "sessions/abc.jsonl", from_line=total, lines=1)
    assert "Zq8Zq8" not in got["text"] and "horse battery" not in got["text"]
    assert "[REDACTED]" in got["text"]


def test_status_counts_transcripts_on_both_sides_and_reports_an_unreadable_one(
    daemon: Daemon, ws: Path
) -> None:
    from memd.ctl import display_status
    from memd.ctl.doctor.system import check_workspaces

    sessions = ws.parent / "sessions"
    (sessions / "other.jsonl").write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")
    with as_(daemon) as c:
        c.reindex("agent")
        status = c.status("agent")
        st = status["workspaces"][0]
        found = c.search("agent", "quarterly budget", wait_ms=2000)
    # MEMORY.md and one transcript indexed, of three files on disk (one unreadable)
    assert (st["files_indexed"], st["files_on_disk"]) == (2, 3)
    assert st["transcripts"] == {"on_disk": 2, "indexed": 1}
    assert st["files_skipped"] == [
        {"path": "sessions/other.jsonl", "reason": st["files_skipped"][0]["reason"]}
    ]
    assert "not a transcript memd reads" in st["files_skipped"][0]["reason"]
    assert st["dirty"] and st["freshness"]["skipped_files"] == 1
    assert not found["freshness"]["fresh"] and found["freshness"]["skipped_files"] == 1
    text = "\n".join(display_status.status_lines(status, time.time()))
    assert "Indexed: 2/3 files (1/2 transcripts)" in text
    assert "Skipped: sessions/other.jsonl (not a transcript memd reads" in text
    doctor = check_workspaces(status)
    assert doctor.status == "warn" and "sessions/other.jsonl" in doctor.detail
    (sessions / "other.jsonl").unlink()
    with as_(daemon) as c:
        c.reindex("agent")
        st = c.status("agent")["workspaces"][0]
    assert (st["files_indexed"], st["files_on_disk"], st["files_skipped"]) == (2, 2, [])
