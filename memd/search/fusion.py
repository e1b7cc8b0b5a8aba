"""The vector half of a search and its fusion with the keyword half: each candidate's chunk and
best-line cosines, min-max scaled and weighed against the keyword scores.

Its own module because the rule and its constants were chosen together on LoCoMo
(bench/fusion_study.py, docs/benchmarks.md) and change together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from memd.embed.base import Vectors
from memd.index.reads import ChunkRow
from memd.index.store import Store
from memd.search.hits import Hit, _hit
from memd.search.keyword import _boost, _keyword_hits, _line_cover
from memd.search.options import SearchOptions

__all__ = ["LINE_KEYWORD_SHARE", "LINE_SHARE", "KeywordHalf", "keyword_half"]


# The vector half of a chunk: this share its best line's (or pair of lines') cosine, the rest
# its own (tuned on LoCoMo, docs/benchmarks.md).
LINE_SHARE = 2 / 3
# The keyword half's counterpart: a keyword candidate gains this times the share of the query's
# terms that its best line (or pair of adjacent lines) holds. Tuned on LoCoMo conversations 26,
# 30 and 41 with multilingual-e5, confirmed on 42 and 43 and with MiniLM (docs/benchmarks.md).
LINE_KEYWORD_SHARE = 0.7


@dataclasses.dataclass
class KeywordHalf:
    """What a hybrid search can work out before its query's vector comes: the keyword
    candidates' hits and scores, and their line vectors made ready (``search`` does it while
    the query embeds)."""

    rows: Sequence[ChunkRow]
    hits: list[Hit]
    scores: dict[int, float]
    vectors: dict[int, Vectors]  # the candidates' own stored vectors
    lines: _Lines | None


def keyword_half(
    store: Store, keyword_rows: Sequence[ChunkRow], terms: Sequence[str], options: SearchOptions
) -> KeywordHalf:
    """The keyword half of a hybrid search: each candidate's keyword-only score over the
    query's best, its boost raised by how many of the query's terms one line (or pair of
    adjacent lines) holds; and the candidates' line vectors, read and made ready."""
    found: dict[int, set[str]] = {}
    hits = _keyword_hits(keyword_rows, terms, options, found, by_line=True)
    scores: dict[int, float] = {}
    for hit, row in zip(hits, keyword_rows):
        assert hit.line_terms is not None
        scores[row.id] = _boost(
            hit, row.text, found[row.id], row.words, terms
        ) + LINE_KEYWORD_SHARE * _line_cover(hit.line_terms, terms)
    ids = [row.id for row in keyword_rows]
    vectors = store.reads.chunk_vectors(ids)
    return KeywordHalf(keyword_rows, hits, scores, vectors, _Lines(store, ids) if ids else None)


def _merge(
    store: Store,
    qvec: Vectors,
    vector_rows: Sequence[ChunkRow],
    half: KeywordHalf | None,
    options: SearchOptions,
) -> list[Hit]:
    """Score the union of the vector and keyword candidates (``half`` is None in vector
    mode).

    The vector half of a chunk is a third its own cosine and two thirds its best line's (or
    pair of adjacent lines'): one vector for 15-20 turns averages away the one a question is
    about. In hybrid mode each signal is min-max scaled over the candidates (cosines of
    different models live in different ranges) and the keyword half is :func:`keyword_half`'s
    score; ``text_weight`` and ``vector_weight`` weigh the halves. The rule and its constants
    were chosen on part of the LoCoMo conversations and checked on the others
    (bench/fusion_study.py, docs/benchmarks.md).
    """
    by_id = {row.id: _hit(row, options) for row in vector_rows}
    keyword: dict[int, float] = {}
    if half is not None:
        for hit, row in zip(half.hits, half.rows):
            mine = by_id.setdefault(row.id, hit)
            mine.keyword, mine.exact, mine.line_terms = True, hit.exact, hit.line_terms
        keyword = half.scores
    chunk, line = _cosines(store, qvec, list(by_id), {r.id: r.score for r in vector_rows}, half)
    if half is None:
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
    store: Store,
    qvec: Vectors,
    ids: list[int],
    known: dict[int, float],
    half: KeywordHalf | None = None,
) -> tuple[dict[int, float], dict[int, float]]:
    """Each candidate's cosine to the query, and the best of that and its lines' and adjacent
    line pairs' cosines (``half``: the keyword candidates' vectors and lines, read beforehand).

    A chunk without line vectors (one line, or no vector at all) counts its own cosine as its
    best line's; a chunk without a vector counts 0 for both.
    """
    query = np.asarray(qvec, dtype=np.float32)
    chunk = dict(known)
    missing = [i for i in ids if i not in chunk]
    vectors = dict(half.vectors) if half is not None else {}
    read = {row.id for row in half.rows} if half is not None else set()
    vectors.update(store.reads.chunk_vectors([i for i in missing if i not in read]))
    missing = [i for i in missing if i in vectors]
    if missing:
        own = np.stack([vectors[i] for i in missing]).astype(np.float32) @ query
        chunk.update(zip(missing, own.tolist()))
    for i in ids:
        chunk[i] = max(0.0, chunk.get(i, 0.0))
    best = dict(chunk)
    ready = half.lines if half is not None else None
    rest = [i for i in ids if ready is None or i not in ready.asked]
    for lines in (ready, _Lines(store, rest) if rest else None):
        if lines is None:
            continue
        for key, line in lines.best(query).items():
            best[key] = max(chunk[key], line)
    return chunk, best


class _Lines:
    """The line vectors of some chunks, ready for any query: one float32 matrix (a product
    with the query gives every line's cosine) and each adjacent pair's |a + b|.

    Made for a search's keyword candidates while its query embeds, and for the vector
    candidates after; the cast from float16 and the pairs' norms are most of the work.
    """

    def __init__(self, store: Store, ids: list[int]) -> None:
        self.asked = set(ids)
        lines = {i: v for i, v in store.reads.line_vectors(ids).items() if len(v)}
        self.ids = list(lines)
        if not lines:
            return
        lengths = [len(v) for v in lines.values()]
        self.starts = np.cumsum([0, *lengths[:-1]])
        owner = np.repeat(np.arange(len(lengths)), lengths)
        self.vectors = np.concatenate(list(lines.values())).astype(np.float32)
        # The cosine of the mean of two unit vectors a, b: (a·q + b·q) / |a + b|, where
        # |a + b|² = |a|² + |b|² + 2 a·b.
        norms = np.einsum("ij,ij->i", self.vectors, self.vectors)
        dots = np.einsum("ij,ij->i", self.vectors[1:], self.vectors[:-1])
        self.pair_norms = np.sqrt(np.maximum(norms[1:] + norms[:-1] + 2 * dots, 1e-12))
        self.same = owner[1:] == owner[:-1]  # a pair never spans two chunks
        self.pair_owner = owner[1:][self.same]

    def best(self, query: np.ndarray[Any, np.dtype[np.float32]]) -> dict[int, float]:
        """Each chunk's best line or adjacent pair of lines: its cosine to ``query``."""
        if not self.ids:
            return {}
        sims = self.vectors @ query
        top = np.maximum.reduceat(sims, self.starts)
        pair_sims = (sims[1:] + sims[:-1]) / self.pair_norms
        pair_top = np.full(len(self.ids), -1.0, dtype=np.float32)
        np.maximum.at(pair_top, self.pair_owner, pair_sims[self.same])
        return {
            key: max(line, pair)
            for key, line, pair in zip(self.ids, top.tolist(), pair_top.tolist())
        }


def _min_max(values: dict[int, float]) -> dict[int, float]:
    """Scale to [0, 1] over the candidates (all 1 when they are equal, 0 stays 0)."""
    present = [v for v in values.values() if v > 0]
    if not present:
        return dict.fromkeys(values, 0.0)
    lo, hi = min(present), max(present)
    return {
        k: (0.0 if v <= 0 else (v - lo) / (hi - lo) if hi > lo else 1.0) for k, v in values.items()
    }
