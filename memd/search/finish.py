"""The last steps of a ranking: the days a query names, decay by age, order, MMR diversity and
the score thresholds, for the keyword-only list and for the hybrid or vector one.

The two endings sit side by side because they differ only in their thresholds (a keyword-only
list keeps its best hits when none passes; a hybrid one keeps exact keyword hits).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import UTC, date, datetime

from memd.index.reads import ChunkRow
from memd.index.store import Store
from memd.search.hits import Hit
from memd.search.keyword import _boost, _keyword_hits
from memd.search.options import SearchOptions
from memd.search.when import DATE_WEIGHT, Named, closeness
from memd.text import mmr_tokens

DAY = 86_400.0


def _keyword_only(
    store: Store,
    rows: Sequence[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    now: float | None,
    names: tuple[Named, ...],
) -> list[Hit]:
    found: dict[int, set[str]] = {}
    hits = _keyword_hits(rows, terms, options, found)
    by_id = {r.id: r for r in rows}
    for hit in hits:
        row = by_id[hit.chunk_id]
        hit.score = _boost(hit, row.text, found[hit.chunk_id], row.words, terms)
    _dated(store, hits, names)
    _decay(store, hits, options, now)
    hits.sort(key=lambda h: (-h.score, -h.text_score, h.path, h.start_line))
    if options.mmr:
        hits = _mmr(hits, options.mmr_lambda)
    for hit in hits:
        hit.score = min(1.0, hit.score)
    kept = [h for h in hits if h.score >= options.min_score] or hits
    return kept[: options.max_results]


def _finish(
    store: Store,
    hits: list[Hit],
    options: SearchOptions,
    now: float | None,
    names: tuple[Named, ...],
) -> list[Hit]:
    _dated(store, hits, names)
    _decay(store, hits, options, now)
    hits.sort(key=lambda h: (-h.score, h.path, h.start_line))
    if options.mmr:
        hits = _mmr(hits, options.mmr_lambda)
    for hit in hits:
        hit.score = min(1.0, hit.score)  # over 1 only by a date (_dated), once ranked
    kept = [h for h in hits if h.score >= options.min_score or h.exact]
    if not kept:
        # Exact keyword hits are never silently dropped by the hybrid threshold.
        kept = [h for h in hits if h.keyword]
    return kept[: options.max_results]


def _dated(store: Store, hits: list[Hit], names: tuple[Named, ...]) -> None:
    """Rank the daily logs of the days and months the query names higher: DATE_WEIGHT ×
    their closeness is added to their scores (cut to 1 once ranked). No other hit's score
    changes, so a date never pushes a hit under ``min_score``."""
    if not names or not hits:
        return
    ages = store.reads.file_ages(h.path for h in hits)
    near: dict[str, float] = {}
    for path, (kind, day, _) in ages.items():
        if kind == "daily" and day:
            near[path] = closeness(names, date.fromisoformat(day))
    for hit in hits:
        hit.score += DATE_WEIGHT * near.get(hit.path, 0.0)


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
