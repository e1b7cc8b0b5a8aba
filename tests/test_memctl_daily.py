"""memctl in daily use, through a real daemon: re-adding a workspace with new settings, showing
them, --json everywhere it matters (errors included), NO_COLOR and -h."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import memd_client
from memd.ctl.memctl import EXIT_NOT_RUNNING, cli
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd_client.errors import UnknownWorkspace

from .daemon_fixture import running_daemon, short_socket_dir


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    return root


@pytest.fixture
def sessions(tmp_path: Path) -> Path:
    folder = tmp_path / "sessions"
    folder.mkdir()
    line = {"type": "message", "message": {"role": "user", "content": "my cat is Zebulon"}}
    (folder / "abc.jsonl").write_text(
        json.dumps({"type": "session"}) + "\n" + json.dumps(line) + "\n"
    )
    return folder


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon(embedder=FakeEmbedder()) as d:
        yield d


def memctl(daemon: Daemon, *args: str, **kw: object) -> Result:
    return CliRunner().invoke(cli, ["--socket", str(daemon.socket_path), *args], **kw)  # type: ignore[arg-type]


def test_adding_again_with_new_settings_updates_them(
    daemon: Daemon, ws: Path, sessions: Path
) -> None:
    first = memctl(daemon, "workspace", "add", str(ws), "--name", "agent")
    assert first.exit_code == 0 and first.output.startswith("Added agent: "), first.output
    same = memctl(daemon, "workspace", "add", str(ws))
    assert "agent is registered with these settings already" in same.output
    # The README's walk-through adds the transcripts this way: they must become searchable.
    again = memctl(
        daemon,
        "workspace",
        "add",
        str(ws),
        "--sessions-dir",
        str(sessions),
        "--sessions-agent",
        "main",
    )
    assert again.exit_code == 0, again.output
    assert again.output.startswith("Updated agent: sessions_dir, agent_id"), again.output
    found = memctl(
        daemon,
        "--agent-id",
        "main",
        "search",
        "Zebulon",
        "-w",
        "agent",
        "--wait-ms",
        "10000",
        "--json",
    )
    hits = json.loads(found.stdout)["results"]
    assert hits and hits[0]["path"] == "sessions/abc.jsonl", found.output
    shown = memctl(daemon, "workspace", "show", "agent")
    assert shown.exit_code == 0
    assert f"sessions: {sessions.resolve()} (agent main)" in shown.output, shown.output
    as_json = json.loads(memctl(daemon, "workspace", "show", str(ws), "--json").stdout)
    assert as_json["name"] == "agent" and as_json["sessions_dir"] == str(sessions.resolve())
    renamed = json.loads(
        memctl(daemon, "workspace", "add", str(ws), "--name", "main", "--json").stdout
    )
    assert renamed["name"] == "main" and renamed["updated"] == ["name"] and not renamed["added"]
    missing = memctl(daemon, "workspace", "show", "nope", "--json")
    assert missing.exit_code == 1
    assert json.loads(missing.stdout)["error"]["kind"] == "UNKNOWN_WORKSPACE"


def test_json_for_append_and_errors(daemon: Daemon, ws: Path) -> None:
    memctl(daemon, "workspace", "add", str(ws), "--name", "agent")
    appended = memctl(daemon, "append", "The deploy freeze starts Friday", "-w", "agent", "--json")
    assert appended.exit_code == 0, appended.output
    result = json.loads(appended.stdout)
    assert result["path"].startswith("memory/") and result["written"] is True
    bad = memctl(daemon, "search", "x", "-w", "nope", "--json")
    assert bad.exit_code == 1
    error = json.loads(bad.stdout)["error"]
    assert (
        error["code"] == 4 and error["kind"] == "UNKNOWN_WORKSPACE" and "nope" in error["message"]
    )
    gone = memctl(daemon, "get", "memory/1999-01-01.md", "-w", "agent", "--json")
    assert gone.exit_code == 1 and json.loads(gone.stdout)["missing"] is True
    assert memctl(daemon, "get", "memory/1999-01-01.md", "-w", "agent").exit_code == 1


def test_not_running_is_json_too() -> None:
    directory = short_socket_dir()
    result = CliRunner().invoke(cli, ["--socket", str(directory / "memd.sock"), "status", "--json"])
    assert result.exit_code == EXIT_NOT_RUNNING
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "NOT_RUNNING" and "memd run" in error["message"]


def test_no_color_and_short_help(daemon: Daemon, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memctl(daemon, "workspace", "add", str(ws), "--name", "agent")
    coloured = memctl(daemon, "status", color=True)
    assert "\x1b[" in coloured.output  # the workspace name is coloured on a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    plain = memctl(daemon, "status", color=True)
    assert plain.exit_code == 0 and "\x1b[" not in plain.output, plain.output
    for args in (["-h"], ["search", "-h"], ["workspace", "add", "-h"]):
        shown = CliRunner().invoke(cli, args)
        assert shown.exit_code == 0 and shown.output.startswith("Usage: "), args
    # One meaning per option: --agent-id is who is asking, for memctl and its MCP server alike;
    # the owner of a workspace's transcripts is --sessions-agent.
    assert "--agent-id" in CliRunner().invoke(cli, ["mcp", "-h"]).output
    add_help = CliRunner().invoke(cli, ["workspace", "add", "-h"]).output
    assert "--sessions-agent" in add_help and "--agent-id" not in add_help


def test_a_workspace_is_a_name_first_then_a_path_in_any_form(
    daemon: Daemon, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memctl(daemon, "workspace", "add", str(ws), "--name", "main")
    monkeypatch.chdir(ws.parent)
    monkeypatch.setenv("HOME", str(ws.parent))
    # The directory is called "agent" but registered as "main": -w agent finds it as a path.
    for ref in ("agent", "./agent", "~/agent", str(ws)):
        found = memctl(daemon, "search", "Orion", "-w", ref, "--json")
        assert found.exit_code == 0, (ref, found.output)
        assert json.loads(found.stdout)["results"][0]["path"] == "MEMORY.md", ref
    with memd_client.connect(daemon.socket_path) as c:
        for ref in ("main", "agent", "./agent", "~/agent", ws, Path("agent")):
            assert c.search(ref, "Orion")["results"][0]["path"] == "MEMORY.md", ref
        # A name wins over a directory of that name; nothing else is guessed.
        (ws.parent / "main").mkdir()
        assert c.search("main", "Orion")["results"], "the registered name, not ./main"
        with pytest.raises(UnknownWorkspace):
            c.search("nope", "Orion")
        with pytest.raises(UnknownWorkspace):
            c.search("./main", "Orion")  # written as a path: the directory, not registered


def test_search_shows_the_lines_that_matched(daemon: Daemon, ws: Path) -> None:
    lines = [
        f"- {i:02d}: routine standup notes about nothing in particular today" for i in range(40)
    ]
    lines[31] = "- 31: the VPN gateway password rotates every ninety days"
    (ws / "memory" / "2026-03-01.md").write_text("\n".join(lines) + "\n")
    memctl(daemon, "workspace", "add", str(ws), "--name", "agent")
    found = memctl(daemon, "search", "gateway password", "-w", "agent", "--wait-ms", "5000")
    assert found.exit_code == 0, found.output
    assert "  32 \u203a - 31: the VPN gateway password rotates every ninety days" in found.output


def test_status_names_the_shared_provider_once(daemon: Daemon, ws: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    memctl(daemon, "workspace", "add", str(ws), "--name", "agent")
    memctl(daemon, "workspace", "add", str(other), "--name", "other")
    shown = memctl(daemon, "status").output
    assert shown.count("Provider: fake") == 1, shown
    assert shown.index("Provider: fake") < shown.index("agent (")
