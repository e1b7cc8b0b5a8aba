"""Promotion end to end over the socket: recalls on several days, memctl promote --apply, search."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.ctl.memctl import cli as memctl
from memd.embed.fake import FakeEmbedder
from memd.workspace import dreams_folder

from .daemon_fixture import running_daemon


class FakeTime:
    """The daemon's notion of now, moved by the test (recall days, recency, section dates)."""

    def __init__(self, when: datetime) -> None:
        self.when = when

    def __call__(self) -> datetime:
        return self.when


FACT = "- The VPN gateway password rotates every 90 days; the runbook lives in ops/vpn.md."


def test_recalled_daily_line_is_promoted_and_then_found_in_memory_md(tmp_path: Path) -> None:
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Long-Term Memory\n\nWritten by a human.\n")
    (ws / "memory" / "2026-03-30.md").write_text(f"# 2026-03-30\n\n{FACT}\n")
    (ws / "memory" / "2026-03-31.md").write_text("# 2026-03-31\n\n- lunch was pizza\n")
    clock = FakeTime(datetime(2026, 4, 1, 10, tzinfo=UTC))
    config = Config.load(timezone="UTC")
    with running_daemon(
        config, embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")
            queries = [
                (1, "vpn gateway password rotation"),
                (3, "how often does the VPN password rotate"),
                (5, "where is the vpn runbook"),
                (7, "vpn gateway policy"),
                (9, "VPN password rotates every 90 days"),
            ]
            for day, query in queries:
                clock.when = datetime(2026, 4, day, 10, tzinfo=UTC)
                hits = c.search("agent", query)["results"]
                assert hits and hits[0]["path"] == "memory/2026-03-30.md", query
            preview = c.promote("agent")
            assert [x["path"] for x in preview["candidates"]] == ["memory/2026-03-30.md"]
            candidate = preview["candidates"][0]
            assert candidate["recall_count"] == 5 and candidate["unique_queries"] == 5
            assert candidate["score"] >= 0.75
            explained = c.promote("agent", explain=candidate["key"])["explain"]
            assert explained["passes_thresholds"]
            assert set(explained["components"]) >= {
                "frequency",
                "relevance",
                "diversity",
                "recency",
                "consolidation",
                "conceptual",
            }

        run = CliRunner().invoke(
            memctl,
            ["--socket", str(daemon.socket_path), "promote", "-w", "agent", "--apply", "--json"],
        )
        assert run.exit_code == 0, run.output
        applied = json.loads(run.output)["applied"]
        assert [a["path"] for a in applied] == ["memory/2026-03-30.md"]

        memory = (ws / "MEMORY.md").read_text()
        assert memory.startswith("# Long-Term Memory\n\nWritten by a human.\n")
        assert "## Promoted From Short-Term Memory (2026-04-09)" in memory
        assert FACT.lstrip("- ") in memory
        assert memory.count("<!-- memd-promotion:") == 1

        with memd_client.connect(daemon.socket_path) as c:
            hits = c.search("agent", "VPN gateway password rotation", mode="keyword")["results"]
            assert "MEMORY.md" in [h["path"] for h in hits]
            again = c.promote("agent", apply=True)
            assert again["applied"] == [] and again["candidates"] == []  # promoted once only
            status = c.status("agent")["workspaces"][0]["dreaming"]
            assert status["recall_store"]["promoted"] == 1
        assert (ws / "MEMORY.md").read_text() == memory


def test_a_missed_scheduled_run_happens_once_at_the_next_start(tmp_path: Path) -> None:
    """The daemon was down at 03:00 for days: at start it promotes once, not once per slot."""
    from memd.dreams.recall_store import RecallStore
    from memd.dreams.schedule import Schedule

    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-30.md").write_text(f"# 2026-03-30\n\n{FACT}\n")
    clock = FakeTime(datetime(2026, 4, 1, 10, tzinfo=UTC))
    store = RecallStore(ws, clock=Clock("UTC", source=clock))
    hit = {"path": "memory/2026-03-30.md", "start_line": 3, "end_line": 3, "score": 0.9}
    for day in (1, 3, 5, 7, 9):
        clock.when = datetime(2026, 4, day, 10, tzinfo=UTC)
        store.record(f"question number {day} about the vpn", [hit])
    from memd.config import WorkspaceConfig

    config = Config.load(
        timezone="UTC",
        dreaming__enabled=True,
        workspaces=(WorkspaceConfig(path=str(ws), name="agent"),),
    )
    state = config.state_dir / "dreaming.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    # memd last ran its schedule three days (three 03:00 slots) ago.
    Schedule(
        "0 3 * * *", state_path=state, clock=Clock.at(datetime(2026, 4, 6, 4, tzinfo=UTC), "UTC")
    ).mark_ran()
    with running_daemon(
        config, embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as daemon:
        deadline = time.monotonic() + 15  # the main loop checks the schedule right at start
        while "<!-- memd-promotion:" not in _read(ws / "MEMORY.md") and time.monotonic() < deadline:
            time.sleep(0.05)
        text = _read(ws / "MEMORY.md")
        assert text.count("## Promoted From Short-Term Memory (2026-04-09)") == 1
        assert daemon.parts is not None
        daemon._maybe_dream(daemon.parts)  # not due again until the next 03:00
        assert _read(ws / "MEMORY.md") == text
        with memd_client.connect(daemon.socket_path) as c:
            nxt = c.status("agent")["workspaces"][0]["dreaming"]["next_run"]
        assert nxt == "2026-04-10T03:00:00+00:00"


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_memctl_dream_previews_then_writes_and_status_shows_each_phase(tmp_path: Path) -> None:
    """Over the socket: a preview writes nothing; --apply promotes a lasting fact nobody searched
    for, writes the diary, and both are searchable when the reply comes; status shows the runs."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-04-01.md").write_text(
        "# 2026-04-01\n\n- Ben is allergic to peanuts.\n- Lunch was pizza.\n"
    )
    clock = FakeTime(datetime(2026, 4, 2, 3, tzinfo=UTC))
    with running_daemon(
        Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")

        def memctl_run(*args: str) -> str:
            run = CliRunner().invoke(memctl, ["--socket", str(d.socket_path), *args])
            assert run.exit_code == 0, run.output
            return run.output

        preview = memctl_run("dream", "-w", "agent")
        assert preview.startswith("Preview: nothing written")
        assert "- Ben is allergic to peanuts. [lasting: an allergy" in preview
        assert not (ws / "DREAMS.md").exists() and not (ws / "memory" / ".dreams").exists()

        applied = json.loads(memctl_run("dream", "-w", "agent", "--apply", "--json"))
        assert [a["path"] for a in applied["deep"]["applied"]] == ["memory/2026-04-01.md"]
        assert applied["written"] == ["DREAMS.md", "MEMORY.md"]
        assert "- Ben is allergic to peanuts. [" in (ws / "MEMORY.md").read_text()
        with memd_client.connect(d.socket_path) as c:
            paths = {h["path"] for h in c.search("agent", "peanuts", mode="keyword")["results"]}
            # The diary is for people to read and stays out of search (`[index] diary = false`).
            assert {"MEMORY.md", "memory/2026-04-01.md"} <= paths and "DREAMS.md" not in paths
            runs = c.status("agent")["workspaces"][0]["dreaming"]["last_runs"]
            assert set(runs) == {"light", "rem", "deep"} and runs["deep"]["promoted"] == 1
            with pytest.raises(memd_client.BadRequest, match="phase must be"):
                c.dream("agent", phase="nap")
        status = memctl_run("status", "-w", "agent")
        assert "Dreaming deep: 2026-04-02T03:00:00.000Z · 1 promoted" in status
        assert "Dreaming rem: " in status and "1 lasting" in status
        explained = memctl_run(
            "promote", "-w", "agent", "--explain", "memory:memory/2026-04-01.md:3:3"
        )
        assert 'lasting: an allergy ("allergic") (passes without recall statistics)' in explained
        light = json.loads(memctl_run("dream", "-w", "agent", "--phase", "light", "--json"))
        assert set(light) >= {"light"} and "rem" not in light and "deep" not in light


def test_dreaming_reads_the_agents_transcripts(tmp_path: Path) -> None:
    """A workspace with transcripts: Light reads their new messages (redacted, as the index
    holds them) into the session corpus, and a lasting one reaches MEMORY.md."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    key = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"

    def record(role: str, text: str) -> str:
        return json.dumps(
            {
                "type": "message",
                "timestamp": "2026-04-01T09:00:00Z",
                "message": {"role": role, "content": [{"type": "text", "text": text}]},
            }
        )

    (sessions / "s1.jsonl").write_text(
        "\n".join(
            [
                json.dumps({"type": "session", "id": "s1"}),
                record("user", "Remember: I am allergic to shellfish."),
                record("user", f"My deploy token is {key} for the record."),
                record("assistant", "Noted."),
            ]
        )
        + "\n"
    )
    (sessions / "s1.checkpoint.1.jsonl").write_text(
        record("user", "Never seen by dreaming.") + "\n"
    )
    clock = FakeTime(datetime(2026, 4, 2, 3, tzinfo=UTC))
    with running_daemon(
        Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent", sessions_dir=str(sessions), agent_id="main")
            c.reindex("agent")
            run = c.dream("agent", apply=True)
    assert run["light"]["messages_read"] == 2  # "Noted." is too short; the checkpoint skipped
    # in memd's private state, not in the workspace (memd/dreams/place.py)
    assert not (ws / "memory" / ".dreams").exists()
    folder = dreams_folder(Config.load(), ws.resolve())
    corpus = (folder / "session-corpus" / "2026-04-01.txt").read_text()
    assert corpus.startswith("User: Remember: I am allergic to shellfish.\n")
    assert key not in corpus and "Never seen" not in corpus
    assert "- User: Remember: I am allergic to shellfish. [" in (ws / "MEMORY.md").read_text()
