"""Keyword top-k without ranking every match (memd/index/bm25.py), against FTS5's own ranking.

The corpus is skewed as agent memory is: a name in a third of the notes, filler words in half,
topic words in a few. Every query's bounded answer must be the plain query's, rank for rank.
"""

from __future__ import annotations

import random

import pytest

from memd.index import bm25
from memd.index.db import atomic
from memd.index.index import Index
from memd.index.sync import Syncer

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
