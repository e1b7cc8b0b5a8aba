"""A rebuild and what overlaps it, through a real daemon: a reindex asked for meanwhile waits for
it and gets its report, status never says clean while it runs, and stopping memd abandons it
(the old index stays, its temporary file goes, whoever waited is told)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import memd_client
from memd.config import Config
from memd.embed.base import Kind, Vectors
from memd.embed.fake import FakeEmbedder
from memd_client.connection import DaemonUnavailable
from memd_client.errors import Busy

from .daemon_fixture import running_daemon, wait_for


class SlowEmbedder(FakeEmbedder):
    """The fake provider at the pace of a slow CPU, so a rebuild is still running when the test
    asks (a slowed fake, not a mock: everything else is the real daemon)."""

    def __init__(self, seconds_per_batch: float, model: str = "fake-bow") -> None:
        super().__init__(batch_size=8, model=model)
        self.seconds_per_batch = seconds_per_batch

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "document":
            time.sleep(self.seconds_per_batch)
        return super().embed_batch(texts, kind=kind)


def notes(root: Path, files: int) -> Path:
    (root / "memory").mkdir(parents=True)
    for i in range(files):
        lines = [f"- day {i} item {j}: the {w} plan" for j, w in enumerate(("a", "b", "c"))]
        (root / "memory" / f"2026-02-{i % 28 + 1:02d}-{i:03d}.md").write_text("\n".join(lines))
    return root


def indexed_by_another_model(ws: Path) -> None:
    """Index ``ws`` with one model: a daemon started with another then rebuilds on its own."""
    with running_daemon(embedder=FakeEmbedder(model="older-model")) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="notes")
            wait_for(
                lambda: c.search("notes", "plan", wait_ms=5000)["freshness"]["fresh"],
                "the first index",
            )


def test_a_reindex_during_an_automatic_rebuild_waits_for_it(tmp_path: Path) -> None:
    ws = notes(tmp_path / "notes", files=60)
    indexed_by_another_model(ws)
    with running_daemon(embedder=SlowEmbedder(0.2)) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=120) as c:

            def rebuilding() -> dict[str, Any] | None:
                st = c.status("notes")["workspaces"][0]
                return st if st["rebuilding"] else None

            st = wait_for(rebuilding, "the rebuild the new model starts on its own")
            assert st["dirty"], "status is never clean during a rebuild"
            assert (st["progress"] or {}).get("kind") == "rebuild"
            reports: dict[str, Any] = {}

            def reindex(force: bool) -> None:
                with memd_client.connect(daemon.socket_path, timeout=120) as own:
                    try:
                        reports[f"force={force}"] = own.reindex("notes", force=force, timeout=120)
                    except Exception as exc:  # kept, so the assertion below names it
                        reports[f"force={force}"] = exc

            threads = [threading.Thread(target=reindex, args=(f,)) for f in (True, False)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            after = c.status("notes")["workspaces"][0]
    for key, result in reports.items():
        assert not isinstance(result, Exception), f"{key}: {result!r}"
        (report,) = result["workspaces"]
        assert report["rebuilt"] and not report["errors"], (key, report)
        assert report["indexed"] == 60, (key, report)
        # what it says pending is what the index lacks after the swap, not a guess
        assert report["pending_files"] == 0, (key, report)
    assert not after["rebuilding"] and after["identity"]["state"] == "valid"


def test_stopping_memd_abandons_a_rebuild_and_answers_who_waits(tmp_path: Path) -> None:
    ws = notes(tmp_path / "notes", files=60)
    with running_daemon(embedder=FakeEmbedder()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="notes")
            wait_for(
                lambda: c.search("notes", "plan", wait_ms=5000)["freshness"]["fresh"], "indexed"
            )
    index_dir = Config.load().index_dir
    # A minute of embedding at this pace: only an abandoned rebuild lets memd stop in time.
    slow = SlowEmbedder(1.0, model="newer-model")
    answer: list[Any] = []
    with running_daemon(embedder=slow) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            wait_for(lambda: c.status("notes")["workspaces"][0]["rebuilding"], "the rebuild")

            def forced() -> None:
                try:
                    with memd_client.connect(daemon.socket_path, timeout=60) as own:
                        answer.append(own.reindex("notes", force=True, timeout=60))
                except Exception as exc:
                    answer.append(exc)

            waiting = threading.Thread(target=forced)
            waiting.start()
            wait_for(lambda: slow.documents_embedded > 0, "the rebuild embedding")
            assert list(index_dir.glob("*.tmp-*")), "the rebuild's temporary file"
    # running_daemon has returned: the daemon stopped, and (checked by the thread-leak
    # fixture) no rebuild thread outlived it.
    waiting.join(60)
    assert len(answer) == 1
    if not isinstance(answer[0], DaemonUnavailable):
        # the reply came before its connection closed: BUSY, naming what happened
        assert isinstance(answer[0], Busy), repr(answer[0])
        assert "rebuild was abandoned" in str(answer[0])
    assert not list(index_dir.glob("*.tmp-*")), "the temporary file is removed"
    # The old index is intact: a daemon with the first model searches it at once.
    with running_daemon(embedder=FakeEmbedder()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            st = c.status("notes")["workspaces"][0]
            found = c.search("notes", "plan", mode="keyword")
    assert st["identity"]["state"] == "valid" and st["files_indexed"] == 60
    assert found["results"]


@pytest.mark.parametrize("force", [True, False])
def test_a_reindex_while_memd_stops_is_busy_not_internal(tmp_path: Path, force: bool) -> None:
    """A request that reaches the writer as it stops gets BUSY, a typed error."""
    ws = notes(tmp_path / "notes", files=2)
    with running_daemon(embedder=FakeEmbedder()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="notes")
            assert daemon.parts is not None
            daemon.parts.writer.abandon_rebuilds()
            if force:
                with pytest.raises(Busy, match="shutting down"):
                    c.reindex("notes", force=True)
            else:  # a plain reindex is a sync: it still runs
                assert c.reindex("notes")["workspaces"][0]["errors"] == []
