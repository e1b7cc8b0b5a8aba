"""``fresh: true`` is never said without the newest text, against a real daemon.

Each test makes the index fall behind for real (a model worker killed with SIGKILL, a 7.5 MB
daily log, a burst of thousands of files, a workspace directory put in place of another) and
asks the whole time. Every reply that says fresh is checked: the newest text on disk when it
was asked for is among its own results (its keyword rows), and for a hybrid search the index
it read holds every vector (checked in the daemon's index when no write came in between).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import memd_client
from memd.config import Config, EmbeddingConfig
from memd.daemon import Daemon

from .daemon_fixture import running_daemon, wait_for

MODEL = os.environ.get("MEMD_TEST_MODEL", "")
needs_model = pytest.mark.skipif(
    not MODEL or not Path(MODEL).is_file(), reason="set MEMD_TEST_MODEL to a GGUF embedding model"
)


def keyword_only() -> Config:
    return Config.load(embedding=EmbeddingConfig(provider="none"))


def workspace(root: Path) -> Path:
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    return root


class Claims:
    """Asks one search again and again and keeps every reply that said fresh without the
    newest text (``lies``), with how many replies there were and how many said fresh."""

    def __init__(self, daemon: Daemon, c: memd_client.Client, name: str) -> None:
        self.daemon, self.c, self.name = daemon, c, name
        self.replies = self.fresh = 0
        self.lies: list[str] = []

    def ask(self, query: str, path: str, *, mode: str = "keyword") -> dict[str, Any]:
        """Search ``query`` (a token only ``path`` holds on disk now) and check the claim."""
        reply = self.c.search(self.name, query, mode=mode, max_results=20)  # type: ignore[arg-type]
        self.replies += 1
        fresh = reply["freshness"]
        if not fresh["fresh"]:
            return dict(reply)
        self.fresh += 1
        if path not in {r["path"] for r in reply["results"]}:
            self.lies.append(f"fresh without {path}: {fresh}")
        if reply["mode"] != "keyword":
            # The vectors too: in the index as the reply read it, if nothing was written since.
            ws = self.daemon.parts.registry.get(self.name)  # type: ignore[union-attr]
            with ws.index.reader() as store:
                if store.generation() == fresh["generation"] and store.pending_count():
                    self.lies.append(f"fresh with {store.pending_count()} files lacking vectors")
        return dict(reply)

    def until_fresh(self, query: str, path: str, timeout: float, **kw: Any) -> dict[str, Any]:
        """Ask until a reply says fresh (and was checked); fail after ``timeout`` seconds."""
        reply: dict[str, Any] = {}

        def fresh() -> bool:
            nonlocal reply
            reply = self.ask(query, path, **kw)
            return bool(reply["freshness"]["fresh"])

        wait_for(fresh, f"a fresh reply with {path}", timeout=timeout)
        return reply


def settled(c: memd_client.Client, name: str, query: str, timeout: float = 120) -> None:
    """Wait until the workspace is indexed and a search that waited says fresh."""
    wait_for(
        lambda: c.search(name, query, wait_ms=5000)["freshness"]["fresh"],
        "the workspace indexed and fresh",
        timeout=timeout,
    )


@needs_model
def test_a_model_worker_killed_mid_job_leaves_no_fresh_reply_without_its_vectors(
    tmp_path: Path,
) -> None:
    ws = workspace(tmp_path / "agent")
    config = Config.load(embedding=EmbeddingConfig(provider="local", model_path=MODEL))
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="agent")
            settled(c, "agent", "staging cluster")
            claims = Claims(daemon, c, "agent")
            # A long note: the worker is still embedding its lines when it is killed.
            lines = [f"- kestrel survey {i}: nest {i} holds {i % 5} eggs today" for i in range(300)]
            lines.append("- kestrelmark: the survey ends on Friday")
            (ws / "memory" / "2026-05-01.md").write_text("\n".join(lines) + "\n")
            path = "memory/2026-05-01.md"

            def embedding() -> int | None:
                claims.ask("kestrelmark", path, mode="hybrid")
                st = c.status("agent")["workspaces"][0]
                progress, worker = st["progress"] or {}, st["provider"]["worker"] or {}
                busy = progress.get("phase") == "embed" and st["files_pending"]
                return worker.get("pid") if busy else None

            pid = wait_for(embedding, "the worker embedding the new note", timeout=60)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the job died, the worker restarts
                claims.ask("kestrelmark", path, mode="hybrid")
            # After the failure the writer backs off; a reindex retries at once.
            c.reindex("agent", timeout=120)
            claims.until_fresh("kestrelmark", path, timeout=120, mode="hybrid")
            restarted = c.status("agent")["workspaces"][0]["provider"]["worker"]
    assert restarted["restarts"] >= 1 and restarted["pid"] != pid
    assert not claims.lies, claims.lies[:3]
    assert claims.replies > claims.fresh >= 1


def test_a_big_daily_log_being_indexed_is_not_fresh_until_its_rows_are_in(
    tmp_path: Path,
) -> None:
    ws = workspace(tmp_path / "agent")
    log = ws / "memory" / "2026-06-01.md"
    block = "".join(f"- entry {i}: the deploy of build {i} went out at noon\n" for i in range(1000))
    with log.open("w") as f:
        while f.tell() < 7_500_000:
            f.write(block)
    path = "memory/2026-06-01.md"
    with running_daemon(keyword_only(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="agent")
            settled(c, "agent", "deploy build")
            claims = Claims(daemon, c, "agent")
            for round in range(2):
                token = f"osprey{round}mark"
                with log.open("a") as f:
                    f.write(f"- {token}: the nightly job moved to 02:00\n")
                claims.until_fresh(token, path, timeout=120)
    assert not claims.lies, claims.lies[:3]
    # the re-index of the big file took a while, and it was asked about meanwhile
    assert claims.replies > claims.fresh


def test_a_burst_of_thousands_of_files_is_not_fresh_until_all_are_in(tmp_path: Path) -> None:
    ws = workspace(tmp_path / "agent")
    # More events than the kernel's queue holds (three a file: create, modify, close).
    limit = Path("/proc/sys/fs/inotify/max_queued_events")
    queue = int(limit.read_text()) if limit.exists() else 16384
    count = min(20_000, queue // 3 + 2_000)
    with running_daemon(keyword_only(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=120) as c:
            c.workspace_add(ws, name="agent")
            settled(c, "agent", "staging cluster")
            claims = Claims(daemon, c, "agent")
            burst = ws / "memory" / "burst"
            burst.mkdir()
            for n in range(count):
                (burst / f"n{n:05d}.md").write_text(f"- burst note {n}: heron{n}x\n")
            last = f"memory/burst/n{count - 1:05d}.md"
            first = "memory/burst/n00000.md"
            # the first file and the last: a lost event is as likely early as late
            for query, path in ((f"heron{count - 1}x", last), ("heron0x", first)) * 3:
                claims.ask(query, path)
            claims.until_fresh(f"heron{count - 1}x", last, timeout=300)
            claims.ask("heron0x", first)
            st = c.status("agent")["workspaces"][0]
    assert not claims.lies, claims.lies[:3]
    assert st["files_indexed"] == st["files_on_disk"] == count + 1


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_workspace_directory_replaced_or_removed_is_a_problem_not_fresh(
    tmp_path: Path, how: str
) -> None:
    ws = workspace(tmp_path / "agent")
    (ws / "memory" / "2026-07-01.md").write_text("- the gannet colony moved north\n")
    with running_daemon(keyword_only(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="agent")
            settled(c, "agent", "gannet colony")
            ws.rename(tmp_path / "agent.old")
            if how == "replaced":
                (ws / "memory").mkdir(parents=True)  # another directory at the same path
                (ws / "memory" / "2026-07-02.md").write_text("- a puffin arrived\n")

            def problem() -> dict[str, Any] | None:
                found = c.search("agent", "gannet colony", mode="keyword")
                fresh = found["freshness"]
                assert not fresh["fresh"], fresh  # never, from the moment it moved
                return found if fresh["problems"] else None

            wait_for(problem, "the moved directory reported as a problem", timeout=30)
            # a search that waits asks for a sync: it must not empty the index either
            found = c.search("agent", "gannet colony", mode="keyword", wait_ms=2000)
            st = c.status("agent")["workspaces"][0]
            doctor = st["freshness"]["problems"]
            if how == "replaced":
                # following it again is asked for, and then it is fresh
                c.workspace_add(ws)
                puffin = c.search("agent", "puffin", wait_ms=5000)
    assert not found["freshness"]["fresh"] and found["freshness"]["problems"]
    # the old memory stays searchable meanwhile: the index was not emptied
    assert [r["path"] for r in found["results"]] == ["memory/2026-07-01.md"]
    assert st["dirty"] and doctor and str(ws) in doctor[0]
    if how == "replaced":
        assert "not the one registered" in doctor[0]
        assert puffin["freshness"]["fresh"], puffin["freshness"]
        assert [r["path"] for r in puffin["results"]] == ["memory/2026-07-02.md"]
    else:
        assert "gone" in doctor[0]


def test_without_a_change_probe_only_a_reply_that_waited_says_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the watcher polls (a network filesystem: faked here, as no NFS server is at hand;
    the polling itself is real), nothing sees an edit the moment it is made: a reply says so,
    unless it waited for a walk of the workspace (wait_ms), or is status, which walks it."""
    import memd.watch.watcher as watcher_module

    monkeypatch.setattr(watcher_module, "network_filesystem", lambda root: "nfs")
    ws = workspace(tmp_path / "agent")
    with running_daemon(keyword_only(), choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            c.workspace_add(ws, name="agent")
            waited = c.search("agent", "staging cluster", wait_ms=5000)
            (ws / "memory" / "2026-08-01.md").write_text("- the tern count is 41\n")
            unwaited = c.search("agent", "tern count", mode="keyword")
            st = c.status("agent")["workspaces"][0]
            after = c.search("agent", "tern count", mode="keyword", wait_ms=5000)
    assert st["watcher"]["state"] == "polling"
    assert waited["freshness"]["fresh"], waited["freshness"]
    assert not unwaited["freshness"]["fresh"]
    assert "polling" in unwaited["freshness"]["problems"][0]
    assert "wait_ms" in unwaited["freshness"]["problems"][0]
    # status walked the workspace: it found the new file pending, and says no more than that
    assert st["freshness"]["problems"] == [] and st["files_stale"] >= 0
    assert after["freshness"]["fresh"] and after["results"][0]["path"] == "memory/2026-08-01.md"
