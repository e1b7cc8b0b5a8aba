"""Sync on real files and a real SQLite index: hash skip, renames, deletions, rebuilds, pending."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from memd.changes import Changes
from memd.config import Config, IndexConfig
from memd.embed.fake import FakeEmbedder
from memd.index.audit import DumpRow
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.sync import Syncer

from .conftest import WriteFile

NOTE = "# Notes\n\nThe deploy key lives in the vault.\nAlice prefers green tea.\n"


def dump(index: Index) -> list[DumpRow]:
    with index.reader() as store:
        return store.dump()


def fresh_rebuild_dump(config: Config, workspace: Path, embedder: FakeEmbedder | None) -> list:
    """The oracle: a brand-new index of the same files."""
    idx = Index(config.index_dir / "oracle.sqlite", use_vec=config.index.sqlite_vec)
    idx.open()
    try:
        Syncer(idx, workspace, config=config.index, embedder=embedder).sync()
        return dump(idx)
    finally:
        idx.close()


def test_first_sync_indexes_every_file(syncer: Syncer, index: Index, write: WriteFile) -> None:
    write("MEMORY.md", NOTE)
    write("memory/2026-01-02.md", "- met Bob about the launch\n")
    report = syncer.sync()
    assert (report.indexed, report.pending_files, report.errors) == (2, 0, [])
    with index.reader() as store:
        counts = store.counts()
        assert index.writer().integrity() == []
    assert counts["files"] == 2
    assert counts["chunks"] == counts["vectors"] == counts["embedded_chunks"] == 2


def test_unchanged_files_are_skipped_without_reading(
    syncer: Syncer, fake: FakeEmbedder, write: WriteFile
) -> None:
    path = write("MEMORY.md", NOTE)
    old = time.time_ns() - 10_000_000_000
    os.utime(path, ns=(old, old))
    syncer.sync()
    calls = fake.calls
    report = syncer.sync()
    assert (report.indexed, report.unchanged) == (0, 1)
    assert fake.calls == calls


def test_touched_but_identical_file_is_not_reindexed(
    syncer: Syncer, fake: FakeEmbedder, write: WriteFile, index: Index
) -> None:
    path = write("MEMORY.md", NOTE)
    syncer.sync()
    generation = _generation(index)
    os.utime(path, ns=(time.time_ns(), time.time_ns() - 5_000_000_000))
    report = syncer.sync()
    assert (report.indexed, report.unchanged) == (0, 1)
    assert _generation(index) == generation


def texts(index: Index) -> str:
    with index.reader() as store:
        return "".join(str(r[0]) for r in store.conn.execute("SELECT text FROM chunks"))


def test_same_size_and_mtime_rewrite_is_found_when_named_or_on_reindex(
    syncer: Syncer, write: WriteFile, index: Index, workspace: Path
) -> None:
    """`cp -p` and `touch -r` rewrite a file keeping its size and mtime: the periodic
    reconcile may trust them, but a file event or an explicit reindex compares content."""
    path = write("memory/2026-01-02.md", "The release train leaves on Monday.\n")
    old = time.time_ns() - 10_000_000_000
    os.utime(path, ns=(old, old))
    syncer.sync()

    def rewrite(text: str) -> None:
        path.write_text(text)
        os.utime(path, ns=(old, old))

    rewrite("The release train leaves on Friday.\n")  # same size, same mtime
    assert syncer.sync().indexed == 0, "the cheap periodic check trusts size and mtime"
    report = syncer.sync(paths=Changes.of({"memory/2026-01-02.md"}))  # what a file event asks for
    assert report.indexed == 1
    assert "Friday" in texts(index)
    rewrite("The release train leaves on Sunday.\n")
    syncer.compare_contents_next()  # what `memctl reindex` (without --force) asks for
    assert syncer.sync().indexed == 1
    assert "Sunday" in texts(index)
    assert not syncer._look_next


def test_edit_replaces_only_that_file(syncer: Syncer, write: WriteFile, index: Index) -> None:
    write("MEMORY.md", NOTE)
    write("memory/topic.md", "Rust notes\n")
    syncer.sync()
    write("memory/topic.md", "Python notes instead\n")
    report = syncer.sync()
    assert report.indexed == 1
    texts = {row[0] for row in dump(index)}
    assert texts == {"MEMORY.md", "memory/topic.md"}
    with index.reader() as store:
        chunk = store.reads.chunks_by_id(
            [r.id for r in store.reads.keyword_candidates('"python"', None, 5)]
        )
    assert [c.text for c in chunk] == ["Python notes instead"]


def test_deleted_file_rows_are_removed(syncer: Syncer, write: WriteFile, index: Index) -> None:
    write("MEMORY.md", NOTE)
    gone = write("memory/old.md", "obsolete plan\n")
    syncer.sync()
    gone.unlink()
    report = syncer.sync()
    assert report.removed == 1
    with index.reader() as store:
        assert set(store.files()) == {"MEMORY.md"}
        assert store.reads.keyword_candidates('"obsolete"', None, 5) == []
        assert index.writer().integrity() == []


def test_rename_does_not_embed_again(
    syncer: Syncer, fake: FakeEmbedder, workspace: Path, write: WriteFile, index: Index
) -> None:
    write("memory/a.md", NOTE * 20)
    syncer.sync()
    embedded = fake.texts_embedded
    assert embedded > 0
    (workspace / "memory/a.md").rename(workspace / "memory/b.md")
    report = syncer.sync()
    assert (report.indexed, report.removed) == (1, 1)
    assert fake.texts_embedded == embedded
    assert report.cache_hits > 0
    assert {row[0] for row in dump(index)} == {"memory/b.md"}
    assert all(row[5] for row in dump(index)), "every chunk has its vector"


TALK = "# Talk\n\nAlice: I adopted a puppy.\nBob: What is its name?\nok\n\nAlice: Biscuit.\n"
TALK_LINES = ["Alice: I adopted a puppy.", "Bob: What is its name?", "Alice: Biscuit."]


def line_vectors(index: Index, path: str) -> np.ndarray | None:
    with index.reader() as store:
        (chunk_id,) = [
            int(r[0]) for r in store.conn.execute("SELECT id FROM chunks WHERE path = ?", (path,))
        ]
        return store.reads.line_vectors([chunk_id]).get(chunk_id)


@pytest.mark.parametrize("first_try_fails", [False, True])
def test_lines_get_vectors_of_their_own(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder, first_try_fails: bool
) -> None:
    """Each line of four or more characters that is not a heading gets a vector, stored with
    the chunk's own, whether the chunk is embedded at once or later (after an outage)."""
    write("memory/talk.md", TALK)
    write("MEMORY.md", "One line only.\n")
    fake.fail = first_try_fails
    syncer.sync()
    if first_try_fails:
        assert line_vectors(index, "memory/talk.md") is None
        assert index.writer().integrity() == []
        fake.fail = False
        syncer.reset_backoff()
        syncer.sync()
    assert {row[0]: row[7] for row in dump(index)} == {"memory/talk.md": 3, "MEMORY.md": 0}
    stored = line_vectors(index, "memory/talk.md")
    assert stored is not None
    # float16 in the index: equal to the embedder's own vectors to about 1e-3
    np.testing.assert_allclose(stored.astype(np.float32), fake.embed_batch(TALK_LINES), atol=2e-3)
    write("memory/talk.md", "Alice: no more puppies.\nBob: fine.\n")
    syncer.sync()
    assert {row[0]: row[7] for row in dump(index)} == {"memory/talk.md": 2, "MEMORY.md": 0}
    assert index.writer().integrity() == [], "the old chunk's line vectors went with it"


def test_an_index_from_before_line_vectors_is_rebuilt(
    syncer: Syncer, index: Index, write: WriteFile
) -> None:
    """An index whose identity predates line vectors has none: it is rebuilt with them."""
    write("memory/talk.md", TALK)
    syncer.sync()
    store = index.writer()
    with store.conn:
        identity = store.identity()
        assert identity is not None
        del identity["lines"]
        store.set_identity(identity)
        store.conn.execute("DELETE FROM chunk_lines")
    assert syncer.state() == ("mismatched", "lines")
    report = syncer.sync()
    assert report.rebuilt and syncer.state() == ("valid", None)
    assert [row[7] for row in dump(index)] == [3]


def test_incremental_result_equals_fresh_rebuild(
    syncer: Syncer,
    config: Config,
    workspace: Path,
    write: WriteFile,
    fake: FakeEmbedder,
    index: Index,
) -> None:
    write("MEMORY.md", NOTE)
    for day in range(1, 8):
        write(f"memory/2026-02-0{day}.md", f"day {day}\n" + "line of log text\n" * (day * 40))
    syncer.sync()
    write("memory/2026-02-03.md", "rewritten\n")
    (workspace / "memory/2026-02-05.md").unlink()
    (workspace / "memory/2026-02-06.md").rename(workspace / "memory/renamed.md")
    write("memory/new/deep.md", "a new topic file\n" * 300)
    syncer.sync()
    assert dump(index) == fresh_rebuild_dump(config, workspace, fake)


def test_forced_rebuild_swaps_a_complete_index(
    syncer: Syncer, write: WriteFile, index: Index, fake: FakeEmbedder
) -> None:
    write("MEMORY.md", NOTE)
    syncer.sync()
    before = dump(index)
    embedded = fake.texts_embedded
    report = syncer.sync(force=True)
    assert report.rebuilt and report.errors == []
    assert dump(index) == before
    assert fake.texts_embedded == embedded, "a rebuild takes its vectors from the cache"
    assert index.epoch == 1
    assert list(index.path.parent.glob("*.tmp-*")) == []


def test_interrupted_rebuild_leaves_old_index_intact(
    syncer: Syncer,
    write: WriteFile,
    index: Index,
    fake: FakeEmbedder,
    config: Config,
    workspace: Path,
    cache: EmbeddingCache,
) -> None:
    write("MEMORY.md", NOTE)
    syncer.sync()
    before = dump(index)
    # A new model is configured, but it fails half-way: the rebuild must not publish.
    other = FakeEmbedder(dims=32, model="other")
    other.fail = True
    rebuilding = Syncer(index, workspace, config=config.index, embedder=other, cache=cache)
    report = rebuilding.sync()
    assert report.rebuilt
    assert "old index kept" in report.errors[-1][1]
    assert dump(index) == before
    assert list(index.path.parent.glob("*.tmp-*")) == []
    # Once the model works the rebuild completes and the identity changes.
    other.fail = False
    assert "rebuild waits" in rebuilding.sync().errors[0][1]
    rebuilding.reset_backoff()
    report = rebuilding.sync()
    assert report.errors == [] and report.rebuilt
    with index.reader() as store:
        assert store.identity()["model"] == "other"  # type: ignore[index]
        assert index.writer().integrity() == []


def test_leftovers_of_a_killed_rebuild_are_removed_at_open(config: Config) -> None:
    path = config.index_dir / "ws.sqlite"
    path.parent.mkdir(parents=True)
    leftovers = [Path(f"{path}.tmp-dead{s}") for s in ("", "-wal", "-shm")]
    for p in leftovers:
        p.write_bytes(b"junk")
    idx = Index(path)
    idx.open()
    idx.close()
    assert not any(p.exists() for p in leftovers)


def test_embedding_failure_keeps_file_pending_then_recovers(
    syncer: Syncer, fake: FakeEmbedder, write: WriteFile, index: Index
) -> None:
    write("MEMORY.md", NOTE)
    syncer.sync()
    write("memory/new.md", "fresh fact about the rollout\n")
    fake.fail = True
    report = syncer.sync()
    assert report.pending_files == 1
    assert "embedding failed" in report.errors[0][1]
    with index.reader() as store:
        assert store.file("memory/new.md").pending == 1  # type: ignore[union-attr]
        assert store.file("memory/new.md").error  # type: ignore[union-attr]
        # keyword rows are usable before the vector exists
        assert store.reads.keyword_candidates('"rollout"', None, 5)
    fake.fail = False
    # The next attempt waits for the backoff, so an outage does not stall every sync.
    assert syncer.backing_off()
    report = syncer.sync()
    assert report.pending_files == 1 and report.embedded == 0
    syncer.reset_backoff()
    report = syncer.sync()
    assert report.pending_files == 0 and report.embedded == 1
    with index.reader() as store:
        assert index.writer().integrity() == []


def test_zero_vectors_from_a_provider_keep_the_file_pending_and_are_never_cached(
    index: Index, workspace: Path, config: Config, cache: EmbeddingCache, write: WriteFile
) -> None:
    """A provider (here a real HTTP server in OpenAI's shape) that answers an all-zero vector
    for a text, which matches nothing: the file stays pending with the reason, the vector is
    never cached, and the other files get their vectors."""
    from memd.config import EmbeddingConfig
    from memd.embed.providers import create_remote

    from .provider_server import FakeProvider, Seen

    def reply(seen: Seen) -> tuple[int, dict[str, str], object]:
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": [0.0] * 4 if "poison" in t else [float(len(t)), 1.0, 0.0, 0.5],
            }
            for i, t in enumerate(seen.body["input"])
        ]
        return 200, {}, {"object": "list", "data": data}

    server = FakeProvider()
    server.responder = reply
    try:
        remote = create_remote(
            "openai",
            EmbeddingConfig(base_url=server.url + "/v1", dimensions=4),
            {"OPENAI_API_KEY": "sk-test-" + "k" * 20},
        )
        syncer = Syncer(index, workspace, config=config.index, embedder=remote, cache=cache)
        write("MEMORY.md", "The staging cluster is called Orion.\n")
        write("memory/bad.md", "a poison line\n")
        report = syncer.sync()
        assert report.pending_files == 1
        assert any("all zero" in why for _, why in report.errors)
        with index.reader() as store:
            bad = store.file("memory/bad.md")
            assert bad is not None and bad.pending == 1 and "all zero" in (bad.error or "")
            memory = store.file("MEMORY.md")
            assert memory is not None and memory.pending == 0
        assert cache.count() == 1  # MEMORY.md's one text; never a zero vector
    finally:
        server.close()


def test_protection_rule_keeps_vectors_when_provider_disappears(
    syncer: Syncer,
    write: WriteFile,
    index: Index,
    config: Config,
    workspace: Path,
    cache: EmbeddingCache,
) -> None:
    write("MEMORY.md", NOTE)
    syncer.sync()
    vectors_before = dump(index)
    unavailable = Syncer(
        index, workspace, config=config.index, embedder=None, cache=cache, protect=True
    )
    assert unavailable.state() == ("protected", "provider")
    write("memory/later.md", "written while the provider was down\n")
    report = unavailable.sync()
    assert not report.rebuilt and report.pending_files == 1
    after = dump(index)
    assert [r for r in after if r[0] == "MEMORY.md"] == vectors_before
    with index.reader() as store:
        assert store.identity()["provider"] == "fake"  # type: ignore[index]
    # The provider comes back: the pending file gets its vectors, nothing is rebuilt.
    report = syncer.sync()
    assert not report.rebuilt and report.pending_files == 0


def test_chosen_keyword_only_mode_rebuilds_without_vectors(
    syncer: Syncer, write: WriteFile, index: Index, config: Config, workspace: Path
) -> None:
    write("MEMORY.md", NOTE)
    syncer.sync()
    report = Syncer(index, workspace, config=config.index, embedder=None).sync()
    assert report.rebuilt and report.reason == "provider"
    assert all(not row[5] and row[6] == "fts-only" for row in dump(index))


def test_chunk_setting_change_triggers_rebuild(
    syncer: Syncer,
    write: WriteFile,
    index: Index,
    workspace: Path,
    fake: FakeEmbedder,
    cache: EmbeddingCache,
) -> None:
    write("MEMORY.md", "line\n" * 2000)
    syncer.sync()
    n = len(dump(index))
    small = IndexConfig(chunk_tokens=100, chunk_overlap=10)
    report = Syncer(index, workspace, config=small, embedder=fake, cache=cache).sync()
    assert report.rebuilt and report.reason == "chunk_tokens"
    assert len(dump(index)) > n


def test_readers_keep_working_across_a_swap(syncer: Syncer, write: WriteFile, index: Index) -> None:
    write("MEMORY.md", NOTE)
    syncer.sync()
    with index.reader() as store:
        assert store.reads.keyword_candidates('"vault"', None, 5)
    syncer.rebuild()
    with index.reader() as store:
        assert store.reads.keyword_candidates('"vault"', None, 5)


def test_oversized_file_is_indexed_in_part_and_reported(
    index: Index, workspace: Path, write: WriteFile
) -> None:
    write("memory/huge.md", "first line\n" + "x" * 5000)
    write("MEMORY.md", NOTE)
    syncer = Syncer(index, workspace, config=IndexConfig(max_file_bytes=1000))
    report = syncer.sync()
    assert not report.skipped and syncer.status.partial == {"memory/huge.md": 5011}
    with index.reader() as store:
        assert set(store.files()) == {"MEMORY.md", "memory/huge.md"}
        texts = [str(r[0]) for r in store.conn.execute("SELECT text FROM chunks")]
    assert "first line" in texts and not any("xxx" in t for t in texts)


@pytest.mark.parametrize("use_vec", [True, False])
def test_numpy_fallback_and_vec0_store_the_same_rows(
    use_vec: bool, config: Config, workspace: Path, write: WriteFile, fake: FakeEmbedder
) -> None:
    write("MEMORY.md", NOTE)
    idx = Index(config.index_dir / f"v{use_vec}.sqlite", use_vec=use_vec)
    idx.open()
    try:
        Syncer(idx, workspace, config=config.index, embedder=fake).sync()
        assert idx.writer().integrity() == []
        with idx.reader() as store:
            assert store.vector_store == ("vec0" if use_vec else "plain")
            rows = store.reads.vector_candidates(fake.embed_query("green tea"), None, 3)
        assert rows and rows[0].path == "MEMORY.md"
        if not use_vec:
            assert "disabled" in idx.vec.error
    finally:
        idx.close()


def _generation(index: Index) -> int:
    with index.reader() as store:
        return store.generation()


KILL_SCRIPT = """
import sys, time
from collections.abc import Sequence
from pathlib import Path
from memd.config import IndexConfig
from memd.embed.fake import FakeEmbedder
from memd.index.index import Index
from memd.index.audit import DumpRow
from memd.index.sync import Syncer

class Slow(FakeEmbedder):
    def embed_batch(self, texts, *, kind="document"):
        print("embedding", flush=True)
        time.sleep(0.2)
        return super().embed_batch(texts, kind=kind)

index = Index(Path(sys.argv[1]))
index.open()
Syncer(index, Path(sys.argv[2]), config=IndexConfig(), embedder=Slow(dims=32, model="slow"),
       cache=None).rebuild()
print("finished", flush=True)
"""


def test_rebuild_killed_midway_leaves_old_index_intact(
    syncer: Syncer, write: WriteFile, index: Index, workspace: Path
) -> None:
    import signal
    import subprocess
    import sys

    for i in range(30):
        write(f"memory/topic-{i}.md", f"topic {i}\n" + "some remembered detail\n" * 200)
    syncer.sync()
    before = dump(index)
    index.close()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(index.path), str(workspace)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "embedding"  # the rebuild is under way
    assert list(index.path.parent.glob("*.tmp-*")), "the rebuild writes a temporary database"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    index.open()  # as the daemon does at start: leftovers go, the old index is what it was
    assert list(index.path.parent.glob("*.tmp-*")) == []
    assert dump(index) == before
    assert index.writer().integrity() == []


def test_writes_during_a_rebuild_reach_the_new_index(
    syncer: Syncer,
    write: WriteFile,
    index: Index,
    workspace: Path,
    config: Config,
    cache: EmbeddingCache,
) -> None:
    """The daemon rebuilds on its own thread while the writer keeps syncing the live index."""
    import threading

    write("MEMORY.md", NOTE)
    syncer.sync()
    gate = threading.Event()
    entered = threading.Event()

    class Gated(FakeEmbedder):
        def embed_batch(self, texts, *, kind="document"):  # type: ignore[no-untyped-def]
            if kind == "document":
                entered.set()
                gate.wait(10)
            return super().embed_batch(texts, kind=kind)

    new = Syncer(
        index, workspace, config=config.index, embedder=Gated(dims=32, model="new"), cache=cache
    )
    result: list[object] = []
    builder = threading.Thread(target=lambda: result.append(new.rebuild(reason="model")))
    builder.start()
    assert entered.wait(10)  # the rebuild is embedding into its temporary file
    write("memory/during.md", "written while the new index was being built\n")
    report = new.sync(embed=False, allow_rebuild=False)  # what the writer thread does
    assert not report.rebuilt and report.indexed == 1
    with index.reader() as store:  # live index: old identity, new text searchable at once
        assert store.identity()["model"] == "fake-bow"  # type: ignore[index]
        assert store.reads.keyword_candidates('"during"', None, 5)
        assert store.vector_ids() == {
            r.id for r in store.reads.chunks_by_id(range(1, 100)) if r.path == "MEMORY.md"
        }
    gate.set()
    builder.join(20)
    assert result and not result[0].errors  # type: ignore[attr-defined]
    with index.reader() as store:
        assert store.identity()["model"] == "new"  # type: ignore[index]
        assert {row[0] for row in store.dump()} == {"MEMORY.md", "memory/during.md"}
        assert all(row[5] for row in store.dump()), "caught-up files got vectors too"
    assert index.writer().integrity() == []


def test_targeted_sync_reads_only_the_named_paths(
    syncer: Syncer, write: WriteFile, index: Index, workspace: Path
) -> None:
    from memd.markdown.discover import memory_file

    write("MEMORY.md", NOTE)
    write("memory/a.md", "alpha\n")
    syncer.sync()
    write("memory/a.md", "alpha changed\n")
    write("memory/b.md", "bravo\n")  # not named: a targeted sync must not see it
    report = syncer.sync(paths=Changes.of({"memory/a.md"}))
    assert (report.scanned, report.indexed) == (1, 1)
    assert {row[0] for row in dump(index)} == {"MEMORY.md", "memory/a.md"}
    (workspace / "memory/a.md").unlink()
    assert syncer.sync(paths=Changes.of({"memory/a.md"})).removed == 1
    # Anything a targeted look cannot judge falls back to a full reconcile.
    assert memory_file(workspace, "notes/x.md")[0] == "rescan"
    assert memory_file(workspace, "memory/../MEMORY.md")[0] == "gone"
    (workspace / "memory" / "link.md").symlink_to(workspace / "MEMORY.md")
    assert memory_file(workspace, "memory/link.md")[0] == "gone"
    report = syncer.sync(paths=Changes.of({"notes/x.md"}))
    assert {row[0] for row in dump(index)} == {"MEMORY.md", "memory/b.md"}
    assert index.writer().integrity() == []


def test_a_growing_log_rewrites_only_its_tail(
    syncer: Syncer,
    config: Config,
    workspace: Path,
    write: WriteFile,
    fake: FakeEmbedder,
    index: Index,
) -> None:
    # A daily log grows by appends all day; each sync must keep the rows of the chunks that
    # did not change (ids, FTS entries, vectors) and still equal a fresh rebuild.
    lines = [f"- 10:{i:02d} note {i} about the orion cluster and its backups\n" for i in range(60)]
    path = write("memory/2026-03-01.md", "".join(lines))
    syncer.sync()
    write("memory/2026-03-02.md", "Another day.\n")  # its chunk takes the next id
    syncer.sync()
    rel = "memory/2026-03-01.md"

    def rows() -> list[tuple[int, int, int]]:
        with index.reader() as store:
            return [
                (int(r[0]), int(r[1]), int(r[2]))
                for r in store.conn.execute(
                    "SELECT id, start_line, end_line FROM chunks WHERE path = ? "
                    "ORDER BY start_line",
                    (rel,),
                )
            ]

    before = rows()
    assert len(before) >= 3
    with path.open("a") as f:
        f.write("- 11:00 one more note about the canary release\n")
    assert syncer.sync().indexed == 1
    after = rows()
    assert after[:-1] == before[:-1]  # unchanged chunks keep their rows
    assert after[-1][0] > max(i for i, _, _ in before)  # the tail is a new row
    assert after[-1][2] == before[-1][2] + 1
    assert dump(index) == fresh_rebuild_dump(config, workspace, fake)

    # Rewritten from the top: still a rebuild's equal.
    path.write_text("# Rewritten\n\n" + "".join(lines[:10]))
    syncer.sync()
    assert dump(index) == fresh_rebuild_dump(config, workspace, fake)


def test_utf16_memory_file_is_read_and_redacted(
    syncer: Syncer, workspace: Path, index: Index
) -> None:
    """An editor's "Unicode" save (UTF-16 with a BOM) read as UTF-8 matched no keyword and no
    redaction pattern."""
    path = workspace / "memory" / "2026-01-03.md"
    path.write_bytes("The vault password = hunter2!xyz\nDeploys on Fridays.\n".encode("utf-16"))
    syncer.sync()
    body = texts(index)
    assert "Deploys on Fridays." in body
    assert "hunter2" not in body and "[REDACTED]" in body


class CountingEmbedder(FakeEmbedder):
    """A FakeEmbedder that counts token-count requests (each is a round trip to a real model)."""

    def __init__(self) -> None:
        super().__init__()
        self.token_counts = 0

    def count_tokens(self, text: str) -> int:
        self.token_counts += 1
        return super().count_tokens(text)


def test_reindexing_an_appended_log_redacts_and_counts_only_what_is_new(
    workspace: Path, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends cost O(appended text), not O(file): the redaction of unchanged lines and the
    token counts of unchanged chunks are remembered. (The redaction counter wraps the real
    function: how often it runs cannot be seen from outside.)"""
    from memd.redact import engine as redact_module

    blocks: list[str] = []
    real = redact_module._redact_block
    monkeypatch.setattr(
        redact_module, "_redact_block", lambda b, *rest: (blocks.append(b), real(b, *rest))[1]
    )
    embedder = CountingEmbedder()
    index = Index(config.index_dir / "append.sqlite")
    index.open()
    try:
        syncer = Syncer(index, workspace, config=config.index, embedder=embedder)
        log = workspace / "memory" / "2026-01-04.md"
        log.write_text("".join(f"- entry {i}: met Bob about launch {i}\n" for i in range(3000)))
        syncer.sync()
        assert len(blocks) >= 3000 and embedder.token_counts > 20
        blocks.clear()
        embedder.token_counts = 0
        with log.open("a") as f:
            f.write("- the staging cluster is renamed to vega\n")
        report = syncer.sync(paths=Changes.of({"memory/2026-01-04.md"}))
        assert report.indexed == 1
        assert len(blocks) <= 2, "only the appended lines are redacted again"
        assert embedder.token_counts <= 3, "only the changed chunks are counted again"
    finally:
        index.close()


def test_a_long_file_is_embedded_in_steps_and_equals_a_fresh_rebuild(
    syncer: Syncer,
    config: Config,
    workspace: Path,
    write: WriteFile,
    fake: FakeEmbedder,
    index: Index,
) -> None:
    """The daemon's writer embeds about ``max_chars`` of new text per call: a long file takes
    several calls, stays pending (and keyword-searchable) until the last, and then holds the
    same vectors as an index built in one go."""
    write("MEMORY.md", NOTE)
    syncer.sync()
    write(
        "memory/long.md", "".join(f"- decision {n}: ship the orion release\n" for n in range(300))
    )
    syncer.sync(embed=False, paths=Changes.of({"memory/long.md"}))
    assert syncer.has_pending()
    steps = 0
    while syncer.has_pending():
        embedded = fake.documents_embedded
        syncer.embed_pending(max_files=1, max_chars=1024)
        steps += 1
        # one step embeds about 1,024 characters: 26 lines of 38, or one chunk
        assert fake.documents_embedded - embedded <= 30
        assert steps < 200
    assert steps > 5
    assert dump(index) == fresh_rebuild_dump(config, workspace, fake)


def test_the_writers_steps_do_not_count_the_vector_table(
    syncer: Syncer, workspace: Path, write: WriteFile, index: Index
) -> None:
    """Counting a vector table reads every vector (over 90 ms at 100,000 chunks): the writer
    runs a sync and an embedding step every second or so and needs only the other counts."""
    write("MEMORY.md", NOTE)
    syncer.sync()
    write("memory/long.md", "".join(f"- decision {n}: ship the orion release\n" for n in range(90)))
    syncer.sync(embed=False, paths=Changes.of({"memory/long.md"}))
    statements: list[str] = []
    conn = index.writer().conn

    def trace(_cursor: object, sql: str, _bindings: object) -> bool:
        statements.append(sql)
        return True

    conn.exec_trace = trace
    try:
        syncer.embed_pending(max_files=1, max_chars=1024)
        with (workspace / "memory/long.md").open("a") as f:
            f.write("- one more decision\n")
        syncer.sync(embed=False, paths=Changes.of({"memory/long.md"}))
    finally:
        conn.exec_trace = None
    assert any("FROM chunks" in s for s in statements), "the trace saw the writer's statements"
    assert not [s for s in statements if re.search(r"count\(\*\) FROM chunks_vec", s)]
    with index.reader() as store:  # status still counts them
        assert store.counts()["vectors"] == store.counts(vectors=False)["embedded_chunks"]


def test_count_stale_reads_every_row_in_one_statement(
    syncer: Syncer, workspace: Path, write: WriteFile, index: Index
) -> None:
    from memd.freshness import count_stale

    for name in ("a", "b", "c"):
        write(f"memory/{name}.md", f"note {name}\n")
    syncer.sync()
    write("memory/a.md", "note a, edited to another size\n")  # changed
    (workspace / "memory/b.md").unlink()  # gone from disk, still indexed
    write("memory/new.md", "not indexed yet\n")  # new
    keys = {"memory/a.md", "memory/b.md", "memory/c.md", "memory/new.md", "memory/never.md"}
    with index.reader() as store:
        assert count_stale(store, workspace, keys) == 3
        assert set(store.file_stats(keys)) == {"memory/a.md", "memory/b.md", "memory/c.md"}


def test_a_growing_daily_log_equals_a_fresh_rebuild(
    syncer: Syncer,
    config: Config,
    workspace: Path,
    write: WriteFile,
    fake: FakeEmbedder,
    index: Index,
) -> None:
    """Appends keep the stored chunks and their vectors (only the others are looked up in the
    cache); the index still equals a fresh rebuild."""
    log = workspace / "memory" / "2026-03-01.md"
    write("memory/2026-03-01.md", "")
    for n in range(60):
        with log.open("a", encoding="utf-8") as f:
            f.write(f"- note {n}: the orion cluster was resized to {n} nodes\n")
        syncer.sync(paths=Changes.of({"memory/2026-03-01.md"}))
    assert dump(index) == fresh_rebuild_dump(config, workspace, fake)


class CountingTokens(FakeEmbedder):
    """Counts the asks for token counts (each a round trip to a model in its own process)."""

    def __init__(self) -> None:
        super().__init__()
        self.single: list[str] = []
        self.batches: list[int] = []

    def count_tokens(self, text: str) -> int:
        self.single.append(text)
        return super().count_tokens(text)

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        self.batches.append(len(texts))
        return [super(CountingTokens, self).count_tokens(t) for t in texts]


def test_a_file_asks_for_its_token_counts_in_one_round_trip(
    index: Index, workspace: Path, config: Config, write: WriteFile, cache: EmbeddingCache
) -> None:
    counting = CountingTokens()
    syncer = Syncer(index, workspace, config=config.index, embedder=counting, cache=cache)
    write(
        "memory/topic.md",
        "".join(f"## part {n}\n\n" + "orion notes. " * 120 + "\n\n" for n in range(6)),
    )
    syncer.sync()
    assert counting.batches and max(counting.batches) >= 6
    assert counting.single == []  # nothing over the model's limit: no ask one by one
    counting.batches.clear()
    syncer.sync(force=True)  # the same chunks again: remembered, not asked
    assert counting.batches == []


def test_a_file_named_star_is_indexed_as_a_file_not_taken_for_a_rescan(
    syncer: Syncer, write: WriteFile, index: Index
) -> None:
    """Rescans travel as flags of Changes, never as path-like keys: "*" is a path like any
    other, and a memory file named "*.md" is synced alone, like any named file."""
    star = Changes.of(["*"])
    assert star.paths == {"*"} and not star.rescans and not star.rescan_all
    assert (star | Changes.everything()).rescan_all and len(star | Changes.sessions()) == 2
    assert (star | Changes.everything()) - Changes.everything() == star
    write("MEMORY.md", NOTE)
    syncer.sync()
    write("memory/*.md", "a note in a file named star\n")
    write("memory/b.md", "bravo\n")  # not named: a rescan would index it
    report = syncer.sync(paths=Changes.of(["memory/*.md"]))
    assert (report.scanned, report.indexed) == (1, 1)
    assert {row[0] for row in dump(index)} == {"MEMORY.md", "memory/*.md"}


def test_the_newest_text_is_embedded_first(
    syncer: Syncer, fake: FakeEmbedder, write: WriteFile, index: Index
) -> None:
    """The embedding backlog goes most recently changed file first, whatever the names say
    (an old log edited today goes before last week's), and files whose embedding failed go
    after the others. A failure stops a pass once a second file in a row fails too."""
    day = 86_400
    now = time.time()
    for rel, age in (
        ("memory/2026-01-01.md", 30),
        ("memory/2026-01-02.md", 0),
        ("memory/2026-01-03.md", 7),
        ("MEMORY.md", 2),
    ):
        path = write(rel, f"what happened in {rel}: the plan moved\n")
        os.utime(path, (now - age * day, now - age * day))
    fake.fail = True  # keyword rows now, every vector pending
    syncer.sync()
    with index.reader() as store:
        failed = {p for p in store.pending_paths() if store.file(p).error}  # type: ignore[union-attr]
    assert failed == {"memory/2026-01-02.md", "MEMORY.md"}  # the newest two, then it stopped
    fake.fail = False
    syncer.reset_backoff()
    order: list[str] = []
    for _ in range(4):
        with index.reader() as store:
            before = set(store.pending_paths())
        syncer.embed_pending(max_files=1)
        with index.reader() as store:
            order.extend(before - set(store.pending_paths()))
    assert order == [
        "memory/2026-01-03.md",
        "memory/2026-01-01.md",
        "memory/2026-01-02.md",
        "MEMORY.md",
    ]
