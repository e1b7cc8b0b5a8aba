"""Long-term memory by what a file is: hard links and bind mounts of MEMORY.md are MEMORY.md.

Real hard links (os.link), real symlinks, a real daemon on its socket, and (where the kernel
lets an unprivileged user make a mount namespace) a real bind mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd.markdown.discover import discover, memory_file
from memd.markdown.read import locate
from memd_client.errors import PathRefused

from .daemon_fixture import running_daemon

NOW = datetime(2026, 4, 2, 12, 0, tzinfo=UTC)
TODAY, YESTERDAY = "memory/2026-04-02.md", "memory/2026-04-01.md"
SECRET = "The vault combination is zebra-4815."
GROUP = {"session_key": "agent:main:telegram:group:42"}
DIRECT = {"session_key": "agent:main:telegram:dm:7"}
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(f"# Memory\n\n{SECRET}\n")
    (root / YESTERDAY).write_text("- booked the dentist for Friday\n")
    return root


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    config = Config.load(timezone="UTC")
    with running_daemon(config, embedder=FakeEmbedder(), clock=Clock.at(NOW, "UTC")) as d:
        yield d


def _add(daemon: Daemon, ws: Path) -> None:
    with memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="agent")
        c.reindex("agent")


def _group_sees_secret(daemon: Daemon, paths: list[str]) -> list[str]:
    """Every way a group chat could read long-term memory: get of each path, search, context."""
    leaks = []
    with memd_client.connect(daemon.socket_path, identity=GROUP) as g:
        for path in paths:
            try:
                if SECRET in g.get("agent", path)["text"]:
                    leaks.append(f"get {path}")
            except PathRefused:
                pass
        found = g.search("agent", "vault combination zebra", mode="keyword", wait_ms=5000)
        leaks += [f"search {r['path']}" for r in found["results"] if "zebra" in r["snippet"]]
        if SECRET in g.context("agent")["text"]:
            leaks.append("context")
    return leaks


# -- the index: one file, one name ---------------------------------------------------------------


def test_discover_indexes_a_hard_link_of_memory_md_only_as_memory_md(ws: Path) -> None:
    os.link(ws / "MEMORY.md", ws / "memory" / "notes.md")
    os.link(ws / "MEMORY.md", ws / TODAY)
    (ws / "memory" / "a.md").write_text("a topic\n")
    os.link(ws / "memory" / "a.md", ws / "memory" / "b.md")  # two names, neither long-term
    found = discover(ws)
    assert [f.rel for f in found.files] == ["MEMORY.md", "memory/2026-04-01.md", "memory/a.md"]
    assert found.skipped == []  # their text is indexed, under one name: nothing is missing
    # One changed path is looked at alone only when it has one name.
    assert memory_file(ws, "memory/notes.md") == ("rescan", None)
    assert memory_file(ws, "MEMORY.md") == ("rescan", None)
    assert memory_file(ws, YESTERDAY)[0] == "file"


def test_a_daily_log_becomes_long_term_memory_when_memory_md_is_made_a_link_to_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / TODAY).write_text(f"{SECRET}\n")
    os.link(root / TODAY, root / "MEMORY.md")
    assert [f.rel for f in discover(root).files] == ["MEMORY.md"]
    assert locate(root, TODAY).longterm


def test_locate_knows_long_term_memory_by_what_the_file_is(ws: Path) -> None:
    os.link(ws / "MEMORY.md", ws / "memory" / "notes.md")
    (ws / "DREAMS.md").write_text("# Dreams\n")
    os.link(ws / "DREAMS.md", ws / "memory" / "diary.md")
    os.symlink("notes.md", ws / "memory" / "via-symlink.md")
    for path in ("memory/notes.md", "memory/diary.md", "memory/via-symlink.md", "MEMORY.md"):
        assert locate(ws, path).longterm, path
    assert not locate(ws, YESTERDAY).longterm
    assert not locate(ws, TODAY).longterm  # missing: nothing to be


# -- through the daemon --------------------------------------------------------------------------


def test_group_chat_never_reads_a_hard_link_of_memory_md(daemon: Daemon, ws: Path) -> None:
    os.link(ws / "MEMORY.md", ws / "memory" / "notes.md")
    os.link(ws / "MEMORY.md", ws / TODAY)  # today's log: what context reads
    os.mkdir(ws / "memory" / "deep")
    os.link(ws / "MEMORY.md", ws / "memory" / "deep" / "Memory.md")
    _add(daemon, ws)
    paths = ["memory/notes.md", TODAY, "memory/deep/Memory.md", str(ws / "memory/notes.md")]
    assert _group_sees_secret(daemon, paths) == []
    with memd_client.connect(daemon.socket_path, identity=GROUP) as g:
        with pytest.raises(PathRefused, match="long-term memory"):
            g.get("agent", "memory/notes.md")
        sections = g.context("agent")["sections"]
        assert [s["path"] for s in sections] == [YESTERDAY]
    with memd_client.connect(daemon.socket_path, identity=DIRECT) as d:
        assert SECRET in d.get("agent", "memory/notes.md")["text"]
        hits = d.search("agent", "vault combination zebra", mode="keyword")["results"]
        assert [h["path"] for h in hits] == ["MEMORY.md"]  # indexed once, as what it is


def test_hard_links_made_while_the_daemon_watches(daemon: Daemon, ws: Path) -> None:
    """The watcher's one-path syncs must reach the same answer as a full scan."""
    _add(daemon, ws)
    os.link(ws / "MEMORY.md", ws / "memory" / "later.md")
    # A daily log replaced by a link to MEMORY.md after it was indexed under its own name.
    (ws / "memory" / "2026-03-30.md").write_text("- an ordinary day\n")
    with memd_client.connect(daemon.socket_path) as c:
        c.search("agent", "ordinary day", mode="keyword", wait_ms=5000)
    tmp = ws / "memory" / ".swap.md"
    os.link(ws / "MEMORY.md", tmp)
    os.replace(tmp, ws / "memory" / "2026-03-30.md")
    with memd_client.connect(daemon.socket_path) as c:
        c.search("agent", "anything", mode="keyword", wait_ms=5000)
    assert _group_sees_secret(daemon, ["memory/later.md", "memory/2026-03-30.md"]) == []


def test_search_withholds_a_file_that_became_a_link_before_the_index_caught_up(
    daemon: Daemon, ws: Path
) -> None:
    """What a hit is shown to is decided on the file as it is when the reply is made."""
    (ws / "memory" / "topic.md").write_text(f"{SECRET}\n")
    (ws / "MEMORY.md").unlink()
    _add(daemon, ws)
    with memd_client.connect(daemon.socket_path, identity=GROUP) as g:
        assert g.search("agent", "vault zebra", mode="keyword")["results"]
    os.link(ws / "memory" / "topic.md", ws / "MEMORY.md")  # now it is long-term memory
    with memd_client.connect(daemon.socket_path, identity=GROUP) as g:
        hits = g.search("agent", "vault zebra", mode="keyword")["results"]
    assert not any("zebra" in h["snippet"] for h in hits)


# -- append: one name, inside the workspace ------------------------------------------------------


def test_append_refuses_a_daily_log_that_is_a_hard_link(
    daemon: Daemon, ws: Path, tmp_path: Path
) -> None:
    _add(daemon, ws)
    os.link(ws / "MEMORY.md", ws / TODAY)
    before = (ws / "MEMORY.md").read_bytes()
    with memd_client.connect(daemon.socket_path) as c:
        with pytest.raises(PathRefused, match="2 hard links"):
            c.append("agent", "Decided: ship on Friday.")
    assert (ws / "MEMORY.md").read_bytes() == before
    # A link to a file outside the workspace: that file must not change either.
    outside = tmp_path / "outside.md"
    outside.write_text("someone else's file\n")
    (ws / TODAY).unlink()
    os.link(outside, ws / TODAY)
    with memd_client.connect(daemon.socket_path) as c:
        with pytest.raises(PathRefused, match="hard links"):
            c.append("agent", "Decided: ship on Friday.")
        assert "dentist" in c.get("agent", YESTERDAY)["text"]  # still serving
    assert outside.read_text() == "someone else's file\n"
    # With the link gone the append works as always.
    (ws / TODAY).unlink()
    with memd_client.connect(daemon.socket_path) as c:
        got = c.append("agent", "Decided: ship on Friday.")
    assert got["path"] == TODAY and (ws / TODAY).read_text() == "Decided: ship on Friday.\n"


def test_append_refuses_a_symlinked_memory_folder_or_log(
    daemon: Daemon, ws: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _add(daemon, ws)
    os.symlink(elsewhere / "log.md", ws / TODAY)
    with memd_client.connect(daemon.socket_path) as c:
        with pytest.raises(PathRefused, match="symlink"):
            c.append("agent", "text")
        os.unlink(ws / TODAY)
        shutil.rmtree(ws / "memory")
        os.symlink(elsewhere, ws / "memory")
        with pytest.raises(PathRefused, match="memory/ is not a directory"):
            c.append("agent", "text")
    assert list(elsewhere.iterdir()) == []


# -- a bind mount of the workspace inside itself -------------------------------------------------


def _unshare_works() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    done = subprocess.run([unshare, "-rm", "true"], capture_output=True, check=False)
    return done.returncode == 0


_BIND_SCRIPT = """
import json, os, subprocess, sys
from datetime import UTC, datetime
from pathlib import Path
sys.path.insert(0, sys.argv[1])
ws, home = Path(sys.argv[2]), sys.argv[3]
os.environ["MEMD_HOME"] = home
(ws / "memory" / "mnt").mkdir()
subprocess.run(["mount", "--bind", str(ws), str(ws / "memory" / "mnt")], check=True)
import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.embed.fake import FakeEmbedder
from tests.daemon_fixture import running_daemon
out = {}
clock = Clock.at(datetime(2026, 4, 2, 12, 0, tzinfo=UTC), "UTC")
with running_daemon(Config.load(timezone="UTC"), embedder=FakeEmbedder(), clock=clock) as d:
    with memd_client.connect(d.socket_path) as c:
        c.workspace_add(str(ws), name="agent")
        c.reindex("agent")
    with memd_client.connect(d.socket_path, identity=json.loads(sys.argv[4])) as g:
        try:
            out["get"] = g.get("agent", "memory/mnt/MEMORY.md")["text"]
        except memd_client.MemdError as exc:
            out["get"] = type(exc).__name__
        hits = g.search("agent", "vault combination zebra", mode="keyword")["results"]
        out["search"] = [h["path"] + " " + h["snippet"] for h in hits]
        out["context"] = g.context("agent")["text"]
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not _unshare_works(), reason="needs `unshare -rm` (a user and mount namespace) for a bind mount"
)
def test_a_bind_mount_of_the_workspace_inside_itself_is_not_a_second_memory_md(
    ws: Path, tmp_path: Path
) -> None:
    home = tmp_path / "ns-home"
    done = subprocess.run(
        [
            "unshare",
            "-rm",
            sys.executable,
            "-c",
            _BIND_SCRIPT,
            str(REPO),
            str(ws),
            str(home),
            json.dumps(GROUP),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["get"] == "PathRefused"
    assert not any("zebra" in hit for hit in out["search"]), out["search"]
    assert SECRET not in out["context"]
