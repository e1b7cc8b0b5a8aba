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

import apsw

__all__ = ["BM25", "top_ranked"]

BM25 = "bm25(chunks_fts, 1.0, 1.0, 0.25)"  # body, uni, path: path words count a quarter
K1 = 1.2  # FTS5's constant (ext/fts5/fts5_aux.c)
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
    tokenizer = conn.fts5_tokenizer("porter", ["unicode61", "remove_diacritics", "2"])
    return all(
        len(list(tokenizer(t.encode("utf-8"), apsw.FTS5_TOKENIZE_QUERY, None))) == 1 for t in terms
    )
