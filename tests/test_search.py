"""Search over a real index: keyword, vector and hybrid modes, CJK, thresholds, decay, MMR."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memd.config import Config, SearchConfig
from memd.embed.base import Vectors
from memd.embed.fake import FakeEmbedder
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.reads import SearchReads
from memd.index.sync import Syncer
from memd.search import search
from memd.search.keyword import _line_cover, bm25_to_score, keyword_match
from memd.search.options import SearchOptions
from memd.search.when import DATE_WEIGHT
from memd.text import line_tokens_among, mmr_tokens, tokens_among

from .conftest import WriteFile

DEFAULTS = SearchOptions.from_config(SearchConfig())


def opts(**kw: object) -> SearchOptions:
    return SearchOptions.from_config(SearchConfig(), **kw)


def paths(outcome: object) -> list[str]:
    return [h.path for h in outcome.results]  # type: ignore[attr-defined]


def test_defaults_are_the_reference_ones() -> None:
    assert (DEFAULTS.max_results, DEFAULTS.min_score, DEFAULTS.candidates) == (6, 0.35, 24)
    # memd's one deliberate change of default: keyword 0.7, vector 0.3 (see docs/benchmarks.md)
    assert (DEFAULTS.vector_weight, DEFAULTS.text_weight, DEFAULTS.snippet_chars) == (0.3, 0.7, 700)
    assert not DEFAULTS.decay and not DEFAULTS.mmr and DEFAULTS.mode == "hybrid"


def test_keyword_match_ors_terms_and_drops_stopwords() -> None:
    match, terms = keyword_match("What did Caroline research about adoption?")
    assert match == '"caroline" OR "research" OR "adoption"'
    assert terms == ["caroline", "research", "adoption"]
    assert keyword_match("  ?! ") == (None, [])
    # only stopwords: keep them rather than search nothing
    assert keyword_match("who is she")[0] == '"who" OR "is" OR "she"'
    # quotes cannot break out of the FTS string
    assert '"' not in keyword_match('say "hi" AND NOT x')[0].replace('" OR "', "").strip('"')


def test_keyword_match_cjk_bigrams_and_unigrams() -> None:
    match, _ = keyword_match("猫 喜欢吃鱼")
    assert match == 'uni : "猫" OR "喜欢" OR "欢吃" OR "吃鱼"'


def test_bm25_mapping() -> None:
    assert bm25_to_score(-3.0) == pytest.approx(0.75)
    assert bm25_to_score(1.0) == pytest.approx(0.5)
    assert bm25_to_score(float("nan")) == pytest.approx(0.001)


def test_natural_language_question_finds_partial_matches(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder
) -> None:
    write("memory/2026-03-01.md", "Melanie signed up for a pottery class on Saturday.\n")
    write("memory/2026-03-02.md", "Caroline went hiking with friends.\n")
    syncer.sync()
    # No chunk holds every word of the question; an all-terms AND query would return nothing.
    outcome = search(
        index, "When did Melanie start her pottery lessons?", opts(mode="keyword"), embedder=None
    )
    assert paths(outcome)[0] == "memory/2026-03-01.md"


def test_a_term_in_most_chunks_still_finds_them(
    syncer: Syncer, index: Index, write: WriteFile
) -> None:
    """Leaving out a term held by most chunks is for speed: with ten chunks, six about the cat,
    the cat's notes are still found, alone and beside a rarer word."""
    for day in range(1, 7):
        write(f"memory/2026-04-0{day}.md", f"The user fed the cat on day {day}.\n")
    write("memory/2026-04-07.md", "The dog barked at the mailman.\n")
    for day in range(8, 10):
        write(f"memory/2026-04-0{day}.md", f"Deployed release {day} to staging.\n")
    write("memory/2026-04-10.md", "Lunch was soup.\n")
    syncer.sync()
    cats = {f"memory/2026-04-0{day}.md" for day in range(1, 7)}
    for query in ("what did the user say about the cat?", "cat"):
        found = paths(search(index, query, opts(mode="keyword", max_results=10), embedder=None))
        assert cats <= set(found), query
    found = paths(search(index, "dog cat", opts(mode="keyword", max_results=10), embedder=None))
    assert found[0] == "memory/2026-04-07.md" and cats <= set(found)


def test_cjk_is_findable_by_keyword(syncer: Syncer, index: Index, write: WriteFile) -> None:
    write("memory/zh.md", "我们决定下周三发布新版本。\n负责人是王小明。\n")
    write("memory/ja.md", "東京のオフィスで会議をしました。\n")
    write("memory/ko.md", "회의는 서울에서 열렸습니다.\n")
    write("memory/en.md", "Nothing in Asian scripts here.\n")
    syncer.sync()
    for query, expected in [
        ("发布", "memory/zh.md"),  # two characters inside a longer run
        ("新版本什么时候发布", "memory/zh.md"),  # a whole question without spaces
        ("王", "memory/zh.md"),  # a single character
        ("会議", "memory/ja.md"),
        ("東京", "memory/ja.md"),
        ("서울", "memory/ko.md"),
    ]:
        outcome = search(index, query, opts(mode="keyword"), embedder=None)
        assert paths(outcome) and paths(outcome)[0] == expected, query


def test_keyword_mode_without_embedder(
    index: Index, workspace: Path, write: WriteFile, config: Config
) -> None:
    write("MEMORY.md", "The staging database password rotates monthly.\n")
    Syncer(index, workspace, config=config.index).sync()
    outcome = search(index, "database rotation", DEFAULTS, embedder=None)
    assert outcome.mode == "keyword" and outcome.provider == "none"
    # Keyword-only by configuration is said once, by status; not by every search.
    assert outcome.note is None
    assert paths(outcome) == ["MEMORY.md"]
    hit = outcome.results[0]
    assert (hit.start_line, hit.end_line, hit.source) == (1, 1, "memory")
    assert 0 < hit.score <= 1 and hit.text_score > 0 and hit.vector_score == 0


def test_vector_and_hybrid_modes(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder
) -> None:
    write("memory/tea.md", "Alice drinks green tea every morning.\n")
    write("memory/car.md", "The car needs new tyres before winter.\n")
    syncer.sync()
    for mode in ("vector", "hybrid"):
        outcome = search(index, "green tea morning", opts(mode=mode, min_score=0.0), embedder=fake)
        assert outcome.mode == mode and outcome.provider == "fake"
        assert paths(outcome)[0] == "memory/tea.md"
        assert outcome.results[0].vector_score > outcome.results[-1].vector_score
    hybrid = search(index, "green tea", opts(min_score=0.0), embedder=fake).results[0]
    assert hybrid.text_score > 0 and hybrid.vector_score > 0
    assert hybrid.score == pytest.approx(0.3 * hybrid.vector_score + 0.7 * hybrid.text_score)
    # the best keyword hit holding every query term gets the full keyword half
    assert hybrid.text_score == pytest.approx(1.0)
    weighted = search(
        index, "green tea", opts(min_score=0.0, vector_weight=0.7, text_weight=0.3), embedder=fake
    ).results[0]
    assert weighted.score == pytest.approx(0.7 * weighted.vector_score + 0.3 * weighted.text_score)


def test_a_chunk_is_found_by_its_best_line(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder
) -> None:
    """One vector for many lines averages away the one a question is about; its line's own
    vector still finds it."""
    talk = [f"Bob: talk of topic{i} and subject{i} with note{i}" for i in range(15)]
    talk.insert(7, "Alice: adopted puppy Biscuit")
    write("memory/talk.md", "\n".join(talk) + "\n")
    write("memory/other.md", "Carol: adopted a cat\nCarol: puppy school was full\n")
    syncer.sync()
    query = "adopted puppy Biscuit"
    qvec = fake.embed_query(query)
    with index.reader() as store:
        by_chunk = [r.path for r in store.reads.vector_candidates(qvec, None, 5)]
    assert by_chunk == ["memory/other.md", "memory/talk.md"], "by its own vector it comes last"
    outcome = search(index, query, opts(mode="vector", min_score=0.0), embedder=fake)
    assert paths(outcome) == ["memory/talk.md", "memory/other.md"]
    # In hybrid mode the line lifts its vector half to the top of the candidates.
    hit = search(index, query, opts(min_score=0.0), embedder=fake).results[0]
    assert hit.path == "memory/talk.md" and hit.vector_score == pytest.approx(2 / 3, abs=0.01)


def test_a_keyword_hit_with_the_words_in_one_line_ranks_first(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder
) -> None:
    """Two chunks with the same words, as often: the one that has the question's words together
    in one line (or two adjacent ones) gets the keyword half's full score, the one that has
    them spread over its lines less."""
    filler = [f"filler line {w} here" for w in ("one", "two", "three", "four")]
    spread = ["Alice said hello", *filler[:2], "adopted dog", *filler[2:], "named Biscuit"]
    together = ["Alice said hello adopted dog named Biscuit", *filler, "", ""]
    write("memory/a-spread.md", "\n".join(spread) + "\n")
    write("memory/b-together.md", "\n".join(together) + "\n")
    syncer.sync()
    outcome = search(index, "Alice adopted Biscuit", opts(min_score=0.0), embedder=fake)
    by_path = {h.path: h for h in outcome.results}
    first, second = by_path["memory/b-together.md"], by_path["memory/a-spread.md"]
    assert first.text_score == pytest.approx(1.0)
    assert second.text_score < first.text_score - 0.05
    # Keyword mode is OpenClaw's ranking, unchanged: the two tie there.
    keyword = search(
        index, "Alice adopted Biscuit", opts(mode="keyword", min_score=0.0), embedder=None
    )
    scores = {h.path: h.score for h in keyword.results}
    assert scores["memory/a-spread.md"] == pytest.approx(scores["memory/b-together.md"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet="ab 中文\n_.", max_size=8), max_size=8),
    st.lists(
        st.sampled_from(["a", "b", "ab", "ba", "中", "文", "中文", "文中", "ab_"]), max_size=5
    ),
)
@example(["中\n文"], ["中文", "中"])
def test_line_cover_is_the_best_line_or_pair_by_full_tokenisation(
    parts: list[str], terms: list[str]
) -> None:
    text = "".join(parts)
    lines = text.split("\n")
    wanted = set(terms)
    held = [wanted & mmr_tokens(line) for line in lines]
    pairs = [held[i] | (held[i + 1] if i + 1 < len(held) else set()) for i in range(len(held))]
    expected = max(map(len, pairs), default=0) / len(wanted) if wanted else 0.0
    by_line = line_tokens_among(text, terms)
    assert by_line == [tokens_among(line, terms) for line in lines]
    assert set().union(*by_line) == tokens_among(text, terms)
    assert _line_cover(by_line, terms) == pytest.approx(expected)


def test_hybrid_never_drops_an_exact_keyword_hit(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder
) -> None:
    write("memory/ids.md", "Ticket ZX-4471 was closed by the on-call engineer.\n" + "filler\n" * 50)
    for i in range(3):
        write(f"memory/other-{i}.md", "ZX\n")  # nearer the query's vector than ids.md
    syncer.sync()
    # With the score all vector, this hit's is the weakest of the candidates: below min_score ...
    weights = {"vector_weight": 1.0, "text_weight": 0.0}
    outcome = search(index, "ZX-4471", opts(min_score=0.9, **weights), embedder=fake)
    assert outcome.mode == "hybrid"
    assert "memory/ids.md" in paths(outcome)
    hit = next(h for h in outcome.results if h.path == "memory/ids.md")
    assert hit.score < 0.9
    # ... and a plain vector search at that threshold returns nothing.
    assert search(index, "ZX-4471", opts(mode="vector", min_score=0.9), embedder=fake).results == []


def test_min_score_and_max_results(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder
) -> None:
    for i in range(12):
        write(f"memory/n{i}.md", f"release checklist item {i}\n")
    syncer.sync()
    outcome = search(index, "release checklist", opts(max_results=4, min_score=0.0), embedder=fake)
    assert len(outcome.results) == 4
    scores = [h.score for h in outcome.results]
    assert scores == sorted(scores, reverse=True)


def test_snippet_is_capped(syncer: Syncer, index: Index, write: WriteFile) -> None:
    write("MEMORY.md", "word " * 1000)
    syncer.sync()
    hit = search(index, "word", opts(mode="keyword"), embedder=None).results[0]
    assert len(hit.snippet) == 700


def test_temporal_decay_prefers_recent_daily_logs_but_not_evergreen(
    syncer: Syncer, index: Index, write: WriteFile
) -> None:
    write("memory/2020-01-01.md", "kubernetes upgrade notes\n")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    write(f"memory/{today}.md", "kubernetes upgrade notes\n")
    write("MEMORY.md", "kubernetes upgrade notes\n")
    syncer.sync()
    flat = search(index, "kubernetes upgrade", opts(mode="keyword", min_score=0.0), embedder=None)
    decayed = search(
        index, "kubernetes upgrade", opts(mode="keyword", min_score=0.0, decay=True), embedder=None
    )
    by_path = {h.path: h.score for h in decayed.results}
    assert by_path["memory/2020-01-01.md"] < 0.01
    assert by_path[f"memory/{today}.md"] > 0.5
    flat_scores = {h.path: h.score for h in flat.results}
    assert by_path["MEMORY.md"] == pytest.approx(flat_scores["MEMORY.md"])


@pytest.mark.parametrize("mode", ["keyword", "vector", "hybrid"])
def test_the_daily_logs_of_a_named_date_rank_first(
    syncer: Syncer, index: Index, write: WriteFile, fake: FakeEmbedder, mode: str
) -> None:
    """The same words, capitalised so that they name a month or not: only the logs' order and
    scores change, the named month's logs come first, and every score stays within [0, 1]."""
    write("memory/2024-03-03.md", "Deployed the billing service to staging.\n")
    write("memory/2024-05-20.md", "Deployed the billing service to staging.\n")
    write("memory/2024-06-04.md", "Deployed the billing service to production.\n")
    write("MEMORY.md", "The billing service deploys from the release branch.\n")
    syncer.sync()
    embedder = None if mode == "keyword" else fake
    options = opts(mode=mode, min_score=0.0)
    plain = search(index, "billing deploy in may", options, embedder=embedder)
    dated = search(index, "billing deploy in May", options, embedder=embedder)
    assert paths(plain)[0] == "memory/2024-03-03.md"  # the same text: the path decides
    assert paths(dated)[0] == "memory/2024-05-20.md"
    assert sorted(paths(plain)) == sorted(paths(dated))
    before = {h.path: h.score for h in plain.results}
    after = {h.path: h.score for h in dated.results}
    assert all(0.0 <= s <= 1.0 for s in after.values())
    # four days after May: part of the way, and ahead of March's log (scores cut to 1 may tie)
    order = paths(dated)
    assert order.index("memory/2024-06-04.md") < order.index("memory/2024-03-03.md")
    assert before["memory/2024-06-04.md"] <= before["memory/2024-03-03.md"]
    # a hit that is not a daily log of a named day keeps its score: a date never lowers one
    assert after["MEMORY.md"] == pytest.approx(before["MEMORY.md"])
    assert after["memory/2024-05-20.md"] == pytest.approx(
        min(1.0, before["memory/2024-05-20.md"] + DATE_WEIGHT)
    )


def test_a_named_date_far_from_every_log_changes_nothing(
    syncer: Syncer, index: Index, write: WriteFile
) -> None:
    write("memory/2024-03-03.md", "Deployed the billing service to staging.\n")
    write("memory/2024-05-20.md", "Deployed the billing service on a Monday.\n")
    syncer.sync()
    plain = search(
        index, "billing deploy march 1990", opts(mode="keyword", min_score=0.0), embedder=None
    )
    dated = search(
        index, "billing deploy March 1990", opts(mode="keyword", min_score=0.0), embedder=None
    )
    assert [(h.path, h.score) for h in plain.results] == [(h.path, h.score) for h in dated.results]


def test_mmr_spreads_near_duplicates(syncer: Syncer, index: Index, write: WriteFile) -> None:
    same = "deploy the api gateway with blue green rollout\n"
    write("memory/a.md", same)
    write("memory/b.md", same)
    write("memory/c.md", "deploy notes: the api gateway needs a canary first\n")
    syncer.sync()
    plain = search(index, "deploy api gateway", opts(mode="keyword", min_score=0.0), embedder=None)
    diverse = search(
        index,
        "deploy api gateway",
        opts(mode="keyword", min_score=0.0, mmr=True, mmr_lambda=0.3),
        embedder=None,
    )
    assert set(paths(plain)[:2]) == {"memory/a.md", "memory/b.md"}
    assert "memory/c.md" in paths(diverse)[:2]


def test_model_change_falls_back_to_keyword_until_rebuilt(
    syncer: Syncer,
    index: Index,
    write: WriteFile,
    config: Config,
    workspace: Path,
    cache: EmbeddingCache,
) -> None:
    write("MEMORY.md", "Quarterly planning happens in March.\n")
    syncer.sync()
    other = FakeEmbedder(dims=32, model="other")
    outcome = search(index, "quarterly planning", DEFAULTS, embedder=other)
    assert outcome.mode == "keyword" and "another embedding model" in (outcome.note or "")
    assert paths(outcome) == ["MEMORY.md"]
    Syncer(index, workspace, config=config.index, embedder=other, cache=cache).sync()
    assert search(index, "quarterly planning", DEFAULTS, embedder=other).mode == "hybrid"


def test_empty_query_and_empty_index(index: Index) -> None:
    assert search(index, "   ", DEFAULTS, embedder=None).results == []
    assert search(index, "anything", DEFAULTS, embedder=None).results == []


def test_numpy_fallback_ranks_like_vec0(
    config: Config, workspace: Path, write: WriteFile, fake: FakeEmbedder
) -> None:
    for i in range(30):
        write(f"memory/t{i}.md", f"topic {i} " + " ".join(f"w{(i * j) % 17}" for j in range(20)))
    results = {}
    for use_vec in (True, False):
        idx = Index(config.index_dir / f"v{use_vec}.sqlite", use_vec=use_vec)
        idx.open()
        try:
            Syncer(idx, workspace, config=config.index, embedder=fake).sync()
            outcome = search(
                idx,
                "w3 w5 w7 topic",
                opts(mode="vector", min_score=0.0, max_results=10),
                embedder=fake,
            )
            results[use_vec] = [(h.path, round(h.score, 5)) for h in outcome.results]
        finally:
            idx.close()
    assert results[True] == results[False]


_WORDS = ["go", "going", "café", "x_y", "ok", "中文", "文本", "s", "42", "ß"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(_WORDS), st.text(alphabet="aogé中文_-' .\n4İ", max_size=6)),
        max_size=12,
    ),
    st.lists(st.one_of(st.sampled_from(_WORDS), st.text(alphabet="aog中_4", max_size=3))),
)
@example(["go_"], ["go"])
@example(["_go"], ["go"])
@example(["gogo go"], ["go"])
@example(["cafés café"], ["caf"])
@example(["go中文"], ["go", "中文", "中"])
@example(["İgo"], ["go", "i"])
def test_tokens_among_agrees_with_full_tokenisation(parts: list[str], terms: list[str]) -> None:
    # The boost checks query terms against candidates without tokenising their whole text;
    # the answer must be the one full tokenisation gives, whatever the script and punctuation.
    text = " ".join(parts) if len(parts) % 2 else "".join(parts)
    lowered_terms = [t.lower() for t in terms]
    assert tokens_among(text, lowered_terms) == set(lowered_terms) & mmr_tokens(text)
    # and line by line, as the hybrid ranking and the snippet window ask
    assert line_tokens_among(text, lowered_terms) == [
        set(lowered_terms) & mmr_tokens(line) for line in text.split("\n")
    ]


def test_migration_counts_words_of_existing_chunks(
    tmp_path: Path, workspace: Path, write: WriteFile, config: Config
) -> None:
    # An index from before the word counts gets them filled in when it is opened, equal to
    # what a fresh write stores.
    write("MEMORY.md", "Alpha beta beta gamma.\n\nDelta, epsilon!\n")
    write("memory/2026-01-02.md", "Zeta eta theta, theta.\n")
    index = Index(tmp_path / "i.sqlite")
    index.open()
    Syncer(index, workspace, config=config.index).sync()
    conn = index.writer().conn
    fresh = sorted(conn.execute("SELECT id, words FROM chunks"))
    texts = {r[0]: r[1] for r in conn.execute("SELECT id, text FROM chunks")}
    assert len(fresh) == 2
    assert all(words == len(mmr_tokens(texts[i])) for i, words in fresh)
    conn.execute("DELETE FROM _migrations WHERE name = 'm005_chunk_word_counts'")
    conn.execute("ALTER TABLE chunks DROP COLUMN words")
    index.close()
    index = Index(tmp_path / "i.sqlite")
    index.open()
    assert sorted(index.writer().conn.execute("SELECT id, words FROM chunks")) == fresh
    index.close()


def test_document_frequencies_follow_the_index(
    syncer: Syncer, index: Index, write: WriteFile
) -> None:
    # The keyword postings count in memory; without them (FTS5's fts5vocab) frequencies are
    # memoised per reader connection. Either way a write by the indexer must show in the next
    # search on that same connection, or common-term pruning would use stale counts.
    write("memory/2026-01-01.md", "The heron waited by the river.\n")
    write("memory/2026-01-02.md", "A quiet day at the desk.\n")
    syncer.sync()
    with index.reader() as store:
        assert store.reads.keywords is not None and store.reads.keywords.ready
        vocab = SearchReads(store.conn, "none", 0)  # no postings: fts5vocab and the memo
        for reads in (store.reads, vocab):
            assert reads.doc_freqs(["heron", "river", "otter"]) == (
                {"heron": 1, "river": 1, "otter": 0},
                2,
            )
        conn = store.conn
    for day in range(3, 6):
        write(f"memory/2026-01-0{day}.md", "The otter swam past the heron.\n")
    syncer.sync()
    with index.reader() as store:
        assert store.conn is conn  # the pooled connection, with its memo
        for reads in (store.reads, vocab):
            assert reads.doc_freqs(["heron", "otter"]) == ({"heron": 4, "otter": 3}, 5)
    # "heron" is now in most chunks: it leaves the MATCH while the rarer "river" stays.
    with index.reader() as store:
        match, _ = keyword_match("heron river", store.reads.doc_freqs)
    assert match == '"river"'


def test_concurrent_searches_share_a_bounded_reader_pool(
    syncer: Syncer, index: Index, write: WriteFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dozens of sessions searching at once must not each open a connection (and its page
    # cache): the pool stops at MAX_READERS and the rest wait their turn.
    import threading

    from memd.index import index as index_module

    for day in range(1, 10):
        write(f"memory/2026-02-0{day}.md", f"Day {day}: the heron and the otter by the river.\n")
    syncer.sync()
    monkeypatch.setattr(index_module, "MAX_READERS", 3)
    bounded = Index(index.path)
    bounded.open()
    opened: list[object] = []
    real_connect = index_module.connect

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        conn = real_connect(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(index_module, "connect", counting_connect)
    options = SearchOptions.from_config(SearchConfig(), mode="keyword")
    found: list[int] = []
    barrier = threading.Barrier(24)

    def one() -> None:
        barrier.wait()
        for _ in range(5):
            found.append(len(search(bounded, "heron river", options, embedder=None).results))

    threads = [threading.Thread(target=one) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bounded.close()
    assert found == [6] * 120
    assert 1 <= len(opened) <= 3


def test_the_snippet_is_the_window_that_shows_the_query(
    index: Index, workspace: Path, write: WriteFile, config: Config
) -> None:
    """A long daily log's chunk: the snippet is the run of lines holding the query's terms,
    not the chunk's first 700 characters, and the lines that matched are named."""
    lines = [
        f"- {i:02d}: routine standup notes about nothing in particular today" for i in range(40)
    ]
    lines[31] = "- 31: the VPN gateway password rotates every ninety days"
    lines[33] = "- 33: ask Dana where the gateway runbook lives"
    write("memory/2026-03-01.md", "\n".join(lines) + "\n")
    Syncer(index, workspace, config=config.index).sync()
    outcome = search(index, "gateway password", opts(mode="keyword"), embedder=None)
    hit = outcome.results[0]
    assert hit.start_line < 32 and len(hit.text) > DEFAULTS.snippet_chars  # a long chunk
    assert hit.match_lines == [32, 34]  # file lines
    assert "VPN gateway password" in hit.snippet and "gateway runbook" in hit.snippet
    assert len(hit.snippet) <= DEFAULTS.snippet_chars
    first = hit.snippet.split("\n")[0]
    assert first == lines[hit.snippet_start_line - 1]  # the window starts on a whole line
    assert hit.snippet_start_line > hit.start_line
    shown = hit.to_dict()
    assert shown["snippet_start_line"] == hit.snippet_start_line
    assert shown["match_lines"] == [32, 34]


def test_a_short_chunk_keeps_its_whole_text_and_names_its_matching_lines(
    index: Index, workspace: Path, write: WriteFile, config: Config
) -> None:
    write("MEMORY.md", "# Memory\n\nThe staging cluster is Orion.\nProduction is Vega.\n")
    Syncer(index, workspace, config=config.index).sync()
    hit = search(index, "staging cluster", opts(mode="keyword"), embedder=None).results[0]
    assert hit.snippet == "# Memory\n\nThe staging cluster is Orion.\nProduction is Vega."
    assert (hit.snippet_start_line, hit.match_lines) == (1, [3])


def test_quiet_time_empties_the_idle_readers_page_caches(
    syncer: Syncer, index: Index, write: WriteFile
) -> None:
    # After a burst of searches each pooled reader keeps the pages it read (up to 2 MB); the
    # daemon's quiet-time release gives them back, and the next search still works.
    for n in range(120):
        write(f"memory/topics/t{n}.md", f"# Topic {n}\n\n" + f"- heron otter river note {n}\n" * 40)
    syncer.sync()
    for _ in range(3):
        search(index, "heron river", opts(mode="keyword"), embedder=None)
        with index.reader() as store:  # FTS5's ranking (the postings read no FTS pages)
            SearchReads(store.conn, "none", 0).keyword_candidates('"heron" OR "river"', None, 24)

    def cached() -> int:
        with index._pool_lock:
            return sum(c.status(apsw.SQLITE_DBSTATUS_CACHE_USED)[0] for c in index._pool)

    before = cached()
    assert before > 100_000
    index.release_memory()
    assert cached() < before / 4
    assert paths(search(index, "heron river", opts(mode="keyword"), embedder=None))


class SlowQueries(FakeEmbedder):
    """Query vectors that wait for ``gate`` (a model busy with a document job)."""

    def __init__(self, *, every_core: bool = False) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.asked = threading.Event()
        self.every_core = every_core

    def query_takes_every_core(self) -> bool:
        return self.every_core

    def start_query(self, text: str) -> Future[Vectors]:
        future: Future[Vectors] = Future()

        def answer() -> None:
            self.asked.set()
            self.gate.wait(10)
            future.set_result(self.embed_query(text))

        threading.Thread(target=answer, daemon=True).start()
        return future


def test_a_search_waiting_for_its_query_vector_holds_no_reader(
    config: Config, workspace: Path, write: WriteFile, cache: EmbeddingCache
) -> None:
    """While the model is busy, hybrid searches wait for their vectors; holding a reader
    meanwhile, eight of them kept every get, keyword search and the writer waiting."""
    from memd.index.index import MAX_READERS

    slow = SlowQueries()
    index = Index(config.index_dir / "ws.sqlite", use_vec=config.index.sqlite_vec)
    index.open()
    try:
        write("MEMORY.md", "The staging cluster is called Orion.\n")
        Syncer(index, workspace, config=config.index, embedder=slow, cache=cache).sync()
        outcome: dict[str, Any] = {}
        searching = threading.Thread(
            target=lambda: outcome.update(r=search(index, "staging cluster", opts(), embedder=slow))
        )
        searching.start()
        assert slow.asked.wait(5)
        time.sleep(0.1)  # the keyword half is done and the search waits for the vector
        held = threading.Event()

        def take_all() -> None:
            with contextlib.ExitStack() as stack:
                for _ in range(MAX_READERS):
                    stack.enter_context(index.reader())
                held.set()

        taker = threading.Thread(target=take_all, daemon=True)
        taker.start()
        assert held.wait(5), "a search waiting for its query vector holds a reader"
        slow.gate.set()
        searching.join(10)
        assert paths(outcome["r"]) == ["MEMORY.md"] and outcome["r"].mode == "hybrid"
    finally:
        slow.gate.set()
        index.close()


@pytest.mark.parametrize("every_core", [False, True])
def test_the_keyword_half_is_ready_before_the_vector_and_ranks_as_if_it_came_at_once(
    config: Config,
    workspace: Path,
    write: WriteFile,
    cache: EmbeddingCache,
    fake: FakeEmbedder,
    every_core: bool,
) -> None:
    """A hybrid search scores its keyword candidates and makes their line vectors ready while
    its query embeds, unless the query has every core (work beside it would slow it down);
    either way, what it finds is what it finds when the vector is there at once."""
    import memd.search.fusion as fusion

    slow = SlowQueries(every_core=every_core)
    index = Index(config.index_dir / "ws.sqlite", use_vec=config.index.sqlite_vec)
    index.open()
    made: list[int] = []
    real_init = fusion._Lines.__init__

    def counted(self: Any, store: Any, ids: list[int]) -> None:  # a spy: counts, then runs
        made.append(len(ids))
        real_init(self, store, ids)

    try:
        for day in range(1, 7):
            talk = [f"Bob: day {day} talk of topic{i} and note{i}" for i in range(12)]
            talk.insert(day, f"Alice: the staging cluster moved to rack {day}")
            write(f"memory/2026-03-0{day}.md", "\n".join(talk) + "\n")
        write("MEMORY.md", "The staging cluster is called Orion.\nIt runs in Frankfurt.\n")
        Syncer(index, workspace, config=config.index, embedder=slow, cache=cache).sync()
        query, options = "where did the staging cluster move", opts(min_score=0.0)
        at_once = search(index, query, options, embedder=fake)
        fusion._Lines.__init__ = counted  # type: ignore[method-assign]
        outcome: dict[str, Any] = {}
        searching = threading.Thread(
            target=lambda: outcome.update(r=search(index, query, options, embedder=slow))
        )
        searching.start()
        assert slow.asked.wait(5)
        deadline = time.monotonic() + (0.3 if every_core else 5)
        while not made and time.monotonic() < deadline:
            time.sleep(0.01)
        if every_core:
            assert not made, "work ran beside a query that has every core"
        else:
            assert made, "the keyword candidates' lines were not made ready while it embedded"
        slow.gate.set()
        searching.join(10)
        later = outcome["r"]
        assert [(h.path, h.start_line) for h in later.results] == [
            (h.path, h.start_line) for h in at_once.results
        ]
        assert [h.score for h in later.results] == pytest.approx(
            [h.score for h in at_once.results], abs=1e-6
        )
        assert later.mode == "hybrid" and len(later.results) > 2
    finally:
        fusion._Lines.__init__ = real_init  # type: ignore[method-assign]
        slow.gate.set()
        index.close()
