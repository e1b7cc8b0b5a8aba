"""Hybrid search (SPEC §6): FTS5 keyword and vector candidates merged, decayed, diversified.

Keyword queries OR their terms and let BM25 rank, so natural-language questions find the chunks
that hold most of their words; CJK runs become bigram terms.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime
from typing import Any, Literal

from memd.config import SearchConfig
from memd.embed.base import Embedder
from memd.index.index import Index
from memd.index.store import ChunkRow, Store
from memd.text import mmr_tokens, query_terms, tokens_among

__all__ = ["Hit", "SearchOptions", "SearchOutcome", "keyword_match", "search"]

Mode = Literal["hybrid", "keyword", "vector"]
DAY = 86_400.0


_DEFAULTS = SearchConfig()


@dataclass(frozen=True)
class SearchOptions:
    """One search's knobs; ``from_config`` fills them from ``[search]``."""

    # The defaults are [search]'s: SearchConfig is their one home.
    mode: Mode = _DEFAULTS.mode
    max_results: int = _DEFAULTS.max_results
    min_score: float = _DEFAULTS.min_score
    sources: tuple[str, ...] | None = None
    vector_weight: float = _DEFAULTS.vector_weight
    text_weight: float = _DEFAULTS.text_weight
    candidate_multiplier: int = _DEFAULTS.candidate_multiplier
    snippet_chars: int = _DEFAULTS.snippet_chars
    decay: bool = _DEFAULTS.decay
    half_life_days: float = _DEFAULTS.half_life_days
    mmr: bool = _DEFAULTS.mmr
    mmr_lambda: float = _DEFAULTS.mmr_lambda

    @classmethod
    def from_config(cls, config: SearchConfig, **overrides: object) -> SearchOptions:
        """Options from ``[search]``, with the ``overrides`` that are not None on top."""
        names = {f.name for f in fields(cls)}
        values = {f.name: getattr(config, f.name) for f in fields(config) if f.name in names}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def candidates(self) -> int:
        return min(200, max(1, self.max_results * self.candidate_multiplier))


@dataclass
class Hit:
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    source: str
    vector_score: float = 0.0
    text_score: float = 0.0
    chunk_id: int = field(default=0, repr=False)
    keyword: bool = field(default=False, repr=False)
    exact: bool = field(default=False, repr=False)

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(self.score, 6),
            "snippet": self.snippet,
            "source": self.source,
            "vector_score": round(self.vector_score, 6),
            "text_score": round(self.text_score, 6),
        }


@dataclass
class SearchOutcome:
    results: list[Hit]
    mode: str  # the mode actually used
    provider: str
    model: str
    note: str | None = None  # why the mode used differs from the one asked for


# A term found in more than this share of chunks has a BM25 weight of about zero, yet scoring
# it means visiting nearly every chunk: at 10,000 chunks "s" (from "Caroline's") alone cost
# 11 ms. Such terms are left out of the MATCH (they still count in the overlap boost).
COMMON_TERM_SHARE = 0.5


def keyword_match(
    query: str, doc_freq: Callable[[list[str]], tuple[dict[str, int], int]] | None = None
) -> tuple[str | None, list[str]]:
    """Build the FTS5 MATCH expression (terms OR-ed) and the lower-cased terms for boosting.

    ``doc_freq`` maps terms to the number of chunks holding them (and the chunk count); with
    it, terms present in most chunks are dropped from the expression, keeping the rarest one.
    """
    words, runs = query_terms(query)
    words = [w for w in words if len(w) > 1 or w.isdigit()] or words
    boost_terms: list[str] = list(words)
    items: list[tuple[str, str]] = [(w, '"' + w.replace('"', "") + '"') for w in words]
    for run in runs:
        if len(run) == 1:
            items.append((run, f'uni : "{run}"'))
            boost_terms.append(run)
        else:
            grams = list(dict.fromkeys(run[i : i + 2] for i in range(len(run) - 1)))
            items.extend((g, f'"{g}"') for g in grams)
            boost_terms.extend(grams)
    if not items:
        return None, []
    if doc_freq is not None and len(items) > 1:
        freqs, total = doc_freq([term for term, _ in items])
        if total:
            kept = [it for it in items if freqs.get(it[0], 0) <= COMMON_TERM_SHARE * total]
            items = kept or [min(items, key=lambda it: freqs.get(it[0], 0))]
    return " OR ".join(expr for _, expr in items), boost_terms


def bm25_to_score(rank: float) -> float:
    """Map an FTS5 bm25 rank (negative, lower is better) into [0, 1) as the reference does."""
    if not math.isfinite(rank):
        return 1 / 1000
    if rank < 0:
        r = -rank
        return r / (1 + r)
    return 1 / (1 + rank)


def search(
    index: Index,
    query: str,
    options: SearchOptions,
    *,
    embedder: Embedder | None,
    now: float | None = None,
) -> SearchOutcome:
    """Run one search over ``index``; the query vector comes from ``embedder`` when it fits."""
    query = query.strip()
    with index.reader() as store:
        identity = Index.stored_identity(store.conn)
        provider = identity.provider if identity else "none"
        model = identity.model if identity else "fts-only"
        if not query:
            return SearchOutcome([], options.mode, provider, model)
        note = None
        vector_ok = (
            embedder is not None
            and identity is not None
            and identity.semantic
            and store.vector_store != "none"
            and embedder.settings_key == identity.settings_key
        )
        mode: Mode = options.mode
        if mode != "keyword" and not vector_ok:
            note = _why_no_vectors(embedder, identity, store)
            mode = "keyword"
        # The query is embedded (on the embedder's own thread, where it has one) while the
        # keyword half runs here.
        qvec_future = embedder.start_query(query) if mode != "keyword" and embedder else None
        match, boost_terms = keyword_match(query, store.doc_freqs)
        keyword_rows: list[ChunkRow] = []
        if mode != "vector" and match:
            keyword_rows = store.keyword_candidates(match, options.sources, options.candidates)
        if qvec_future is None:
            hits = _keyword_only(store, keyword_rows, boost_terms, options, now)
            return SearchOutcome(hits, mode, provider, model, note)
        qvec = qvec_future.result()
        vector_rows = store.vector_candidates(qvec, options.sources, options.candidates)
        hits = _merge(vector_rows, keyword_rows, boost_terms, options, hybrid=mode == "hybrid")
        hits = _finish(store, hits, options, now)
        return SearchOutcome(hits, mode, provider, model, note)


def _why_no_vectors(embedder: Embedder | None, identity: object, store: Store) -> str:
    if embedder is None:
        return "no embedding provider: keyword search only"
    if identity is None or not getattr(identity, "semantic", False):
        return "the index holds no vectors yet: keyword search only"
    if store.vector_store == "none":
        return "the vector store cannot be read (sqlite-vec unavailable): keyword search only"
    return (
        "the index was built with another embedding model and is being rebuilt: keyword search only"
    )


def _hit(row: ChunkRow, options: SearchOptions, **scores: Any) -> Hit:
    snippet = (
        row.text if len(row.text) <= options.snippet_chars else row.text[: options.snippet_chars]
    )
    return Hit(
        row.path, row.start_line, row.end_line, 0.0, snippet, row.source, chunk_id=row.id, **scores
    )


def _keyword_hits(
    rows: Sequence[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    found: dict[int, set[str]],
) -> list[Hit]:
    """Hits for FTS rows; ``found`` receives the query terms each chunk holds as tokens."""
    wanted = set(terms)
    hits = []
    for row in rows:
        found[row.id] = tokens_among(row.text, wanted)
        exact = bool(wanted) and found[row.id] == wanted
        hits.append(
            _hit(row, options, text_score=bm25_to_score(row.score), keyword=True, exact=exact)
        )
    return hits


def _boost(hit: Hit, text: str, found: set[str], words: int, terms: Sequence[str]) -> float:
    """The reference's keyword-only ranking: overlap, density, path and length on top of BM25.

    ``found`` holds the query terms that are tokens of ``text``; ``words`` is its count of
    distinct tokens.
    """
    query = list(dict.fromkeys(terms))
    if not query:
        return hit.text_score
    overlap = len(found)
    unique_overlap = overlap / len(query)
    density = overlap / max(1, words)
    path = hit.path.lower()
    path_boost = 0.18 * sum(1 for t in query if t in path)
    length_boost = min(len(text) / 160, 0.18)
    return hit.text_score + 0.45 * unique_overlap + 0.2 * density + path_boost + length_boost


def _keyword_only(
    store: Store,
    rows: Sequence[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    now: float | None,
) -> list[Hit]:
    found: dict[int, set[str]] = {}
    hits = _keyword_hits(rows, terms, options, found)
    by_id = {r.id: r for r in rows}
    for hit in hits:
        row = by_id[hit.chunk_id]
        hit.score = _boost(hit, row.text, found[hit.chunk_id], row.words, terms)
    _decay(store, hits, options, now)
    hits.sort(key=lambda h: (-h.score, -h.text_score, h.path, h.start_line))
    if options.mmr:
        hits = _mmr(hits, options.mmr_lambda)
    for hit in hits:
        hit.score = min(1.0, hit.score)
    kept = [h for h in hits if h.score >= options.min_score] or hits
    return kept[: options.max_results]


def _merge(
    vector_rows: Sequence[ChunkRow],
    keyword_rows: Sequence[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    *,
    hybrid: bool,
) -> list[Hit]:
    by_id: dict[int, Hit] = {}
    for row in vector_rows:
        by_id[row.id] = _hit(row, options, vector_score=max(0.0, min(1.0, row.score)))
    if hybrid:
        found: dict[int, set[str]] = {}
        keyword_hits = _keyword_hits(keyword_rows, terms, options, found)
        relative = _relative_text_scores(keyword_rows, found, terms)
        for hit in keyword_hits:
            hit.text_score = relative[hit.chunk_id]
            if hit.chunk_id in by_id:
                existing = by_id[hit.chunk_id]
                existing.text_score, existing.keyword, existing.exact = (
                    hit.text_score,
                    True,
                    hit.exact,
                )
            else:
                by_id[hit.chunk_id] = hit
    vw, tw = options.vector_weight, options.text_weight if hybrid else 0.0
    if vw + tw == 0:
        vw, tw = 0.5, 0.5
    for hit in by_id.values():
        hit.score = (vw * hit.vector_score + tw * hit.text_score) / (vw + tw)
    return list(by_id.values())


def _relative_text_scores(
    rows: Sequence[ChunkRow], found: dict[int, set[str]], terms: Sequence[str]
) -> dict[int, float]:
    """Keyword scores for the hybrid merge: BM25 relative to this query's best hit, blended
    with the share of query terms the chunk holds.

    The reference maps each BM25 rank on its own to r/(1+r), which is near 1 for almost every
    hit, so the keyword half of the merge barely ranks anything (on LoCoMo, hybrid then scored
    below keyword-only search). Relative to the best hit, it ranks again; the term share keeps
    an absolute anchor so a weak best hit does not get full marks.
    """
    best = max((max(0.0, -r.score) for r in rows), default=0.0)
    query = list(dict.fromkeys(terms))
    out = {}
    for row in rows:
        rel = max(0.0, -row.score) / best if best > 0 else 0.0
        share = len(found[row.id]) / len(query) if query else 0.0
        out[row.id] = (rel + 0.45 * share) / 1.45
    return out


def _finish(store: Store, hits: list[Hit], options: SearchOptions, now: float | None) -> list[Hit]:
    _decay(store, hits, options, now)
    hits.sort(key=lambda h: (-h.score, h.path, h.start_line))
    if options.mmr:
        hits = _mmr(hits, options.mmr_lambda)
    kept = [h for h in hits if h.score >= options.min_score or h.exact]
    if not kept:
        # Exact keyword hits are never silently dropped by the hybrid threshold.
        kept = [h for h in hits if h.keyword]
    return kept[: options.max_results]


def _decay(store: Store, hits: list[Hit], options: SearchOptions, now: float | None) -> None:
    if not options.decay or not hits:
        return
    now = time.time() if now is None else now
    ages = store.file_ages(h.path for h in hits)
    rate = math.log(2) / options.half_life_days
    for hit in hits:
        info = ages.get(hit.path)
        if info is None:
            continue
        kind, day, mtime_ns = info
        if kind in ("evergreen", "topic") and hit.source == "memory":
            continue
        if kind == "daily" and day:
            d = date.fromisoformat(day)
            when = datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()
        else:
            when = mtime_ns / 1e9
        age_days = max(0.0, (now - when) / DAY)
        hit.score *= math.exp(-rate * age_days)


def _mmr(hits: list[Hit], lam: float) -> list[Hit]:
    """Greedy maximal-marginal-relevance order (Jaccard over tokens)."""
    if len(hits) < 2 or lam >= 1.0:
        return hits
    scores = [h.score for h in hits]
    lo, hi = min(scores), max(scores)
    rel = [1.0 if hi == lo else (s - lo) / (hi - lo) for s in scores]
    tokens = [mmr_tokens(h.snippet) for h in hits]
    # The highest similarity of each candidate to anything chosen so far, kept up to date
    # after every pick: O(n^2) comparisons instead of O(n^3).
    max_sim = [0.0] * len(hits)
    chosen: list[int] = []
    left = set(range(len(hits)))
    while left:
        best = max(left, key=lambda i: (lam * rel[i] - (1 - lam) * max_sim[i], hits[i].score, -i))
        chosen.append(best)
        left.discard(best)
        for i in left:
            max_sim[i] = max(max_sim[i], _jaccard(tokens[i], tokens[best]))
    return [hits[i] for i in chosen]


def _jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)
