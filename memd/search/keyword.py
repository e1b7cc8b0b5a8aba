"""The keyword half of a search: the FTS5 MATCH expression, BM25 ranks mapped to scores, and
OpenClaw's boost of a keyword hit (overlap, density, path, length).

Keyword queries OR their terms and let BM25 rank, so natural-language questions find the chunks
that hold most of their words; CJK runs become bigram terms. Its own module because the
benchmarks and the BM25 tests build MATCH expressions exactly as a search does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from memd.index.reads import ChunkRow
from memd.search.hits import Hit, _hit
from memd.search.options import SearchOptions
from memd.text import line_tokens_among, query_terms, tokens_among

__all__ = ["COMMON_TERM_SHARE", "bm25_to_score", "keyword_match"]


# A term found in more than this share of chunks has a BM25 weight of about zero, yet scoring
# it means visiting nearly every chunk: at 10,000 chunks "s" (from "Caroline's") alone cost
# 11 ms. Such terms are left out of the MATCH (they still count in the overlap boost) as long
# as the rarer terms fill the candidates; when they do not, the whole query runs: leaving a term
# out is a speed device and never changes which chunks can be found.
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
    """Map an FTS5 bm25 rank (negative, lower is better) into [0, 1) as OpenClaw does."""
    if not math.isfinite(rank):
        return 1 / 1000
    if rank < 0:
        r = -rank
        return r / (1 + r)
    return 1 / (1 + rank)


def _keyword_hits(
    rows: Sequence[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    found: dict[int, set[str]],
    *,
    by_line: bool = False,
) -> list[Hit]:
    """Hits for FTS rows; ``found`` receives the query terms each chunk holds as tokens.
    ``by_line``: find them line by line, kept on each hit (``Hit.line_terms``) for
    ``_line_cover`` and the snippet window."""
    wanted = set(terms)
    hits = []
    for row in rows:
        lines = line_tokens_among(row.text, wanted) if by_line else None
        found[row.id] = set().union(*lines) if lines is not None else tokens_among(row.text, wanted)
        exact = bool(wanted) and found[row.id] == wanted
        hit = _hit(row, options, text_score=bm25_to_score(row.score), keyword=True, exact=exact)
        hit.line_terms = lines
        hits.append(hit)
    return hits


def _line_cover(lines: Sequence[set[str]], terms: Sequence[str]) -> float:
    """The share of the query's distinct terms that the chunk's best line, or pair of adjacent
    lines, holds as tokens; ``lines`` holds the terms each line holds
    (``line_tokens_among``).

    A chunk of a conversation is 15-20 turns: the one that answers a question has its words
    together, where a chunk that only mentions them has them spread over many lines.
    """
    query = len(set(terms))
    if not query:
        return 0.0
    best = 0
    for i, mine in enumerate(lines):
        if mine:
            best = max(best, len(mine | lines[i + 1]) if i + 1 < len(lines) else len(mine))
    return best / query


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
