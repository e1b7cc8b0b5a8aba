"""Dreaming where it meets the other features, over a real daemon's socket: transcript text
stays with its agent, a search leaves the workspace as it was, a claim is promoted once and as
the line that earned it, a preview says what a run would write, and what dreaming writes is
redacted."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.ctl.memctl import cli as memctl
from memd.dreams.recall_store import RecallStore
from memd.embed.fake import FakeEmbedder

from .daemon_fixture import running_daemon


class FakeTime:
    def __init__(self, when: datetime) -> None:
        self.when = when

    def __call__(self) -> datetime:
        return self.when


def _record(role: str, text: str, at: str = "2026-04-01T09:00:00Z") -> str:
    return json.dumps(
        {
            "type": "message",
            "timestamp": at,
            "message": {"role": role, "content": [{"type": "text", "text": text}]},
        }
    )


def _files(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _memctl(socket: Path, *args: str) -> tuple[int, str]:
    run = CliRunner().invoke(memctl, ["--socket", str(socket), *args])
    return run.exit_code, run.output


def test_transcript_lines_reach_only_their_own_agent(tmp_path: Path) -> None:
    """A line Light took from a transcript is staged, but DREAMS.md does not quote it, and no
    caller but the transcript's own agent finds it: not by search, get or a dream preview."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-04-01.md").write_text("# Notes\n\n- Deployed the billing service.\n")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "s1.jsonl").write_text(
        "\n".join(
            [
                json.dumps({"type": "session", "id": "s1"}),
                _record("user", "We argued about the Quillfeather rollout plan for a while."),
                _record("assistant", "The Quillfeather plan now has three stages."),
            ]
        )
        + "\n"
    )
    clock = FakeTime(datetime(2026, 4, 2, 3, tzinfo=UTC))
    with running_daemon(
        Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as d:
        with memd_client.connect(d.socket_path, identity={"agent_id": "main"}) as c:
            c.workspace_add(str(ws), name="agent", sessions_dir=str(sessions), agent_id="main")
            c.reindex("agent")
            run = c.dream("agent", apply=True)
            staged = [g["snippet"] for g in run["light"]["staged"]]
            assert any("Quillfeather" in s for s in staged)  # the owner sees what was staged
            c.reindex("agent")
            assert "withheld_from_transcripts" not in c.dream("agent")
        strangers = [None, {"agent_id": "other"}, {"agent_id": "other", "chat_type": "direct"}]
        for who in strangers:
            with memd_client.connect(d.socket_path, identity=who) as c:
                preview = c.dream("agent")
                assert "Quillfeather" not in json.dumps(preview), who
                assert preview["withheld_from_transcripts"] > 0
                found = c.search("agent", "Quillfeather rollout", wait_ms=2000)
                assert "Quillfeather" not in json.dumps(found["results"]), who
                diary = c.get("agent", "DREAMS.md")
                assert "Quillfeather" not in diary["text"], who
                assert "Quillfeather" not in json.dumps(c.promote("agent"))
    diary = (ws / "DREAMS.md").read_text()
    assert "Quillfeather" not in diary
    assert "from session transcripts, not shown here" in diary
    assert "Deployed the billing service" in diary  # notes are quoted as before


def test_a_search_leaves_the_workspace_as_it_was(tmp_path: Path) -> None:
    """Recalls are counted in memd's state: a git-tracked memory folder stays clean."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-04-01.md").write_text("- The staging cluster is called vega.\n")
    (ws / "MEMORY.md").write_text("# Long-Term Memory\n\n- Production runs Postgres 16.\n")
    before = _files(ws)
    config = Config.load(timezone="UTC")
    with running_daemon(config, embedder=FakeEmbedder()) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            for query in ("staging cluster name", "what is staging called", "postgres version"):
                assert c.search("agent", query, wait_ms=5000)["results"]
            c.promote("agent")  # waits until the recalls are written
            status = c.status("agent")["workspaces"][0]["dreaming"]["recall_store"]
            assert status["entries"] >= 1
    assert _files(ws) == before
    from memd.workspace import dreams_folder

    store = RecallStore(ws, folder=dreams_folder(config, ws.resolve()))
    assert any("vega" in e.snippet for e in store.load().values())


def test_dreaming_files_left_in_the_workspace_move_into_memds_state(tmp_path: Path) -> None:
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    note = "- The staging cluster is called vega.\n"
    (ws / "memory" / "2026-04-01.md").write_text(note)
    old = RecallStore(ws)  # where an earlier memd kept it: memory/.dreams/
    hit = {"path": "memory/2026-04-01.md", "start_line": 1, "end_line": 1, "score": 0.9}
    assert old.record("staging name", [hit]) == 1
    assert (ws / "memory" / ".dreams" / "short-term-recall.json").is_file()
    config = Config.load(timezone="UTC")
    with running_daemon(config, embedder=FakeEmbedder()) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            status = c.status("agent")["workspaces"][0]["dreaming"]["recall_store"]
            assert status["entries"] == 1
    assert not (ws / "memory" / ".dreams").exists()
    from memd.workspace import dreams_folder

    folder = dreams_folder(config, ws.resolve())
    assert (folder / "short-term-recall.json").is_file()
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


CAT_NOTE = "# 2026-03-29\n\n- User's cat is called Miso.\n- Deployed v2.3.1 to staging.\n"


def test_a_recalled_chunk_promotes_the_line_that_earned_it_once(tmp_path: Path) -> None:
    """Searches about the cat recall a chunk holding a heading and an unrelated line: what
    reaches MEMORY.md is the cat's line as a clean bullet, once, and the run that promotes it
    does not also hold it back."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-29.md").write_text(CAT_NOTE)
    clock = FakeTime(datetime(2026, 3, 30, 10, tzinfo=UTC))
    with running_daemon(
        Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")
            for day, query in enumerate(
                ["what is the cat called", "cat name", "user's cat", "miso the cat", "cat"], 1
            ):
                clock.when = datetime(2026, 3, 29, 10, tzinfo=UTC) + timedelta(days=day)
                assert c.search("agent", query)["results"], query
            preview = c.dream("agent")
            would = {a["key"] for a in preview["deep"].get("would_apply", [])}
            code, text = _memctl(d.socket_path, "dream", "-w", "agent")
            assert code == 0 and "Would promote into MEMORY.md:" in text, text
            run = c.dream("agent", apply=True)
            applied = {a["key"] for a in run["deep"]["applied"]}
            assert applied and applied == would  # the preview said what the run wrote
            held = {h["key"] for h in run["deep"]["held_back"]}
            assert not held & applied
            assert not any("Miso" in h["snippet"] for h in run["deep"]["held_back"])
            again = c.dream("agent", apply=True)
            assert again["deep"]["applied"] == []
    memory = (ws / "MEMORY.md").read_text()
    bullets = [line for line in memory.splitlines() if line.startswith("- ")]
    assert len([b for b in bullets if "Miso" in b]) == 1, memory
    (bullet,) = [b for b in bullets if "Miso" in b]
    assert bullet.startswith("- User's cat is called Miso. [score=")
    assert "#" not in bullet.split("[score=")[0] and "Deployed" not in bullet


def test_memctl_promote_lists_the_keys_explain_takes(tmp_path: Path) -> None:
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-03-29.md").write_text(CAT_NOTE)
    clock = FakeTime(datetime(2026, 3, 30, 10, tzinfo=UTC))
    with running_daemon(
        Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")
            for day, query in enumerate(["cat name", "the cat", "cat called", "user cat"], 1):
                clock.when = datetime(2026, 3, 29, 10, tzinfo=UTC) + timedelta(days=day)
                # Each search waits for the vectors: a keyword-only answer while they were
                # pending (a loaded machine) scores the recall lower than the promotion needs.
                c.search("agent", query, wait_ms=10_000)
            key = c.promote("agent")["candidates"][0]["key"]
        code, text = _memctl(d.socket_path, "promote", "-w", "agent")
        assert code == 0 and f"key {key}" in text, text
        code, text = _memctl(d.socket_path, "promote", "-w", "agent", "--explain", key)
        assert code == 0 and text.startswith(f"{key}: score"), text
        code, text = _memctl(d.socket_path, "promote", "-w", "agent", "--explain", "no-such-key")
        assert code == 1 and "No entry 'no-such-key'" in text, text
        code, text = _memctl(d.socket_path, "promote", "-w", "agent", "--explain", "x", "--json")
        assert code == 1 and json.loads(text)["explain"] is None


TOKEN = "ghp_" + "Zq8Lm2Xv7Rt4Pw9Kc3Hn6Bd1Fy5Gj0Sa2Eu8"


def test_what_dreaming_writes_and_shows_is_redacted(tmp_path: Path) -> None:
    """A lasting fact holding a token is promoted without it, and neither DREAMS.md nor a
    preview shows it (the note on disk keeps it: memd never edits a note)."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    note = f"# Ops\n\n- Always deploy with the token {TOKEN} from the vault.\n"
    (ws / "memory" / "2026-04-01.md").write_text(note)
    clock = FakeTime(datetime(2026, 4, 1, 20, tzinfo=UTC))
    with running_daemon(
        Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)
    ) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")
            preview = c.dream("agent")
            assert TOKEN not in json.dumps(preview)
            run = c.dream("agent", apply=True)
            assert run["deep"]["applied"], run["deep"]
            assert TOKEN not in json.dumps(run)
    memory = (ws / "MEMORY.md").read_text()
    assert "Always deploy with the token ghp_" in memory and TOKEN not in memory
    assert TOKEN not in (ws / "DREAMS.md").read_text()
    assert (ws / "memory" / "2026-04-01.md").read_text() == note


def test_the_diary_is_for_reading_not_searching(tmp_path: Path) -> None:
    """DREAMS.md quotes the notes it comes from: searching it put two diary entries above the
    note they quote. A search for a fact finds its note; `get` still reads the diary, and
    [index] diary = true makes it searchable."""
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    note = "- Always call the staging cluster vega, never orion.\n"
    (ws / "memory" / "2026-04-01.md").write_text(note)
    clock = FakeTime(datetime(2026, 4, 1, 20, tzinfo=UTC))
    for diary in (False, True):
        (ws / "DREAMS.md").unlink(missing_ok=True)
        config = Config.load(timezone="UTC", index__diary=diary)
        with running_daemon(config, embedder=FakeEmbedder(), clock=Clock("UTC", source=clock)) as d:
            with memd_client.connect(d.socket_path) as c:
                c.workspace_add(str(ws), name="agent")
                c.reindex("agent")
                c.dream("agent", apply=True)
                c.reindex("agent")
                hits = c.search("agent", "staging cluster name", wait_ms=2000)["results"]
                paths = [h["path"] for h in hits]
                assert paths[0] == "memory/2026-04-01.md", paths
                assert ("DREAMS.md" in paths) == diary, paths
                assert "vega" in c.get("agent", "DREAMS.md")["text"]
                status = c.status("agent")["workspaces"][0]
                assert status["freshness"]["fresh"], status["freshness"]
