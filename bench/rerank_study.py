"""Re-ranking a hybrid search's own candidates offline: the rules tried for R@10.

Reads the indexes `bench/locomo.py --home DIR` built, and for every LoCoMo dev question takes
exactly what memd.search computes before it ranks: the 40 keyword and 40 vector candidates,
each one's boosted keyword score, chunk and best-line cosines (the index's own line vectors),
its closeness to the dates the question names, its stored vector and the query's document
frequencies. Then it ranks them by memd's rule (which must give the daemon's own figures) and
by the rules below (each against memd's rule before the line keyword share, ``before``), on
the tuning split (26, 30, 41) and the held-out one (42, 43):

- ``idf-overlap``: the keyword boost's overlap term counts each query term by its IDF, so a
  name found in every line counts less than the rare word of the question;
- ``keyword min-max``: the keyword half scaled over the candidates as the vector half is,
  instead of over the query's best;
- ``vector feedback``: the query vector moved towards the mean of the best few hits' vectors
  (Rocchio), and the chunk cosines computed again;
- ``neighbours``: a chunk gains a share of the best score of the chunks next to it in its file;
- ``vector rank``: a share of 1 / (k + the candidate's rank in the vector half) added;
- ``line keyword``: the keyword half's counterpart of the line vectors: a keyword candidate
  gains a share of the query's IDF mass that its best line (or pair of adjacent lines) holds,
  so a chunk with the question's words together in one line outranks one that has them spread
  over twenty.

    python bench/rerank_study.py --home DIR --model GGUF [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memd.embed.process import ProcessEmbedder
from memd.index.index import Index
from memd.search.fusion import LINE_KEYWORD_SHARE, LINE_SHARE, _cosines
from memd.search.keyword import _boost, _keyword_hits, _line_cover, keyword_match
from memd.search.options import SearchOptions
from memd.search.when import DATE_WEIGHT, closeness, named_dates
from memd.text import line_tokens_among, tokens_among

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import SHARED  # noqa: E402  (a sibling script)

TUNE = ("26", "30", "41")
HOLD = ("42", "43")
DEPTH = 40  # max_results 10 × candidate_multiplier 4, as search() asks


@dataclass
class Cand:
    path: str
    start: int
    end: int
    keyword: float  # the boosted keyword score (without the line share), 0 when not a candidate
    chunk: float  # the chunk's cosine
    line: float  # the best of the chunk's, its lines' and adjacent line pairs' cosines
    near: float  # closeness to the dates the question names (daily logs only)
    vector: np.ndarray | None
    found: frozenset[str]
    lines: list[frozenset[str]]  # the query terms each line of the chunk holds
    text: str


@dataclass
class Question:
    question: dict[str, Any]
    qvec: np.ndarray
    terms: list[str]
    idf: dict[str, float]
    cands: list[Cand]


Rule = Callable[[Question], list[float]]


def gather(home: Path, model: str, data: Path) -> list[Question]:
    qrels = [json.loads(line) for line in (data / "qrels.jsonl").open()]
    indexes = {}
    for path in sorted((home / "daemon-local" / "state" / "indexes").glob("*.sqlite")):
        index = Index(path)
        index.open()
        indexes[path.name.split("-")[0]] = index
    embedder = ProcessEmbedder(model, threads=2)
    options = SearchOptions()
    today = datetime.date.today()
    out = []
    for start in range(0, len(qrels), 32):
        batch = qrels[start : start + 32]
        qvecs = embedder.embed_batch([q["question"] for q in batch], kind="query")
        for q, qvec in zip(batch, qvecs):
            with indexes[q["conv"]].reader() as store:
                out.append(candidates(store, q, np.asarray(qvec, np.float32), options, today))
    embedder.close()
    for index in indexes.values():
        index.close()
    return out


def candidates(
    store: Any, q: dict[str, Any], qvec: np.ndarray, options: SearchOptions, today: Any
) -> Question:
    """memd.search's candidates and signals for one question (the same calls, unranked)."""
    match, terms = keyword_match(q["question"], store.reads.doc_freqs)
    rows = store.reads.keyword_candidates(match, None, DEPTH) if match else []
    if len(rows) < DEPTH:
        every, _ = keyword_match(q["question"])
        if every is not None and every != match:
            rows = store.reads.keyword_candidates(every, None, DEPTH)
    vector_rows = store.reads.vector_candidates(qvec, None, DEPTH)
    found: dict[int, set[str]] = {}
    keyword = {
        row.id: _boost(hit, row.text, found[row.id], row.words, terms)
        for hit, row in zip(_keyword_hits(rows, terms, options, found), rows)
    }
    by_id = {row.id: row for row in vector_rows}
    by_id.update((row.id, row) for row in rows)
    chunk, line = _cosines(store, qvec, list(by_id), {r.id: r.score for r in vector_rows})
    vectors = store.reads.chunk_vectors(list(by_id))
    names = named_dates(q["question"], today)
    near = {}
    for path, (kind, day, _) in store.reads.file_ages(r.path for r in by_id.values()).items():
        if names and kind == "daily" and day:
            near[path] = closeness(names, datetime.date.fromisoformat(day))
    unique = list(dict.fromkeys(terms))
    freqs, total = store.reads.doc_freqs(unique)
    idf = {
        t: math.log((total - freqs.get(t, 0) + 0.5) / (freqs.get(t, 0) + 0.5) + 1) for t in unique
    }
    cands = [
        Cand(
            row.path,
            row.start_line,
            row.end_line,
            keyword.get(i, 0.0),
            chunk[i],
            line[i],
            near.get(row.path, 0.0),
            np.asarray(vectors[i], np.float32) if i in vectors else None,
            frozenset(found.get(i, ())),
            [frozenset(tokens_among(line, unique)) for line in row.text.split("\n")],
            row.text,
        )
        for i, row in by_id.items()
    ]
    return Question(q, qvec, unique, idf, cands)


def min_max(values: list[float]) -> list[float]:
    """memd.search.fusion's scaling: over the candidates above 0, 0 stays 0."""
    present = [v for v in values if v > 0]
    if not present:
        return [0.0] * len(values)
    lo, hi = min(present), max(present)
    return [0.0 if v <= 0 else (v - lo) / (hi - lo) if hi > lo else 1.0 for v in values]


def vector_half(cands: list[Cand], chunk: list[float] | None = None) -> list[float]:
    scaled = min_max(chunk if chunk is not None else [c.chunk for c in cands])
    lines = min_max([c.line for c in cands])
    return [(1 - LINE_SHARE) * a + LINE_SHARE * b for a, b in zip(scaled, lines)]


def merged(
    q: Question, keyword: list[float], *, scale: bool = False, chunk: list[float] | None = None
) -> list[float]:
    """memd's merge: 0.7 keyword (over the best, or min-max) + 0.3 vector half, plus dates."""
    best = max(keyword, default=0.0)
    text = min_max(keyword) if scale else [k / best if best > 0 else 0.0 for k in keyword]
    tw, vw = (0.7 if best > 0 else 0.0), 0.3
    return [
        (vw * v + tw * k) / (vw + tw) + DATE_WEIGHT * c.near
        for c, k, v in zip(q.cands, text, vector_half(q.cands, chunk))
    ]


def rule_memd(q: Question) -> list[float]:
    return merged(
        q,
        [
            c.keyword
            + LINE_KEYWORD_SHARE * _line_cover(line_tokens_among(c.text, q.terms), q.terms)
            if c.keyword
            else 0.0
            for c in q.cands
        ],
    )


def rule_before(q: Question) -> list[float]:
    """memd's rule before the line keyword share: the baseline of every rule below."""
    return merged(q, [c.keyword for c in q.cands])


def idf_keyword(q: Question, c: Cand) -> float:
    """The keyword boost with an overlap that counts each term by its IDF."""
    if not c.keyword:
        return 0.0
    counted = q.idf.get
    share = sum(counted(t, 0.0) for t in c.found) / max(1e-9, sum(q.idf.values()))
    plain = len(c.found) / max(1, len(q.terms))
    return c.keyword + 0.45 * (share - plain)


def rule_idf_overlap(q: Question) -> list[float]:
    return merged(q, [idf_keyword(q, c) for c in q.cands])


def rule_keyword_min_max(q: Question) -> list[float]:
    return merged(q, [c.keyword for c in q.cands], scale=True)


def rule_feedback(alpha: float, top: int) -> Rule:
    def rule(q: Question) -> list[float]:
        first = rule_before(q)
        order = sorted(range(len(q.cands)), key=lambda i: -first[i])[:top]
        kept = [v for i in order if (v := q.cands[i].vector) is not None]
        if not kept:
            return first
        moved = q.qvec + alpha * np.mean(kept, axis=0)
        moved /= np.linalg.norm(moved)
        chunk = [
            max(0.0, float(c.vector @ moved)) if c.vector is not None else 0.0 for c in q.cands
        ]
        return merged(q, [c.keyword for c in q.cands], chunk=chunk)

    return rule


def rule_neighbours(share: float) -> Rule:
    def rule(q: Question) -> list[float]:
        first = rule_before(q)
        cands = q.cands
        out = []
        for i, c in enumerate(cands):
            beside = [
                first[j]
                for j, d in enumerate(cands)
                if j != i and d.path == c.path and d.start <= c.end + 2 and c.start <= d.end + 2
            ]
            out.append(first[i] + share * max(beside, default=0.0))
        return out

    return rule


def rule_vector_rank(share: float, k: int) -> Rule:
    def rule(q: Question) -> list[float]:
        first = rule_before(q)
        half = vector_half(q.cands)
        order = sorted(range(len(q.cands)), key=lambda i: -half[i])
        rank = {i: n for n, i in enumerate(order, 1)}
        return [s + share / (k + rank[i]) for i, s in enumerate(first)]

    return rule


def line_cover(q: Question, c: Cand, *, weighted: bool = True) -> float:
    """The share of the query's terms (by IDF, or counted) that the chunk's best line, or pair
    of adjacent lines, holds."""
    weight = {t: q.idf.get(t, 0.0) if weighted else 1.0 for t in q.terms}
    total = sum(weight.values())
    if total <= 0:
        return 0.0
    best = 0.0
    for i, line in enumerate(c.lines):
        pair = line | c.lines[i + 1] if i + 1 < len(c.lines) else line
        best = max(best, sum(weight.get(t, 0.0) for t in pair))
    return best / total


def rule_line_keyword(share: float, *, weighted: bool = True, all_cands: bool = False) -> Rule:
    def rule(q: Question) -> list[float]:
        keyword = [
            c.keyword + share * line_cover(q, c, weighted=weighted)
            if c.keyword or all_cands
            else 0.0
            for c in q.cands
        ]
        return merged(q, keyword)

    return rule


def evaluate(rule: Rule, questions: list[Question]) -> dict[str, float]:
    hits = {1: 0, 5: 0, 10: 0}
    rr = 0.0
    for q in questions:
        scores = rule(q)
        cands = q.cands
        order = sorted(range(len(cands)), key=lambda i: (-scores[i], cands[i].path, cands[i].start))
        evidence = [(e["path"], e["line"]) for e in q.question["evidence"]]
        first = next(
            (
                n
                for n, i in enumerate(order, 1)
                if any(
                    p == cands[i].path and cands[i].start <= ln <= cands[i].end
                    for p, ln in evidence
                )
            ),
            0,
        )
        for k in hits:
            hits[k] += bool(first and first <= k)
        rr += 1 / first if first else 0.0
    n = max(1, len(questions))
    return {"R@1": hits[1] / n, "R@5": hits[5] / n, "R@10": hits[10] / n, "MRR": rr / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="a home `bench/locomo.py --home` filled")
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    questions = gather(Path(args.home), args.model, Path(args.data))
    split = {
        "tune": [q for q in questions if q.question["conv"] in TUNE],
        "hold": [q for q in questions if q.question["conv"] in HOLD],
        "all": questions,
    }
    rules: dict[str, Rule] = {
        "memd": rule_memd,
        "before": rule_before,
        "idf-overlap": rule_idf_overlap,
        "keyword min-max": rule_keyword_min_max,
    }
    for alpha in (0.3, 1.0):
        for top in (3, 5):
            rules[f"vector feedback {alpha} top {top}"] = rule_feedback(alpha, top)
    for share in (0.05, 0.1, 0.2):
        rules[f"neighbours {share}"] = rule_neighbours(share)
    for share in (0.1, 0.2, 0.4, 0.8):
        for k in (1, 3, 10):
            rules[f"vector rank {share} k={k}"] = rule_vector_rank(share, k)
    for share in (0.1, 0.2, 0.3, 0.45, 0.7):
        rules[f"line keyword {share}"] = rule_line_keyword(share)
        rules[f"line keyword {share}, counted"] = rule_line_keyword(share, weighted=False)
        rules[f"line keyword {share}, every candidate"] = rule_line_keyword(share, all_cands=True)
    table = {name: {s: evaluate(r, qs) for s, qs in split.items()} for name, r in rules.items()}
    metrics = ("R@1", "R@5", "R@10", "MRR")
    print(f"| rule | {' | '.join(f'{s} R@1/5/10/MRR' for s in split)} |")
    print("|---|" + "---|" * len(split))
    for name, by_split in table.items():
        cells = " | ".join(" / ".join(f"{by_split[s][m]:.3f}" for m in metrics) for s in split)
        print(f"| {name} | {cells} |")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
