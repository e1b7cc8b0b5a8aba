"""Ctrl-C on `memctl reindex`: only the waiting stops, and memctl says that memd goes on.

A real memd (its embedder slowed, so a rebuild lasts long enough to interrupt) and memctl as a
process of its own, interrupted with a real SIGINT.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import memd_client
from memd.embed.base import Kind, Vectors
from memd.embed.fake import FakeEmbedder

from .daemon_fixture import running_daemon, wait_for


class SlowEmbedder(FakeEmbedder):
    """A FakeEmbedder that takes two seconds a document batch until ``go`` is set, so that
    the rebuild embeds too and lasts long enough to be interrupted on a loaded machine."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "document":
            self.go.wait(2.0)
        return super().embed_batch(texts, kind=kind)


def test_ctrl_c_stops_waiting_and_the_rebuild_goes_on(tmp_path: Path) -> None:
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    # Enough files that the first index is still embedding (two seconds a batch) when memctl,
    # started as a process of its own, asks for the rebuild: a rebuild of files whose vectors
    # are all there copies them and ends before the signal.
    for i in range(300):
        (ws / "memory" / f"topic-{i}.md").write_text(f"# Topic {i}\n\nnote {i} about vega\n")
    embedder = SlowEmbedder()
    with running_daemon(embedder=embedder) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(ws, name="agent")
        # Python leaves SIGINT ignored when it starts with it ignored, as every command a
        # non-interactive shell puts in the background does (and its children): memctl then
        # never sees the Ctrl-C. The user's terminal delivers it; here the child asks for it.
        memctl = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "from memd.ctl.memctl import main; main()",
                "--socket",
                str(daemon.socket_path),
                "reindex",
                "-w",
                "agent",
                "--force",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with memd_client.connect(daemon.socket_path) as c:

            def waiting() -> bool:  # memctl is connected, and waits for the rebuild
                status = c.status("agent")
                progress = status["workspaces"][0].get("progress") or {}
                return status["daemon"]["connections"] >= 2 and progress.get("kind") == "rebuild"

            try:
                wait_for(waiting, "memctl to wait for the rebuild")
                memctl.send_signal(signal.SIGINT)
                out, err = memctl.communicate(timeout=60)
            finally:
                if memctl.poll() is None:  # no process outlives the test
                    memctl.kill()
                    memctl.communicate()
            assert memctl.returncode == 130, err
            assert "Aborted!" not in err
            assert "memd goes on with the reindex" in err and "memctl status" in err
            embedder.go.set()
            wait_for(
                lambda: not c.status("agent")["workspaces"][0]["rebuilding"],
                "the rebuild to finish",
            )
            found = c.search("agent", "note 59 vega", wait_ms=20_000)
            assert found["results"] and found["freshness"]["fresh"]
