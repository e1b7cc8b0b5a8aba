"""Hybrid search: FTS5 keyword and vector candidates merged, decayed, diversified.

Keyword queries OR their terms and let BM25 rank, so natural-language questions find the chunks
that hold most of their words; CJK runs become bigram terms.

Over 400 lines: it is the whole ranking pipeline (candidates, merge, decay, MMR, thresholds) in
the order it runs, each step measured against the others in docs/benchmarks.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime
from typing import Any, Literal

import numpy as np

from memd.config import SearchConfig
from memd.embed.base import Embedder, Vectors
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
    text: str = field(default="", repr=False)  # the whole chunk, for the snippet window
    snippet_start_line: int = 0  # the file line the snippet starts at
    match_lines: list[int] = field(default_factory=list)  # file lines holding query terms

    @classmethod
    def from_dict(cls, r: dict[str, Any]) -> Hit:
        return cls(
            r["path"],
            r["start_line"],
            r["end_line"],
            r["score"],
            r["snippet"],
            r["source"],
            r["vector_score"],
            r["text_score"],
            snippet_start_line=r["snippet_start_line"],
            match_lines=list(r["match_lines"]),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(self.score, 6),
            "snippet": self.snippet,
            "snippet_start_line": self.snippet_start_line or self.start_line,
            "match_lines": list(self.match_lines),
            "source": self.source,
            "vector_score": round(self.vector_score, 6),
            "text_score": round(self.text_score, 6),
        }

    def window(self, terms: Sequence[str], max_chars: int) -> None:
        """Make the snippet the part of the chunk that shows the query best: the run of whole
        lines within ``max_chars`` holding the most distinct query terms (then the most
        matching lines, then the earliest), and note which file lines match."""
        if not self.text:
            return
        lines = self.text.split("\n")
        found = [tokens_among(line, terms) if terms else set() for line in lines]
        self.match_lines = [self.start_line + i for i, f in enumerate(found) if f]
        if len(self.text) <= max_chars or not self.match_lines:
            self.snippet_start_line = self.start_line
            self._transcript_lines()
            return
        best: tuple[int, int, int] = (-1, -1, 0)
        best_span = (0, 1)
        for i in range(len(lines)):
            used, seen, matching, j = 0, set[str](), 0, i
            while j < len(lines) and used + len(lines[j]) + (j > i) <= max_chars:
                used += len(lines[j]) + (j > i)
                seen |= found[j]
                matching += bool(found[j])
                j += 1
            score = (len(seen), matching, -i)
            if j > i and score > best:
                best, best_span = score, (i, j)
        i, j = best_span
        if best[0] <= 0:  # not even one line fits: the first matching line, cut
            i = self.match_lines[0] - self.start_line
            self.snippet = lines[i][:max_chars]
        else:
            self.snippet = "\n".join(lines[i:j])
        self.snippet_start_line = self.start_line + i
        self._transcript_lines()

    def _transcript_lines(self) -> None:
        """A transcript chunk's lines are rendered messages, not its file's JSONL lines: its
        snippet cites the chunk, and no line is named."""
        if self.source != "memory":
            self.snippet_start_line, self.match_lines = self.start_line, []


@dataclass
class SearchOutcome:
    results: list[Hit]
    mode: str  # the mode actually used
    provider: str
    model: str
    note: str | None = None  # why the mode used differs from the one asked for
    # The hits as a reply carries them, when they came that way (from a reader process):
    # they go on as they are, never made Hits again to be made maps again.
    shaped: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def hits(self) -> list[Any]:
        """The hits as a reply carries them (``memd_client.types.SearchHit``)."""
        if self.shaped is not None:
            return self.shaped
        return [h.to_dict() for h in self.results]

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> SearchOutcome:
        """An outcome as a reader process sent it; its Hits are made only if asked for."""
        outcome = cls([], reply["mode"], reply["provider"], reply["model"], reply["note"])
        outcome.shaped = list(reply["results"])
        outcome.results = _LazyHits(outcome.shaped)
        return outcome


class _LazyHits(list[Hit]):
    """Hits made from shaped hits the first time they are looked at (tests, the CLI)."""

    def __init__(self, shaped: list[dict[str, Any]]) -> None:
        super().__init__()
        self._shaped: list[dict[str, Any]] | None = shaped

    def _fill(self) -> None:
        if self._shaped is not None:
            shaped, self._shaped = self._shaped, None
            self.extend(Hit.from_dict(r) for r in shaped)

    def __iter__(self) -> Any:
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()

    def __getitem__(self, i: Any) -> Any:
        self._fill()
        return super().__getitem__(i)

    def __bool__(self) -> bool:
        return len(self) > 0


# A term found in more than this share of chunks has a BM25 weight of about zero, yet scoring
# it means visiting nearly every chunk: at 10,000 chunks "s" (from "Caroline's") alone cost
# 11 ms. Such terms are left out of the MATCH (they still count in the overlap boost) as long
# as the rarer terms fill the candidates; when they do not, the whole query runs: leaving a term
# out is a speed device and never changes which chunks can be found.
COMMON_TERM_SHARE = 0.5


# The vector half of a chunk: this share its best line's (or pair of lines') cosine, the rest
# its own (tuned on LoCoMo, docs/benchmarks.md).
LINE_SHARE = 2 / 3


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
    """Map an FTS5 bm25 rank (negative, lower is better) into [0, 1) as OpenClaw does."""
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
    started: Future[Vectors] | None = None,
) -> SearchOutcome:
    """Run one search over ``index``; the query vector comes from ``embedder`` when it fits
    (``started``: its embedding of the query, begun by the caller)."""
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
        qvec_future = (
            (started or embedder.start_query(query)) if mode != "keyword" and embedder else None
        )
        match, boost_terms = keyword_match(query, store.reads.doc_freqs)
        keyword_rows: list[ChunkRow] = []
        if mode != "vector" and match:
            keyword_rows = store.reads.keyword_candidates(
                match, options.sources, options.candidates
            )
            if len(keyword_rows) < options.candidates:
                # Too few rows hold the rarer terms: the common ones decide the rest, so a
                # chunk holding only them is still found (dropping them is for speed only).
                every, _ = keyword_match(query)
                if every is not None and every != match:
                    keyword_rows = store.reads.keyword_candidates(
                        every, options.sources, options.candidates
                    )
        waiting = qvec_future is not None and not qvec_future.done()
        if qvec_future is None:
            hits = _keyword_only(store, keyword_rows, boost_terms, options, now)
        elif not waiting:
            hits = _vector_half(
                store, qvec_future.result(), keyword_rows, boost_terms, options, mode, now
            )
    if waiting:
        assert qvec_future is not None
        # The model is busy (a document job runs): wait without holding one of the readers
        # that every other search, get and the writer need. The vector half reads a newer
        # snapshot; it looks chunks up by id, and one removed meanwhile only loses its vector.
        qvec = qvec_future.result()
        with index.reader() as store:
            hits = _vector_half(store, qvec, keyword_rows, boost_terms, options, mode, now)
    for hit in hits:
        hit.window(boost_terms, options.snippet_chars)
    return SearchOutcome(hits, mode, provider, model, note)


def _vector_half(
    store: Store,
    qvec: Vectors,
    keyword_rows: list[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    mode: Mode,
    now: float | None,
) -> list[Hit]:
    """Hybrid or vector hits: the vector candidates, merged with the keyword ones."""
    vector_rows = store.reads.vector_candidates(qvec, options.sources, options.candidates)
    hits = _merge(store, qvec, vector_rows, keyword_rows, terms, options, hybrid=mode == "hybrid")
    return _finish(store, hits, options, now)


def _why_no_vectors(embedder: Embedder | None, identity: object, store: Store) -> str | None:
    if embedder is None:
        return None  # keyword-only by configuration: status says so, not every search
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
        row.path,
        row.start_line,
        row.end_line,
        0.0,
        snippet,
        row.source,
        chunk_id=row.id,
        text=row.text,
        **scores,
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
    """OpenClaw's keyword-only ranking: overlap, density, path and length on top of BM25.

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
    store: Store,
    qvec: Vectors,
    vector_rows: Sequence[ChunkRow],
    keyword_rows: Sequence[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    *,
    hybrid: bool,
) -> list[Hit]:
    """Score the union of the vector and keyword candidates.

    The vector half of a chunk is a third its own cosine and two thirds its best line's (or
    pair of adjacent lines'): one vector for 15-20 turns averages away the one a question is
    about. In hybrid mode each signal is min-max scaled over the candidates (cosines of
    different models live in different ranges) and the keyword half is the keyword-only score
    over the query's best; ``text_weight`` and ``vector_weight`` weigh the halves. The rule and
    its constants were chosen on part of the LoCoMo conversations and checked on the others
    (bench/fusion_study.py, docs/benchmarks.md).
    """
    by_id = {row.id: _hit(row, options) for row in vector_rows}
    keyword: dict[int, float] = {}
    if hybrid:
        found: dict[int, set[str]] = {}
        for hit, row in zip(_keyword_hits(keyword_rows, terms, options, found), keyword_rows):
            mine = by_id.setdefault(row.id, hit)
            mine.keyword, mine.exact = True, hit.exact
            keyword[row.id] = _boost(hit, row.text, found[row.id], row.words, terms)
    chunk, line = _cosines(store, qvec, list(by_id), {r.id: r.score for r in vector_rows})
    if not hybrid:
        for chunk_id, hit in by_id.items():
            mixed = (1 - LINE_SHARE) * chunk[chunk_id] + LINE_SHARE * line[chunk_id]
            hit.vector_score = max(0.0, min(1.0, mixed))
            hit.score = hit.vector_score
        return list(by_id.values())
    chunk_scaled, line_scaled = _min_max(chunk), _min_max(line)
    best = max(keyword.values(), default=0.0)
    # When no candidate matched a keyword, that half says nothing: the vector half is all.
    vw, tw = options.vector_weight, options.text_weight if best > 0 else 0.0
    if vw + tw == 0:
        vw, tw = 0.5, 0.5
    for chunk_id, hit in by_id.items():
        hit.text_score = keyword.get(chunk_id, 0.0) / best if best > 0 else 0.0
        hit.vector_score = (1 - LINE_SHARE) * chunk_scaled[chunk_id] + LINE_SHARE * line_scaled[
            chunk_id
        ]
        hit.score = (vw * hit.vector_score + tw * hit.text_score) / (vw + tw)
    return list(by_id.values())


def _cosines(
    store: Store, qvec: Vectors, ids: list[int], known: dict[int, float]
) -> tuple[dict[int, float], dict[int, float]]:
    """Each candidate's cosine to the query, and the best of that and its lines' and adjacent
    line pairs' cosines.

    A chunk without line vectors (one line, or no vector at all) counts its own cosine as its
    best line's; a chunk without a vector counts 0 for both.
    """
    query = np.asarray(qvec, dtype=np.float32)
    chunk = dict(known)
    missing = [i for i in ids if i not in chunk]
    chunk.update((i, float(v @ query)) for i, v in store.reads.chunk_vectors(missing).items())
    for i in ids:
        chunk[i] = max(0.0, chunk.get(i, 0.0))
    best = dict(chunk)
    lines = {i: v for i, v in store.reads.line_vectors(ids).items() if len(v)}
    if not lines:
        return chunk, best
    # Every candidate's lines in one matrix: one product for the lines, one for the pairs.
    lengths = [len(v) for v in lines.values()]
    owner = np.repeat(np.arange(len(lengths)), lengths)
    vectors = np.concatenate(list(lines.values())).astype(np.float32)
    sims = vectors @ query
    top = np.maximum.reduceat(sims, np.cumsum([0, *lengths[:-1]]))
    # The cosine of the mean of two unit vectors a, b: (a·q + b·q) / |a + b|, where
    # |a + b|² = |a|² + |b|² + 2 a·b.
    norms = np.einsum("ij,ij->i", vectors, vectors)
    dots = np.einsum("ij,ij->i", vectors[1:], vectors[:-1])
    pair_sims = (sims[1:] + sims[:-1]) / np.sqrt(
        np.maximum(norms[1:] + norms[:-1] + 2 * dots, 1e-12)
    )
    same = owner[1:] == owner[:-1]  # a pair never spans two chunks
    pair_top = np.full(len(lengths), -1.0, dtype=np.float32)
    np.maximum.at(pair_top, owner[1:][same], pair_sims[same])
    for key, line, pair in zip(lines, top.tolist(), pair_top.tolist()):
        best[key] = max(chunk[key], line, pair)
    return chunk, best


def _min_max(values: dict[int, float]) -> dict[int, float]:
    """Scale to [0, 1] over the candidates (all 1 when they are equal, 0 stays 0)."""
    present = [v for v in values.values() if v > 0]
    if not present:
        return dict.fromkeys(values, 0.0)
    lo, hi = min(present), max(present)
    return {
        k: (0.0 if v <= 0 else (v - lo) / (hi - lo) if hi > lo else 1.0) for k, v in values.items()
    }


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
    ages = store.reads.file_ages(h.path for h in hits)
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
