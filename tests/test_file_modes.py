"""What memd creates in a user's workspace gets the modes the user's own files have (those of
the folder it is made in), although the daemon's umask keeps its own state private."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.daemon import Daemon
from memd.dreams.sharedfile import append_text
from memd.embed.fake import FakeEmbedder

from .daemon_fixture import running_daemon

NOW = datetime(2026, 4, 2, 12, 0, tzinfo=UTC)
TODAY = "memory/2026-04-02.md"


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    config = Config.load(timezone="UTC")
    with running_daemon(config, embedder=FakeEmbedder(), clock=Clock.at(NOW, "UTC")) as d:
        yield d


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(
    ("root_mode", "folder_mode", "file_mode"),
    [
        (0o755, 0o755, 0o644),
        (0o750, 0o750, 0o640),
        (0o775 | stat.S_ISGID, 0o775 | stat.S_ISGID, 0o664),  # a folder shared with a group
        (0o700, 0o700, 0o600),
    ],
)
def test_append_makes_memory_and_the_daily_log_as_the_workspace_folder_says(
    daemon: Daemon, tmp_path: Path, root_mode: int, folder_mode: int, file_mode: int
) -> None:
    root = tmp_path / "agent"
    root.mkdir()
    (root / "MEMORY.md").write_text("# Memory\n")
    os.chmod(root, root_mode)
    with memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(root), name="agent")
        assert c.append("agent", "Decided: ship on Friday.")["path"] == TODAY
    assert oct(_mode(root / "memory")) == oct(folder_mode)
    assert oct(_mode(root / TODAY)) == oct(file_mode)
    # memd's own state stays private whatever the workspace's modes.
    state = [p for p in Path(os.environ["MEMD_HOME"]).rglob("*") if not p.is_symlink()]
    assert state and all(_mode(p) & 0o077 == 0 for p in state)


def test_a_log_in_an_existing_memory_folder_follows_that_folder(
    daemon: Daemon, tmp_path: Path
) -> None:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    os.chmod(root, 0o755)
    os.chmod(root / "memory", 0o750)
    with memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(root), name="agent")
        c.append("agent", "one")
    assert oct(_mode(root / TODAY)) == oct(0o640)
    os.chmod(root / TODAY, 0o600)  # the user's choice for an existing file is kept
    with memd_client.connect(daemon.socket_path) as c:
        c.append("agent", "two")
    assert oct(_mode(root / TODAY)) == oct(0o600)


def test_dreams_md_and_memory_md_are_made_as_the_workspace_folder_says(tmp_path: Path) -> None:
    """DREAMS.md and MEMORY.md are appended to through sharedfile.append_text; under the
    daemon's umask they were 0600 in a 0755 workspace."""
    root = tmp_path / "agent"
    root.mkdir()
    os.chmod(root, 0o755)
    old = os.umask(0o077)
    try:
        append_text(root / "DREAMS.md", "entry\n", header="# Dreams\n")
        append_text(root / "MEMORY.md", "fact\n")
    finally:
        os.umask(old)
    assert oct(_mode(root / "DREAMS.md")) == oct(0o644)
    assert oct(_mode(root / "MEMORY.md")) == oct(0o644)
    assert (root / "DREAMS.md").read_text() == "# Dreams\nentry\n"
