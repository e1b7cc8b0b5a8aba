"""A file that grew at its end is indexed from its resume point only, and the index still
equals a fresh one; a file over index.max_file_bytes keeps its head searchable.

Real files, real SQLite; the oracle is a brand-new index of the same files.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.changes import Changes
from memd.config import Config, IndexConfig
from memd.embed.fake import FakeEmbedder
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.redact import reads_whole_text, redact, starts_block

LOG = "memory/2026-03-04.md"

# Lines of the kinds that move chunk boundaries and redaction: long lines cut into pieces,
# CJK (weighs more), blank and whitespace-only lines, lines that continue a block of redaction
# (indented, table rows, lone words, after a backslash), secrets on one line and over two,
# private keys, headings, CRLF endings.
LINES = st.one_of(
    st.sampled_from(
        [
            "",
            "   ",
            "# Heading",
            "- met Bob about the launch",
            "  indented detail under the line above",
            "password:",
            "    hunter2-Secret!99",
            "token = sk-live-9fQ2xL7mB4vR1tZ8kP3wN6yH5jD0cS2a",
            "部署到生产环境之前先检查数据库迁移",
            "x" * 150,
            "word " * 40,
            "the deploy of build 42 to staging failed on the flaky test\r",
            "| password | hunter2-Secret!99 |",
            "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9",
            "export API_TOKEN=x9fQ2xL7mB4vR1tZ8kP3 \\",
            '{"kty": "RSA", "d": "aB3dE5fG7hJ9kL1mN3pQ5rS7"}',
            "-----BEGIN PRIVATE KEY-----",
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC",
        ]
    ),
    st.text(alphabet="abc xyz\t", min_size=0, max_size=90),
)


def appended(lines: list[str], end: bool) -> str:
    return "\n".join(lines) + ("\n" if end else "")


# (lines appended, whether they end with a line end, whether only the path is synced, whether
# the file's first line is dropped too: an edit, not an append)
STEPS = st.lists(
    st.tuples(
        st.lists(LINES, min_size=1, max_size=12),
        st.booleans(),
        st.booleans(),
        st.integers(0, 5).map(lambda n: n == 0),
    ),
    min_size=1,
    max_size=8,
)


@contextmanager
def workspace_and_index(config: IndexConfig) -> Iterator[tuple[Path, Index, Syncer, Any]]:
    """A workspace and its index in a temporary directory of their own (one per example)."""
    tmp = Path(tempfile.mkdtemp(prefix="memd-tail-"))
    try:
        root = tmp / "ws"
        (root / "memory").mkdir(parents=True)
        index = Index(tmp / "ws.sqlite")
        index.open()
        cache = EmbeddingCache(tmp / "cache.sqlite")
        fake = FakeEmbedder(max_tokens=14)  # below the chunk size: fit_to_model splits too
        syncer = Syncer(index, root, config=config, embedder=fake, cache=cache)
        try:
            yield root, index, syncer, (tmp, fake)
        finally:
            cache.close()
            index.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def snapshot(index: Index) -> tuple[list[Any], list[Any]]:
    """Every chunk row and every file row, as a fresh index would have them."""
    with index.reader() as store:
        files = sorted(
            (r.path, r.hash, r.size, r.chunks, r.pending) for r in store.files().values()
        )
        return store.dump(), files


def fresh(root: Path, config: IndexConfig, tmp: Path, fake: FakeEmbedder) -> tuple[Any, Any]:
    idx = Index(tmp / "oracle.sqlite")
    idx.open()
    try:
        Syncer(idx, root, config=config, embedder=fake).sync()
        return snapshot(idx)
    finally:
        idx.close()
        for leftover in tmp.glob("oracle.sqlite*"):
            leftover.unlink()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(start=st.lists(LINES, max_size=30), steps=STEPS, cap=st.sampled_from([1 << 20, 900]))
def test_appends_indexed_from_the_tail_equal_a_fresh_index(
    start: list[str], steps: list[tuple[list[str], bool, bool, bool]], cap: int
) -> None:
    """Generated append sequences (some ending mid-line, some syncing only the named path,
    some crossing a small size cap, a few edits among them): after every step the rows equal a
    fresh index."""
    config = IndexConfig(chunk_tokens=16, chunk_overlap=4, max_file_bytes=cap)
    with workspace_and_index(config) as (root, index, syncer, (tmp, fake)):
        log = root / LOG
        log.write_bytes(appended(start, True).encode())
        syncer.sync()
        for lines, end, named, edit in steps:
            if edit:
                log.write_bytes(log.read_bytes().partition(b"\n")[2])
            with open(log, "ab") as f:
                f.write(appended(lines, end).encode())
            report = syncer.sync(paths=Changes.of({LOG}) if named else None)
            assert not report.errors
            assert snapshot(index) == fresh(root, config, tmp, fake)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(LINES, min_size=1, max_size=40))
def test_redaction_from_a_block_start_gives_the_rest_of_the_whole(lines: list[str]) -> None:
    """What the tail path relies on (memd/redact/engine.py): from a line where a block starts,
    redacting the rest of a text gives what redacting the whole text gives there, unless a
    rule reads the whole text."""
    text = "\n".join(lines) + "\n"
    if reads_whole_text(text):
        return
    whole = redact(text).split("\n")
    for i in range(1, len(lines)):
        if starts_block(lines[i - 1], lines[i]):
            assert redact("\n".join(lines[i:]) + "\n").split("\n") == whole[i:], i


def test_an_append_to_a_long_log_rewrites_only_its_tail(
    index: Index, workspace: Path, config: Config, cache: EmbeddingCache
) -> None:
    fake = FakeEmbedder()
    syncer = Syncer(index, workspace, config=config.index, embedder=fake, cache=cache)
    log = workspace / LOG
    log.write_text("".join(f"- {i:04d} the deploy of build {i} went out\n" for i in range(3000)))
    syncer.sync()
    with index.reader() as store:
        before = {r[0]: r for r in store.conn.execute("SELECT id, hash FROM chunks")}
    embedded = fake.documents_embedded
    with open(log, "a") as f:
        f.write("- the staging cluster is renamed to vega\n")
    report = syncer.sync(paths=Changes.of({LOG}))
    assert syncer.status.tails == 1 and report.indexed == 1
    assert report.chunks_written <= 2, "only the last chunk and the new one"
    with index.reader() as store:
        after = {r[0]: r for r in store.conn.execute("SELECT id, hash FROM chunks")}
        assert store.reads.keyword_candidates('"vega"', None, 5)
    assert len(set(before) - set(after)) <= 1  # the old last chunk, grown
    assert fake.documents_embedded - embedded <= 20, "the new chunk and its lines only"
    assert snapshot(index) == fresh(workspace, config.index, config.index_dir, fake)


def test_a_change_before_the_end_indexes_the_file_whole(
    index: Index, workspace: Path, config: Config, cache: EmbeddingCache
) -> None:
    syncer = Syncer(index, workspace, config=config.index, embedder=FakeEmbedder(), cache=cache)
    log = workspace / LOG
    lines = [f"- {i:04d} the deploy of build {i} went out\n" for i in range(400)]
    log.write_text("".join(lines))
    syncer.sync()
    lines[10] = "- 0010 the deploy of build 10 was rolled back\n"
    log.write_text("".join(lines) + "- one more line\n")  # longer, but not by an append
    syncer.sync(paths=Changes.of({LOG}))
    assert syncer.status.tails == 0
    with index.reader() as store:
        assert store.reads.keyword_candidates('"rolled"', None, 5)
    assert snapshot(index) == fresh(workspace, config.index, config.index_dir, FakeEmbedder())


def test_a_private_key_appended_is_redacted_as_in_a_fresh_index(
    index: Index, workspace: Path, config: Config, cache: EmbeddingCache
) -> None:
    """Private-key blocks are redacted over the whole text, not block by block: a log that
    holds one is indexed whole, so the key's lines before the resume point are redacted too."""
    syncer = Syncer(index, workspace, config=config.index, embedder=FakeEmbedder(), cache=cache)
    log = workspace / LOG
    body = "\n".join("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC" for _ in range(60))
    log.write_text("- notes\n-----BEGIN PRIVATE KEY-----\n" + body + "\nnot base64 at all\n")
    syncer.sync()
    with open(log, "a") as f:
        f.write("-----END PRIVATE KEY-----\n- after the key\n")
    syncer.sync(paths=Changes.of({LOG}))
    with index.reader() as store:
        text = "".join(str(r[0]) for r in store.conn.execute("SELECT text FROM chunks"))
    assert "MIIEvQIBADAN" not in text
    assert snapshot(index) == fresh(workspace, config.index, config.index_dir, FakeEmbedder())


def test_a_log_that_grows_past_the_cap_keeps_its_head_searchable(
    index: Index, workspace: Path, config: Config
) -> None:
    """The morning's notes were searchable; the log grows past index.max_file_bytes: they
    stay searchable (its first bytes are indexed), the file is reported as partly indexed,
    and later appends beyond the cap change nothing in the index."""
    cfg = IndexConfig(max_file_bytes=4000)
    syncer = Syncer(index, workspace, config=cfg)
    log = workspace / LOG
    log.write_text("- morning: the zebra migration is scheduled for Friday\n")
    syncer.sync()
    with open(log, "a") as f:
        f.write("".join(f"- {i:04d} routine line of the afternoon\n" for i in range(200)))
        f.write("- evening: the walrus cluster went down\n")
    report = syncer.sync(paths=Changes.of({LOG}))
    assert not report.errors and not report.skipped
    assert syncer.status.partial == {LOG: log.stat().st_size}
    with index.reader() as store:
        assert store.reads.keyword_candidates('"zebra"', None, 5), "the head stays searchable"
        assert not store.reads.keyword_candidates('"walrus"', None, 5), "past the cap"
        row = store.file(LOG)
        assert row is not None and row.size == log.stat().st_size  # not stale
    assert snapshot(index) == fresh(workspace, cfg, config.index_dir, None)
    with index.reader() as store:
        generation = store.generation()
    with open(log, "a") as f:
        f.write("- later still\n")
    report = syncer.sync(paths=Changes.of({LOG}))
    assert report.unchanged == 1 and report.indexed == 0
    with index.reader() as store:
        assert store.generation() == generation
    full = syncer.sync()  # a full reconcile says the same
    assert syncer.status.partial == {LOG: log.stat().st_size} and not full.skipped


def test_a_single_line_over_the_cap_is_cut_at_a_character(
    index: Index, workspace: Path, config: Config
) -> None:
    cfg = IndexConfig(max_file_bytes=1001)
    log = workspace / LOG
    log.write_text("é" * 2000)  # two bytes each: the cap falls inside a character
    report = Syncer(index, workspace, config=cfg).sync()
    assert not report.errors
    with index.reader() as store:
        texts = [str(r[0]) for r in store.conn.execute("SELECT text FROM chunks")]
    assert "".join(texts).strip("é") == ""  # no replacement character, nothing torn
    assert snapshot(index) == fresh(workspace, cfg, config.index_dir, None)
