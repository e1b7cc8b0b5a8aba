"""Progress of long work, through a real daemon: status says what is being done, how far and how
fast, and ``memctl reindex`` shows it as it goes (a bar on a terminal, JSON lines with --json)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from click.testing import CliRunner

import memd_client
from memd.ctl import display, display_status
from memd.ctl.memctl import cli
from memd.embed.base import Kind, Vectors
from memd.embed.fake import FakeEmbedder

from .daemon_fixture import running_daemon, wait_for


class SlowEmbedder(FakeEmbedder):
    """The fake provider at a pace a person could watch: a real model on two cores embeds a few
    dozen texts a second, the fake one thousands, which leaves nothing to report. (A slowed
    fake, not a mock: everything else is the real daemon.)"""

    def __init__(self, seconds_per_batch: float) -> None:
        super().__init__(batch_size=4)
        self.seconds_per_batch = seconds_per_batch

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "document":
            time.sleep(self.seconds_per_batch)
        return super().embed_batch(texts, kind=kind)


def _workspace(root: Path, files: int) -> Path:
    (root / "memory").mkdir(parents=True)
    for i in range(files):
        lines = [
            f"- note {i} line {j}: the {word} plan for week {i}"
            for j, word in enumerate(("deploy", "budget", "hiring", "launch"))
        ]
        (root / "memory" / f"2026-01-{i % 28 + 1:02d}-{i:03d}.md").write_text(
            f"# Day {i}\n\n" + "\n".join(lines) + "\n"
        )
    return root


def test_reindex_streams_progress_and_status_shows_the_rebuild(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "big", files=120)
    embedder = SlowEmbedder(0.03)
    with running_daemon(embedder=embedder) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="big")
        seen: list[str] = []
        stop = threading.Event()

        def watch_status() -> None:  # what `memctl status` prints meanwhile (its own lines:
            # two click runners at once would share one redirected stdout)
            with memd_client.connect(daemon.socket_path) as c:
                while not stop.is_set():
                    text = "\n".join(display_status.status_lines(c.status(), time.time()))
                    if "Rebuilding: embedding" in text and "left" in text:
                        seen.append(text)
                        return
                    time.sleep(0.2)

        watcher = threading.Thread(target=watch_status)
        watcher.start()
        try:
            result = CliRunner().invoke(
                cli,
                ["--socket", str(daemon.socket_path), "reindex", "-w", "big", "--force", "--json"],
            )
        finally:
            stop.set()
            watcher.join()
    assert result.exit_code == 0, result.output
    # Each text embedded once: the live index's backlog waits while the rebuild embeds the
    # same texts (120 chunks and 4 lines each: 600 distinct texts; a few may race at the start).
    assert embedder.documents_embedded <= 620, embedder.documents_embedded
    events = [json.loads(line) for line in result.stdout.splitlines()]
    progress = [e for e in events if e["event"] == "progress"]
    assert events[-1]["event"] == "done" and events[-1]["workspaces"][0]["rebuilt"]
    assert len(progress) >= 10, events
    # The new workspace's own first pass may show before the rebuild takes over.
    assert "rebuild" in {e["kind"] for e in progress} <= {"index", "embed", "rebuild"}
    embedding = [e for e in progress if e["phase"] == "embed" and e["kind"] == "rebuild"]
    assert embedding, progress
    done = [e["chunks_done"] for e in embedding]
    assert done == sorted(done) and done[-1] > done[0], "chunks are counted up"
    last = embedding[-1]
    # 120 files of one chunk each, less any the backlog embedded before the rebuild began
    # (the rebuild takes those from the embedding cache).
    assert 100 <= last["chunks_total"] <= 120 and last["files_total"] == last["chunks_total"]
    assert last["chunks_per_s"] > 0 and last["eta_s"] is not None
    # Meanwhile `memctl status` said so, in words.
    assert seen, "status never showed the rebuild"
    assert "Rebuilding: embedding" in seen[0] and "chunks/s" in seen[0] and "left" in seen[0]


def test_status_shows_the_embedding_backlog_with_an_eta(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "backlog", files=60)
    with running_daemon(embedder=SlowEmbedder(0.03)) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="backlog")

            def embedding() -> dict[str, object] | None:
                p = c.status("backlog")["workspaces"][0]["progress"]
                return p if p and p.get("kind") == "embed" and p.get("chunks_per_s") else None

            p = wait_for(embedding, "the embedding backlog in status")
            assert p["files_total"] == 60 and p["chunks_total"] == 60
            assert 0 < p["chunks_done"] < 60 and p["eta_s"] > 0  # type: ignore[operator]
            wait_for(lambda: c.status("backlog")["workspaces"][0]["files_pending"] == 0, "done")
            assert c.status("backlog")["workspaces"][0]["progress"] is None


def test_progress_in_words() -> None:
    p = {
        "kind": "rebuild",
        "phase": "embed",
        "files_done": 412,
        "files_total": 3001,
        "chunks_done": 1200,
        "chunks_total": 9751,
        "chunks_per_s": 38.5,
        "eta_s": 222.1,
    }
    assert display.progress_text(p) == (
        "Rebuilding: embedding 1,200/9,751 chunks (412/3,001 files) · 38.5 chunks/s · about 3m 42s left"
    )
    assert display.progress_bar(p, width=10).startswith("[#---------] ")
    scan = {"kind": "index", "phase": "scan", "files_done": 5, "files_total": 10}
    assert display.progress_text(scan) == "Indexing: reading 5/10 files"
    assert display.progress_bar(scan, width=10).startswith("[#####-----] ")


def test_the_backlog_in_words() -> None:
    backlog = {"kind": "embed", "phase": "embed", "files_done": 8, "files_total": 301}
    backlog |= {"chunks_done": 8, "chunks_total": 301, "chunks_per_s": 5.5, "eta_s": 53.0}
    assert display.progress_text(backlog) == (
        "Embedding: 8/301 chunks (8/301 files) · 5.5 chunks/s · about 53s left"
    )


def test_search_notes_say_why_a_reply_is_not_fresh() -> None:
    def notes(**fresh: object) -> list[str]:
        base = {"fresh": False, "pending_files": 0, "unembedded_files": 0, "skipped_files": 0}
        return list(display.search_notes({"results": [{}], "freshness": base | fresh}))

    polling = "edits are found by polling: only a reply that waited (wait_ms) can say it is fresh"
    assert notes(problems=[polling]) == [f"note: not fresh: {polling}"]
    assert notes(pending_files=3) == ["note: the index is catching up (3 files pending)"]
    assert notes(unembedded_files=2) == ["note: vectors of 2 files are still being made"]
    assert notes(skipped_files=1) == ["note: 1 files are not indexed (memctl status says why)"]
    assert list(display.search_notes({"results": [{}], "freshness": {"fresh": True}})) == []


def test_the_eta_counts_texts_so_a_long_file_does_not_stall_it(tmp_path: Path) -> None:
    """A file's chunks are stored once all its texts are embedded: counted by chunks stored,
    one long file gave no rate (and no ETA) for as long as it took. Counted by texts, the
    rate and the ETA come with the first batch, and the total stays put while nothing
    changes on disk."""
    ws = tmp_path / "long"
    (ws / "memory").mkdir(parents=True)
    sections = [
        f"## Week {i}\n\n" + "\n".join(f"- item {i}.{j}: the {i * j} plan" for j in range(12))
        for i in range(40)
    ]
    (ws / "memory" / "2026-01-01.md").write_text("\n\n".join(sections) + "\n")
    with running_daemon(embedder=SlowEmbedder(0.05)) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="long")

            def mid_file() -> dict[str, object] | None:
                p = c.status("long")["workspaces"][0]["progress"]
                if p and p.get("kind") == "embed" and p.get("texts_done"):
                    return p
                return None

            first = wait_for(mid_file, "texts embedded inside the one file")
            assert first["chunks_done"] == 0 and first["files_total"] == 1
            total = first["texts_total"]
            assert 0 < first["texts_done"] < total  # type: ignore[operator]
            assert first["eta_s"] is not None and first["eta_s"] > 0  # type: ignore[operator]
            later = wait_for(mid_file, "a later look at the same file")
            assert later["texts_total"] == total, "the total climbed with nothing new on disk"
            wait_for(lambda: c.status("long")["workspaces"][0]["files_pending"] == 0, "done")


class PerCharEmbedder(FakeEmbedder):
    """The fake provider at a model's pace, which grows with the text: a long chunk costs the
    model many times what a short line does. (A slowed fake, as above.)"""

    def __init__(self, seconds_per_char: float) -> None:
        super().__init__(batch_size=4)
        self.seconds_per_char = seconds_per_char

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if kind == "document":
            time.sleep(self.seconds_per_char * sum(len(t) for t in texts))
        return super().embed_batch(texts, kind=kind)


def test_the_eta_counts_characters_so_cheap_texts_first_do_not_flatter_it(
    tmp_path: Path,
) -> None:
    """The newest files, embedded first, hold short lines; the older ones long ones, 15 times
    the characters a text. Counted by texts, the rate of the cheap ones promised the rest in
    a fortieth of its time; counted by characters, the ETA read once the cheap files are in
    is of the order of the time the rest then takes."""
    ws = tmp_path / "mixed"
    (ws / "memory").mkdir(parents=True)
    now = time.time()
    for i in range(12):  # 11 short texts a file
        f = ws / "memory" / f"short-{i:02d}.md"
        f.write_text("\n".join(f"- n{i}.{j} fine" for j in range(10)) + "\n")
        os.utime(f, (now, now))
    long_line = " ".join(["the quarterly plan moves the launch"] * 14)  # 503 characters
    for i in range(6):  # 4 long texts a file
        f = ws / "memory" / f"long-{i:02d}.md"
        f.write_text("\n".join(f"- {i}.{j} {long_line}" for j in range(3)) + "\n")
        os.utime(f, (now - 3600, now - 3600))
    with running_daemon(embedder=PerCharEmbedder(0.0002)) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="mixed")

            def short_ones_in() -> dict[str, object] | None:
                st = c.status("mixed")["workspaces"][0]
                p = st["progress"]
                if p and p.get("kind") == "embed" and p.get("chunks_done", 0) >= 12:
                    return p
                return None

            read = wait_for(short_ones_in, "the short files embedded", timeout=60)
            taken = time.monotonic()
            wait_for(lambda: c.status("mixed")["workspaces"][0]["files_pending"] == 0, "done")
            rest = time.monotonic() - taken
    assert read["chars_done"] < read["chars_total"] / 4  # type: ignore[operator]
    # about 3.6 s were left; counted by texts the ETA said about 0.1
    assert read["eta_s"] is not None and read["eta_s"] >= rest / 3, (read, rest)


def test_the_workspace_a_search_waits_on_embeds_before_the_others(tmp_path: Path) -> None:
    """Two workspaces with a backlog: a search that waits for the vectors of one has that
    one's steps go first; taken in turn, the other's backlog would move as fast meanwhile."""
    big = _workspace(tmp_path / "big", files=200)
    small = _workspace(tmp_path / "small", files=20)
    with running_daemon(embedder=SlowEmbedder(0.03)) as daemon:
        with memd_client.connect(daemon.socket_path) as c:

            def pending(name: str) -> int:
                return int(c.status(name)["workspaces"][0]["files_pending"])

            def under_way() -> bool:
                ws = c.status("big")["workspaces"][0]
                return ws["files_indexed"] == 200 and 0 < ws["files_pending"] < 190

            c.workspace_add(str(big), name="big")
            wait_for(under_way, "the big one all read, its embedding under way")
            c.workspace_add(str(small), name="small")
            big_before = pending("big")
            reply = c.search("small", "the budget plan", mode="hybrid", wait_ms=60_000)
            big_after = pending("big")
            assert pending("small") == 0 and reply["freshness"]["fresh"] is True
            # in turn, about 20 of the big one's files would have been embedded meanwhile
            assert big_before - big_after <= 4, (big_before, big_after)
