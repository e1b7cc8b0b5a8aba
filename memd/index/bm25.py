"""The best k chunks by FTS5's BM25 for an OR of phrases, without ranking every match.

FTS5 evaluates ``bm25()`` for every row an OR query matches, about a microsecond each, and a
query naming a person ("When did Caroline …") matches every chunk that mentions them: a fifth
of a conversation log. Yet a row's BM25 is a sum over the query's phrases, and one phrase adds
at most ``idf × (k1 + 1)`` whatever the row. So (the "MaxScore" argument of search engines):

1. order the phrases rarest first and take the rarest, R;
2. score every row holding a phrase of R exactly: the rows that hold R and some other phrase
   by the query ``(R) AND (others)`` (its BM25 sums every phrase of the query), the rest by
   ``(R) NOT (others)`` (they hold nothing else; a phrase a row lacks adds nothing);
3. a row holding no phrase of R scores at most the bound of the others. If that is below the
   k-th best score found, no such row can enter the top k and the answer is complete.
   Otherwise the plain query runs. R is taken large enough for the bound to have a chance
   (its phrases could add twice what the others could), and not tried when ranking it would
   cost as much as the plain query.

The result is the plain query's top k (rows with equal scores may come in another order). A
phrase's contribution depends only on its own document count, the row, and the table's
averages: BM25 over a subset of the phrases is that subset's part of the whole sum. The bound
needs each phrase's document count, which fts5vocab gives for single-token phrases without a
column filter; any other phrase (a CJK unigram on its own column, a word that tokenises to two
tokens) makes the query plain.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import apsw
import numpy as np

from memd.index.termcount import tokenizer

__all__ = ["BM25", "Ranked", "rank_postings", "top_ranked"]

BM25 = "bm25(chunks_fts, 1.0, 1.0, 0.25)"  # body, uni, path: path words count a quarter
K1, B = 1.2, 0.75  # FTS5's constants (ext/fts5/fts5_aux.c)
MARGIN = 1e-9  # relative: sums taken in another order differ in the last bits
# Chosen by replaying the 759 LoCoMo questions over 9,776 chunks with each policy: trying
# once, with R's bound at least twice the others' (of 0.5 to 3), had the lowest mean, 1.45x
# faster than the plain query (median 1.75x); growing R a phrase at a time until the bound
# held had a longer tail. bench/scale_bench.py reports both rankings' times per size.
TRY_AT = 2.0
# Below this many matches (summed over the phrases) the plain query takes a millisecond or two
# and the bound's own statements would cost as much.
MIN_MATCHES = 2000
PLAIN_PHRASE = re.compile(r'^"([^"]+)"$')

Ranked = list[tuple[int, float]]  # (rowid, bm25 rank: negative, lower is better), best first
DocFreqs = Callable[[list[str]], tuple[dict[str, int], int]]


def top_ranked(conn: apsw.Connection, match: str, k: int, doc_freqs: DocFreqs) -> Ranked:
    """The ``k`` best rows for ``match`` (phrases joined by `` OR ``), best first."""
    phrases = match.split(" OR ")
    plain = [m.group(1) for p in phrases if (m := PLAIN_PHRASE.match(p))]
    if 1 < len(phrases) == len(plain) and _single_tokens(conn, plain):
        ranked = _bounded(conn, phrases, plain, k, doc_freqs)
        if ranked is not None:
            return ranked
    return _plain(conn, match, k)


def _plain(conn: apsw.Connection, match: str, k: int) -> Ranked:
    sql = (
        f"SELECT rowid, {BM25} AS rank FROM chunks_fts WHERE chunks_fts MATCH ? "
        "ORDER BY rank, rowid LIMIT ?"
    )
    return [(int(r[0]), float(r[1])) for r in conn.execute(sql, (match, k))]


def _bounded(
    conn: apsw.Connection, phrases: list[str], terms: list[str], k: int, doc_freqs: DocFreqs
) -> Ranked | None:
    freqs, total = doc_freqs(terms)
    docs = [freqs.get(t, 0) for t in terms]
    if sum(docs) < MIN_MATCHES:
        return None
    order = sorted(range(len(phrases)), key=lambda i: docs[i])
    bound = [_idf(docs[i], total) * (K1 + 1) for i in order]  # the most a phrase adds
    # R grows until its phrases could add twice what the others could: a smaller R rarely
    # proves the bound, and a failed attempt is paid on top of the plain query.
    m = next(m for m in range(1, len(order) + 1) if sum(bound[:m]) >= TRY_AT * sum(bound[m:]))
    # An attempt ranks each row of R once and looks for the others in it; the plain query
    # ranks each match: not tried when R holds more than half of the matches.
    if m == len(order) or 2 * sum(docs[i] for i in order[:m]) > sum(docs):
        return None
    rare = " OR ".join(phrases[i] for i in order[:m])
    others = " OR ".join(phrases[i] for i in order[m:])
    # The rows of R split in two: those also holding another phrase, ranked by the whole
    # query's phrases, and the rest, ranked by R's alone (their whole score). Each row is
    # ranked once: ranking costs about ten times the matching (52 against 5 ms at 97,501 chunks).
    ranked = [
        (int(r[0]), float(r[1]))
        for r in conn.execute(
            f"SELECT rowid, rank FROM ("
            f"SELECT rowid, {BM25} AS rank FROM chunks_fts WHERE chunks_fts MATCH ? "
            f"UNION ALL SELECT rowid, {BM25} FROM chunks_fts WHERE chunks_fts MATCH ?) "
            "ORDER BY rank, rowid LIMIT ?",
            (f"({rare}) AND ({others})", f"({rare}) NOT ({others})", k),
        )
    ]
    # The margin covers a count that moved since the phrases' counts were read (a commit).
    if len(ranked) == k and -ranked[-1][1] > sum(bound[m:]) * 1.0001:
        return ranked
    return None


def _idf(docs: int, total: int) -> float:
    """FTS5's idf: log((N - n + 0.5) / (n + 0.5)), and 1e-6 where that is not positive."""
    idf = math.log((total - docs + 0.5) / (docs + 0.5)) if total else 0.0
    return idf if idf > 0 else 1e-6


def _single_tokens(conn: apsw.Connection, terms: list[str]) -> bool:
    """Whether each term is one token to the index's tokenizer (its vocab count is exact)."""
    tok = tokenizer(conn)
    return all(
        len(list(tok(t.encode("utf-8"), apsw.FTS5_TOKENIZE_QUERY, None))) == 1 for t in terms
    )


# -- the same top k over postings in memory (memd/index/postings.py) ---------------------------


def rank_postings(
    lists: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], float, float]],
    alive: int,
    total: float,
    lengths: np.ndarray[Any, np.dtype[np.float64]],
    ids: np.ndarray[Any, np.dtype[np.int64]],
    count: int,
    k: int,
) -> Ranked:
    """The top k of the rows in ``lists`` (each phrase's rows, ascending, their weights in
    quarters, its largest weight and the length of its shortest row, in the query's order;
    ``lengths`` and ``ids`` per row, ``count`` rows in all, ``alive`` of them live holding
    ``total`` tokens) by FTS5's bm25, ties by chunk id: memd/index/postings.py's ranking."""
    n = float(alive)
    avgdl = float(total) / n
    idf = []
    for rows, _, _, _ in lists:
        value = math.log((alive - len(rows) + 0.5) / (len(rows) + 0.5))
        idf.append(value if value > 0.0 else 1e-6)

    def part(i: int, f: Any, d: Any) -> Any:
        # fts5_aux.c, operation for operation: the same doubles in the same order
        return idf[i] * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * d / avgdl)))

    bounds = [float(part(i, fmax / 4.0, dmin)) for i, (_, _, fmax, dmin) in enumerate(lists)]
    order = sorted(range(len(lists)), key=lambda i: -bounds[i])  # the most it can add first
    partial = np.zeros(count, dtype=np.float64)
    held = np.zeros(count, dtype=bool)
    rest = sum(bounds)
    for taken, i in enumerate(order, 1):
        rows, weights, _, _ = lists[i]
        partial[rows] += part(i, weights / 4.0, lengths[rows])
        held[rows] = True
        rest -= bounds[i]
        rest = max(rest, 0.0)
        candidates = np.flatnonzero(held)
        if len(candidates) < k and taken < len(order):
            continue
        scores = partial[candidates]
        # the k-th best score so far: no row scores less in the end (parts only add)
        floor = (
            np.partition(scores, len(scores) - k)[len(scores) - k]
            if len(scores) >= k
            else -math.inf
        )
        if taken == len(order) or rest * (1 + MARGIN) < floor:
            # a row outside scores at most ``rest``, below k rows inside; inside, one that
            # could not reach the floor with every other phrase's most is out as well
            keep = candidates[scores + rest * (1 + MARGIN) >= floor - abs(floor) * MARGIN]
            return _exact(lists, part, keep, lengths, ids, count, k)
    return []


def _exact(
    lists: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], float, float]],
    part: Callable[[int, Any, Any], Any],
    rows: np.ndarray[Any, Any],
    lengths: np.ndarray[Any, Any],
    ids: np.ndarray[Any, Any],
    count: int,
    k: int,
) -> Ranked:
    """Score ``rows`` over every phrase in the query's order and keep the best k. A phrase's
    part is looked up for each of the rows, or, when it holds fewer rows than four times
    theirs, computed for all it holds (cheaper than that many binary searches)."""
    score = np.zeros(count, dtype=np.float64)
    d = lengths[rows]
    for i, (held, weights, _, _) in enumerate(lists):
        if len(held) < 4 * len(rows):
            score[held] += part(i, weights / 4.0, lengths[held])
            continue
        at = np.minimum(np.searchsorted(held, rows), len(held) - 1)
        there = held[at] == rows
        if there.any():  # a row without the phrase adds 0.0, as in FTS5
            score[rows] += part(i, np.where(there, weights[at] / 4.0, 0.0), d)
    best_scores = score[rows]
    chunk = ids[rows]
    best = np.lexsort((chunk, -best_scores))[:k]
    return [(int(chunk[j]), -float(best_scores[j])) for j in best]
