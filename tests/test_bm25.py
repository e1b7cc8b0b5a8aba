"""Keyword top-k without ranking every match, against FTS5's own ranking: the bound over FTS5
(memd/index/bm25.py) and the postings in memory (memd/index/keywords.py, memd/index/postings.py,
counted by memd/index/termcount.py).

The corpus is skewed as agent memory is: a name in a third of the notes, filler words in half,
topic words in a few. Every query's answer must be FTS5's plain query's, rank for rank.
"""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.index import bm25
from memd.index import index as index_module
from memd.index.db import atomic
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.index.termcount import TermCounter, fts_columns, tokenizer
from memd.search.keyword import keyword_match

from .conftest import WriteFile

COMMON = "today really good time went talked".split()
TOPICS = [f"topic{t}" for t in range(60)]
RARE = [f"rare{t}" for t in range(40)]


def note(rng: random.Random, n: int) -> str:
    lines = []
    for i in range(rng.randint(1, 2)):
        words = rng.sample(COMMON, rng.randint(0, 2))
        if rng.random() < 0.25:
            words.append("caroline")
        words += rng.choices(TOPICS, k=rng.randint(1, 3))
        if rng.random() < 0.08:
            words += [rng.choice(RARE)] * rng.randint(1, 3)
        lines.append(f"- note {n} line {i}: " + " ".join(words) + ".")
    return "\n".join(lines) + "\n"


@pytest.fixture
def corpus(syncer: Syncer, write: WriteFile, monkeypatch: pytest.MonkeyPatch) -> Index:
    # 600 small notes: fewer matches than the size below which the plain query is always
    # cheaper, a cost choice; the bound itself is what these tests check.
    monkeypatch.setattr(bm25, "MIN_MATCHES", 0)
    rng = random.Random(7)
    for n in range(600):
        write(f"memory/notes/n{n:03d}.md", note(rng, n))
    syncer.sync()
    return syncer.index


def same(a: bm25.Ranked, b: bm25.Ranked) -> bool:
    """Equal rank for rank; sums taken in another order may differ in the last bit."""
    return len(a) == len(b) and all(abs(x[1] - y[1]) <= 1e-9 * abs(x[1]) for x, y in zip(a, b))


def test_bounded_top_k_is_the_plain_top_k(corpus: Index) -> None:
    rng = random.Random(11)
    vocabulary = [*COMMON, "caroline", *TOPICS, *RARE]
    taken = 0
    with corpus.reader() as store:
        for _ in range(300):
            if rng.random() < 0.5:  # anything
                terms = rng.sample(vocabulary, rng.randint(2, 6))
            else:  # as people ask: a topic or a rare word, with a name and filler
                terms = [rng.choice(RARE + TOPICS), *rng.sample([*COMMON, "caroline"], 2)]
            match = " OR ".join(f'"{t}"' for t in terms)
            k = rng.choice([2, 6, 24])
            plain = bm25._plain(store.conn, match, k)
            phrases = match.split(" OR ")
            bounded = bm25._bounded(store.conn, phrases, terms, k, store.reads.doc_freqs)
            if bounded is not None:
                taken += 1
                assert same(bounded, plain), match
                assert {r for r, _ in bounded} == {r for r, _ in plain} or bounded[-1][1] == (
                    pytest.approx(plain[-1][1])  # only rows tied at the k-th score may differ
                )
            assert same(bm25.top_ranked(store.conn, match, k, store.reads.doc_freqs), plain)
    # the shortcut is not a dead branch: a good share of these queries took it
    assert taken >= 50, taken


def test_a_rare_term_with_a_name_skips_the_name_and_is_exact(corpus: Index) -> None:
    with corpus.reader() as store:
        match = '"caroline" OR "today" OR "rare3"'
        terms = ["caroline", "today", "rare3"]
        freqs, total = store.reads.doc_freqs(terms)
        assert freqs["caroline"] > total / 4 and freqs["rare3"] < total / 50
        bounded = bm25._bounded(store.conn, match.split(" OR "), terms, 2, store.reads.doc_freqs)
        assert bounded is not None
        assert same(bounded, bm25._plain(store.conn, match, 2))


def test_phrases_without_exact_counts_take_the_plain_query(
    corpus: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[str] = []
    real = bm25._bounded

    def spy(*args: object) -> object:
        tried.append(str(args[1]))
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(bm25, "_bounded", spy)
    with corpus.reader() as store:
        freqs = store.reads.doc_freqs
        # a CJK unigram searched in its own column, a word FTS5 splits in two, a single phrase
        for match in ('"caroline" OR uni : "猫"', '"caroline" OR "rare3-topic5"', '"rare3"'):
            ranked = bm25.top_ranked(store.conn, match, 6, freqs)
            assert same(ranked, bm25._plain(store.conn, match, 6))
        assert tried == []
        bm25.top_ranked(store.conn, '"caroline" OR "rare3"', 6, freqs)
        assert len(tried) == 1


def test_a_source_filter_that_keeps_everything_is_dropped_and_one_that_does_not_holds(
    corpus: Index,
) -> None:
    with corpus.reader() as store:
        assert store.reads.sources_present() == {"memory"}
        everything = store.reads.keyword_candidates('"rare3" OR "caroline"', ("memory",), 6)
        assert everything == store.reads.keyword_candidates('"rare3" OR "caroline"', None, 6)
        moved = everything[0].id
    writer = corpus.writer()
    with atomic(writer.conn):
        writer.conn.execute("UPDATE chunks SET source = 'sessions' WHERE id = ?", (moved,))
    with corpus.reader() as store:
        assert store.reads.sources_present() == {"memory", "sessions"}
        memory = store.reads.keyword_candidates('"rare3" OR "caroline"', ("memory",), 6)
        both = store.reads.keyword_candidates('"rare3" OR "caroline"', ("memory", "sessions"), 6)
    assert moved not in {r.id for r in memory} and len(memory) == 6
    assert both[0].id == moved


# -- the keyword postings in memory (memd/index/keywords.py) ----------------------------------

CJK = ["猫", "中文", "日本語", "東京", "한국어", "学"]
ACCENTED = ["café", "Café", "naïve", "Zoë", "résumé", "ﬁle", "Straße"]


def rich_note(rng: random.Random, n: int) -> str:
    """Agent memory with everything FTS5 tokenises: names, filler, topics, CJK runs (bigrams
    and unigrams), accents, ligatures, punctuation inside words, repeated words, copies."""
    if n % 9 == 0:
        return "- the same note, written again and again: caroline topic3 rare1.\n"
    words = rng.sample(COMMON, rng.randint(0, 3))
    if rng.random() < 0.3:
        words.append(rng.choice(["caroline", "Caroline's", "CAROLINE"]))
    words += rng.choices(TOPICS, k=rng.randint(1, 3))
    if rng.random() < 0.15:
        words += [rng.choice(RARE)] * rng.randint(1, 6)
    if rng.random() < 0.2:
        words.append(rng.choice(CJK) + rng.choice(CJK))
    if rng.random() < 0.1:
        words.append(rng.choice(CJK)[0])  # a lone CJK character: a unigram
    if rng.random() < 0.2:
        words.append(rng.choice(ACCENTED))
    if rng.random() < 0.1:
        words.append(rng.choice(["foo_bar", "e-mail", "x86-64", "v2.1", "don't", "🙂ok"]))
    rng.shuffle(words)
    return f"- note {n}: " + " ".join(words) + ".\n"


@pytest.fixture
def rich(syncer: Syncer, write: WriteFile) -> Index:
    rng = random.Random(5)
    for n in range(500):
        folder = rng.choice(["notes", "topic3", "日本", "café"])
        write(f"memory/{folder}/n{n:03d}.md", rich_note(rng, n))
    syncer.sync()
    return syncer.index


def queries(rng: random.Random, n: int) -> list[str]:
    """MATCH expressions as memd.search.keyword.keyword_match builds them, and odder ones."""
    vocabulary = [*COMMON, "caroline", *TOPICS, *RARE, "notes", "topic3", "md", "absent"]
    out = []
    for _ in range(n):
        phrases = [f'"{t}"' for t in rng.sample(vocabulary, rng.randint(1, 6))]
        if rng.random() < 0.3:
            phrases.append(f'"{rng.choice(CJK)[:2]}"')
        if rng.random() < 0.2:
            phrases.append(f'uni : "{rng.choice(CJK)[0]}"')
        if rng.random() < 0.2:
            phrases.append(f'"{rng.choice(["cafe", "naive", "zoe", "file", "strasse"])}"')
        if rng.random() < 0.1:
            phrases.append(phrases[0])  # the same phrase twice counts twice, as in FTS5
        rng.shuffle(phrases)
        out.append(" OR ".join(phrases))
    return out


def test_counted_terms_are_the_tokens_fts5_stores() -> None:
    """The numpy word split gives, chunk by chunk and column by column, what FTS5's own
    tokenizer gives for the text the store writes."""
    conn = apsw.Connection(":memory:")
    tok = tokenizer(conn)
    rng = random.Random(3)
    pieces = list("abcXYZ019 _-.,'’—é́ñÅ ﬁ\u00a0\u2003\t\n\x00\x1fÀÉǅ²Ⅻ") + [
        *CJK,
        *ACCENTED,
        "running",
        "CAFE\u0301",
        "x" * 20,
        "y" * 9,
        "😀",
        "\U00020000",
    ]
    chunks = []
    for i in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        chunks.append((f"memory/{rng.choice(['a', '日本', 'Été'])}/{i % 7}.md", text))
    vocab: dict[str, int] = {}
    counts = TermCounter(vocab).count(tok, chunks)
    name = {i: t for t, i in vocab.items()}

    def reference(col: int | None) -> collections.Counter[tuple[str, int]]:
        out: collections.Counter[tuple[str, int]] = collections.Counter()
        for row, (path, text) in enumerate(chunks):
            for c, column in enumerate(fts_columns(path, text)):
                if col is None or c == col:
                    for t in tok(column.encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None):
                        out[(t[2], row)] += (4, 4, 1)[c]
        return out

    def got(terms: Any, rows: Any, weights: Any) -> collections.Counter[tuple[str, int]]:
        return collections.Counter(
            {(name[t], r): w for t, r, w in zip(terms.tolist(), rows.tolist(), weights.tolist())}
        )

    assert got(counts.terms, counts.rows, counts.weights) == reference(None)
    assert got(counts.uni_terms, counts.uni_rows, counts.uni_weights) == reference(1)
    lengths = [
        sum(len(tok(c.encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None)) for c in fts_columns(p, t))
        for p, t in chunks
    ]
    assert counts.lengths.tolist() == lengths


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=6))
def test_counted_terms_match_fts5_for_any_text(texts: list[str]) -> None:
    conn = apsw.Connection(":memory:")
    tok = tokenizer(conn)
    vocab: dict[str, int] = {}
    chunks = [("memory/x.md", t) for t in texts]
    counts = TermCounter(vocab).count(tok, chunks)
    name = {i: t for t, i in vocab.items()}
    got = collections.Counter(
        {
            (name[t], r): w
            for t, r, w in zip(counts.terms.tolist(), counts.rows.tolist(), counts.weights.tolist())
        }
    )
    want: collections.Counter[tuple[str, int]] = collections.Counter()
    for row, (path, text) in enumerate(chunks):
        for c, column in enumerate(fts_columns(path, text)):
            for t in tok(column.encode(), apsw.FTS5_TOKENIZE_DOCUMENT, None):
                want[(t[2], row)] += (4, 4, 1)[c]
    assert got == want


def test_the_postings_rank_as_fts5_ranks(rich: Index) -> None:
    rng = random.Random(17)
    with rich.reader() as store:
        postings = store.reads.keywords
        assert postings is not None and postings.ready
        for match in queries(rng, 400):
            for k in (1, 3, 24, 200):
                ranked = postings.top(store.conn, match, k)
                assert ranked is not None, match
                plain = bm25._plain(store.conn, match, k)
                assert [r for r, _ in ranked] == [r for r, _ in plain], (match, k)
                assert same(ranked, plain), (match, k)


def test_the_postings_follow_edits_deletes_and_renames_without_a_build(
    rich: Index, workspace: Path, write: WriteFile, syncer: Syncer
) -> None:
    postings = rich.keywords
    builds = postings.builds
    rng = random.Random(23)
    notes = sorted((workspace / "memory").rglob("*.md"))
    for step in range(6):
        for path in rng.sample(notes, 12):
            if path.exists() and rng.random() < 0.3:
                path.unlink()
            elif path.exists() and rng.random() < 0.3:
                path.rename(path.with_name("moved-" + path.name))
            else:
                write(str(path.relative_to(workspace)), rich_note(rng, 1000 + step))
        write(f"memory/new/s{step}.md", rich_note(rng, 2000 + step) * 3)
        syncer.sync()
        notes = sorted((workspace / "memory").rglob("*.md"))
        with rich.reader() as store:
            for match in queries(rng, 40):
                ranked = postings.top(store.conn, match, 24)
                assert ranked is not None and same(ranked, bm25._plain(store.conn, match, 24))
            # the writer trimmed the log rows the postings applied
            assert store.conn.execute("SELECT count(*) FROM fts_log").fetchone() == (0,)
    assert postings.builds == builds  # followed through the log, not built again


def test_a_second_copy_behind_the_trimmed_log_is_built_again(
    rich: Index, syncer: Syncer, write: WriteFile
) -> None:
    # A second Index of the same file (as a reader process has) builds its own postings; the
    # writer then trims past them: they are built again rather than missing rows.
    other = Index(rich.path)
    try:
        other.keywords.build(background=False)
        assert other.keywords.ready
        write("memory/notes/zz.md", "- zebra zebra caroline\n")
        syncer.sync()  # the writer's postings apply the new rows, and the log is trimmed
        with other.reader() as store:
            assert other.keywords.top(store.conn, '"zebra"', 5) is None  # behind: rebuilding
            assert store.reads.keyword_candidates('"zebra"', None, 5)[0].text.startswith("- zebra")
        assert other.keywords.wait(30)
        with other.reader() as store:
            match = '"zebra" OR "caroline"'
            ranked = other.keywords.top(store.conn, match, 10)
            assert ranked is not None and same(ranked, bm25._plain(store.conn, match, 10))
    finally:
        other.close()


def test_counts_that_differ_from_fts5_leave_ranking_to_fts5(
    rich: Index, memd_log: pytest.LogCaptureFixture
) -> None:
    # A chunk whose text no longer matches its FTS row (a damaged file): the build's check
    # against FTS5's own counts refuses the postings, and FTS5 ranks.
    writer = rich.writer()
    with atomic(writer.conn):
        writer.conn.execute(
            "UPDATE chunks SET text = 'quokka ' || text WHERE id = (SELECT min(id) FROM chunks)"
        )
    other = Index(rich.path)
    try:
        other.keywords.build(background=False)
        assert not other.keywords.ready
        assert other.keywords.error and "quokka" in other.keywords.error
        report = other.keywords.report()  # what status shows
        assert report["ranking"] == "fts5" and "quokka" in str(report["error"])
        assert "FTS5 ranks instead" in memd_log.text
        with other.reader() as store:
            rows = store.reads.keyword_candidates('"caroline" OR "topic3"', None, 10)
            plain = bm25._plain(store.conn, '"caroline" OR "topic3"', 10)
        assert same([(r.id, r.score) for r in rows], plain)
        assert [r.id for r in rows] == [r for r, _ in plain]
    finally:
        other.close()


def test_keyword_search_ranks_in_memory_after_a_write(
    rich: Index, syncer: Syncer, write: WriteFile
) -> None:
    # FTS5 ranks every row a query matches (bm25() per row) and fts5vocab walks a term's
    # whole doclist to count it, again after each write: with the postings neither runs.
    write("memory/notes/fresh.md", "- caroline met the otter today\n")
    syncer.sync()
    statements: list[str] = []
    with rich.reader() as store:
        store.conn.exec_trace = lambda _cursor, sql, _bindings: statements.append(sql) or True
        try:
            for question in ("When did Caroline meet the otter today?", "topic3 rare1 caroline"):
                match, _ = keyword_match(question, store.reads.doc_freqs)
                assert match is not None
                rows = store.reads.keyword_candidates(match, None, 24)
                assert rows
        finally:
            store.conn.exec_trace = None
    assert not [s for s in statements if "bm25(" in s or "chunks_fts_vocab" in s], statements


def test_a_search_older_than_the_postings_ranks_in_its_own_snapshot(
    rich: Index, syncer: Syncer, write: WriteFile
) -> None:
    match = '"walrus" OR "caroline"'
    with rich.reader() as store:
        store.conn.execute("BEGIN")  # this search's snapshot, from before the write
        try:
            before = bm25._plain(store.conn, match, 8)
            write("memory/notes/walrus.md", "- walrus walrus walrus caroline\n")
            syncer.sync()  # the postings follow the write at once (the writer's tend)
            rows = store.reads.keyword_candidates(match, None, 8)
            ranked = [(r.id, r.score) for r in rows]
            assert [r for r, _ in ranked] == [r for r, _ in before] and same(ranked, before)
        finally:
            store.conn.execute("COMMIT")
    with rich.reader() as store:
        assert "walrus" in store.reads.keyword_candidates(match, None, 8)[0].text


def test_a_large_index_builds_in_the_background_and_fts5_ranks_meanwhile(
    syncer: Syncer, write: WriteFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module, "POSTINGS_AT_ONCE", 0)
    rng = random.Random(29)
    for n in range(300):
        write(f"memory/notes/n{n:03d}.md", rich_note(rng, n))
    syncer.sync()
    index = syncer.index
    match = '"caroline" OR "topic7" OR "today"'
    with index.reader() as store:
        rows = store.reads.keyword_candidates(match, None, 12)  # built or not: the same answer
        assert same([(r.id, r.score) for r in rows], bm25._plain(store.conn, match, 12))
    assert index.keywords.report()["ranking"] in ("building", "postings")
    assert index.keywords.wait(30)
    report = index.keywords.report()
    assert report["ranking"] == "postings" and report["error"] is None
    assert isinstance(report["postings_mb"], float) and isinstance(report["built_seconds"], float)
    with index.reader() as store:
        ranked = index.keywords.top(store.conn, match, 12)
        assert ranked is not None and same(ranked, bm25._plain(store.conn, match, 12))
