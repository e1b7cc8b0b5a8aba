"""A file system's root, a system directory, a pseudo file system or the home directory is
never walked: not as a workspace, an extra path or a transcript folder, whether it comes from
a request, memctl, the config file or a registry an older memd wrote."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import memd_client
from memd.config import Config
from memd.ctl.memctl import cli as memctl
from memd_client.errors import BadRequest, ConfigError

from .daemon_fixture import running_daemon


def make_ws(root: Path) -> Path:
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    return root


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory of its own, holding the workspace (as an agent's folder usually is)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def broad_extra_paths(home: Path, ws: Path) -> dict[str, str]:
    """Extra paths that would each have memd walk far more than notes: spelt as a user might."""
    (home / "to-root").symlink_to("/")
    return {
        "the root": "/",
        "a system directory": "/usr",
        "one reached through a symlink": str(home / "to-root"),
        "a climb from the workspace": "../" * (len(ws.parts) + 2),
        "a pseudo file system": "/proc/self",
        "the home directory": "~",
        "a parent of the home directory": str(home.parent),
    }


def test_requests_refuse_broad_extra_paths_and_roots(home: Path) -> None:
    ws = make_ws(home / "agent")
    with running_daemon(Config.load()) as daemon, memd_client.connect(daemon.socket_path) as c:
        for what, extra in broad_extra_paths(home, ws).items():
            with pytest.raises(BadRequest, match="cannot be an extra path") as err:
                c.workspace_add(str(ws), name="agent", extra_paths=[extra])
            assert "(name a folder of notes instead)" in str(err.value), what
        for root in ("/", "/usr", "/etc", "/proc/self", "/tmp"):
            with pytest.raises(BadRequest, match="cannot be a workspace"):
                c.workspace_add(root)
        with pytest.raises(BadRequest, match="cannot be a transcript folder"):
            c.workspace_add(str(ws), name="agent", sessions_dir="/")
        assert c.status()["workspaces"] == []
        # A workspace already registered keeps its settings when a change would walk "/".
        notes = home / "notes"
        notes.mkdir()
        c.workspace_add(str(ws), name="agent", extra_paths=[str(notes)])
        with pytest.raises(BadRequest, match="root of the file system"):
            c.workspace_add(str(ws), extra_paths=["/"])
        (entry,) = c.call("workspace_list")["workspaces"]
        assert entry["extra_paths"] == [str(notes)]
        assert c.status("agent")["workspaces"][0]["files_on_disk"] == 1


def test_memctl_refuses_a_root_extra_path(home: Path) -> None:
    ws = make_ws(home / "agent")
    with running_daemon(Config.load()) as daemon:
        run = CliRunner().invoke(
            memctl,
            ["--socket", str(daemon.socket_path), "workspace", "add", str(ws), "--extra", "/"],
        )
        assert run.exit_code == 1, run.output
        assert "'/' cannot be an extra path: it is the root of the file system" in run.output
        with memd_client.connect(daemon.socket_path) as c:
            assert c.status()["workspaces"] == []


def test_the_config_file_refuses_broad_extra_paths(home: Path, tmp_path: Path) -> None:
    ws = make_ws(home / "agent")
    file = tmp_path / "config.toml"
    for what, extra in broad_extra_paths(home, ws).items():
        file.write_text(f"[[workspaces]]\npath = {str(ws)!r}\nextra_paths = [{extra!r}]\n")
        with pytest.raises(ConfigError, match="cannot be an extra path") as err:
            Config.load(file)
        assert str(file) in str(err.value), what
    file.write_text(f"[[workspaces]]\npath = {str(ws)!r}\nextra_paths = ['notes', '~/more']\n")
    assert Config.load(file).workspaces[0].extra_paths == ("notes", "~/more")


def test_a_registry_entry_with_a_root_extra_path_opens_without_it(
    home: Path, memd_log: pytest.LogCaptureFixture
) -> None:
    """A registry written by a memd that allowed "/" as an extra path: the workspace is served,
    the extra path is left out with a warning (every status would walk the whole disk)."""
    ws = make_ws(home / "agent")
    notes = home / "notes"
    notes.mkdir()
    (notes / "n.md").write_text("A note.\n")
    config = Config.load()
    config.state_dir.mkdir(parents=True, exist_ok=True)
    entry = {"path": str(ws), "name": "agent", "extra_paths": ["/", str(notes)]}
    (config.state_dir / "workspaces.json").write_text(
        json.dumps({"version": 1, "workspaces": [entry]})
    )
    with running_daemon(config) as daemon, memd_client.connect(daemon.socket_path) as c:
        (listed,) = c.call("workspace_list")["workspaces"]
        assert listed["extra_paths"] == [str(notes)]
        assert c.status("agent")["workspaces"][0]["files_on_disk"] == 2
    warned = [r for r in memd_log.records if r.levelno == logging.WARNING and "'/'" in r.message]
    assert warned and "too broad" in warned[0].message


def test_a_folder_of_notes_outside_the_home_is_fine(tmp_path: Path, home: Path) -> None:
    ws = make_ws(home / "agent")
    notes = tmp_path / "shared-notes"
    notes.mkdir()
    (notes / "a.md").write_text("Shared.\n")
    with running_daemon(Config.load()) as daemon, memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="agent", extra_paths=[str(notes), "memory"])
        assert c.status("agent")["workspaces"][0]["files_on_disk"] == 2
    assert os.path.isdir(notes)
