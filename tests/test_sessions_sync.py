"""Transcripts in the syncer: when a grown transcript is reindexed, and how it is stored."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from memd.config import Config, SessionsConfig
from memd.index.audit import DumpRow
from memd.index.index import Index
from memd.index.sync import Syncer


def msg(text: str) -> str:
    return json.dumps({"type": "message", "message": {"role": "user", "content": text}}) + "\n"


@pytest.fixture
def setup(tmp_path: Path, config: Config, index: Index, workspace: Path) -> tuple[Syncer, Path]:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "s1.jsonl").write_text(msg("hello there") + "{broken\n" + msg("the cat is Tom"))
    syncer = Syncer(
        index,
        workspace,
        config=config.index,
        sessions_dir=sessions,
        sessions=SessionsConfig(delta_bytes=2000, delta_messages=3, idle_seconds=60),
    )
    syncer.sync()
    return syncer, sessions / "s1.jsonl"


def rows(syncer: Syncer) -> list[DumpRow]:
    with syncer.index.reader() as store:
        return [r for r in store.dump() if r[0].startswith("sessions/")]


def test_rendered_chunks_cite_jsonl_lines(setup: tuple[Syncer, Path]) -> None:
    syncer, _ = setup
    assert [(r[0], r[1], r[2]) for r in rows(syncer)] == [("sessions/s1.jsonl", 1, 3)]
    with syncer.index.reader() as store:
        assert store.file("sessions/s1.jsonl").source == "sessions"  # type: ignore[union-attr]


def test_growth_below_the_delta_waits(setup: tuple[Syncer, Path]) -> None:
    syncer, path = setup
    with path.open("a") as f:
        f.write(msg("one") + msg("two"))
    assert not syncer.sessions_due()
    syncer.sync()
    with syncer.index.reader() as store:
        assert not store.reads.keyword_candidates('"two"', None, 5)
    with path.open("a") as f:
        f.write(msg("three"))  # the third new message reaches the delta
    assert syncer.sessions_due()
    syncer.sync()
    with syncer.index.reader() as store:
        assert store.reads.keyword_candidates('"three"', None, 5)
    assert rows(syncer)[-1][2] == 6


def test_bytes_delta_truncation_and_quiet_transcripts(setup: tuple[Syncer, Path]) -> None:
    syncer, path = setup
    with path.open("a") as f:
        f.write(msg("x" * 2500))  # one long message passes the byte delta
    assert syncer.sessions_due()
    syncer.sync()
    path.write_text(msg("rewritten from scratch"))  # smaller than indexed: always reindexed
    assert syncer.sessions_due()
    syncer.sync()
    with path.open("a") as f:
        f.write(msg("a last word"))
    assert not syncer.sessions_due()
    old = time.time() - 120  # quiet for longer than idle_seconds: its tail is indexed
    os.utime(path, (old, old))
    assert syncer.sessions_due()
    syncer.sync()
    with syncer.index.reader() as store:
        assert store.reads.keyword_candidates('"last"', None, 5)


def test_deleted_transcript_is_pruned(setup: tuple[Syncer, Path]) -> None:
    syncer, path = setup
    path.unlink()
    assert syncer.sessions_due()
    report = syncer.sync()
    assert report.removed == 1 and rows(syncer) == []


def test_a_message_edited_in_place_is_reindexed_at_the_next_sync(
    setup: tuple[Syncer, Path],
) -> None:
    """An edit that keeps the size (or grows it less than the delta) is a rewrite, not an
    append: the indexed bytes changed, so it is due at once, not after ``reindex --force``."""
    syncer, path = setup
    path.write_text(path.read_text().replace("the cat is Tom", "the cat is Ida"))  # same size
    assert syncer.sessions_due()
    syncer.sync()
    with syncer.index.reader() as store:
        assert store.reads.keyword_candidates('"Ida"', None, 5)
        assert not store.reads.keyword_candidates('"Tom"', None, 5)
    path.write_text(path.read_text().replace("hello there", "hello there, again"))  # +7 bytes
    assert syncer.sessions_due()
    syncer.sync()
    with syncer.index.reader() as store:
        assert store.reads.keyword_candidates('"again"', None, 5)


def test_a_transcript_in_another_format_is_reported_not_indexed(
    setup: tuple[Syncer, Path],
) -> None:
    syncer, path = setup
    other = path.with_name("claude.jsonl")  # the records of another agent's transcripts
    other.write_text(
        json.dumps({"type": "user", "message": {"role": "user", "content": "my dog is Rex"}})
        + "\n"
        + json.dumps({"role": "assistant", "content": "Noted."})
        + "\n"
    )
    report = syncer.sync()
    assert [p for p, _ in report.skipped] == ["sessions/claude.jsonl"]
    why = dict(report.skipped)["sessions/claude.jsonl"]
    assert "not a transcript memd reads" in why and '"type": "message"' in why
    assert [r[0] for r in rows(syncer)] == ["sessions/s1.jsonl"], "no row: not indexed"
    assert syncer.transcripts is not None and set(syncer.transcripts.unreadable) == {
        "sessions/claude.jsonl"
    }
    assert not syncer.sessions_due(), "read again only when it changes"
    # A session that just began (a header, no message yet) is no such problem.
    path.with_name("new.jsonl").write_text(json.dumps({"type": "session", "id": "n"}) + "\n")
    assert syncer.sync().skipped == [("sessions/claude.jsonl", why)]
    # Rewritten in the format memd reads: indexed, and no longer reported.
    other.write_text(msg("my dog is Rex"))
    assert syncer.sessions_due()
    report = syncer.sync()
    assert report.skipped == [] and not syncer.transcripts.unreadable
    with syncer.index.reader() as store:
        assert store.reads.keyword_candidates('"Rex"', None, 5)


def test_an_explicit_reindex_indexes_a_transcript_grown_below_the_delta(tmp_path: Path) -> None:
    """Growth below the delta waits for the next threshold; `reindex` does not: afterwards the
    index equals a fresh rebuild of the same files."""
    from memd.embed.fake import FakeEmbedder

    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    log = sessions / "s1.jsonl"

    def message(text: str) -> str:
        body = {"role": "user", "content": [{"type": "text", "text": text}]}
        return json.dumps({"type": "message", "message": body}) + "\n"

    log.write_text(json.dumps({"type": "session", "id": "s1"}) + "\n" + message("first words"))
    config = Config.load()

    def syncer(index: Index) -> Syncer:
        return Syncer(
            index,
            root,
            config=config.index,
            embedder=FakeEmbedder(),
            sessions_dir=sessions,
            sessions=config.sessions,
        )

    live = Index(tmp_path / "live.sqlite")
    live.open()
    s = syncer(live)
    s.sync()
    with open(log, "a") as f:
        f.write(message("second words, below the delta"))
    s.sync()
    with live.reader() as store:
        assert not store.reads.keyword_candidates('"second"', None, 5)  # waits for the delta
    s.compare_contents_next()  # what `reindex` asks for
    s.sync()
    fresh = Index(tmp_path / "fresh.sqlite")
    fresh.open()
    syncer(fresh).sync()
    with live.reader() as a, fresh.reader() as b:
        assert a.dump() == b.dump()
    live.close()
    fresh.close()
