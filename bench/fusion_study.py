"""How keyword and vector candidates are merged in hybrid search: the study behind the constants.

Reads the indexes `bench/locomo.py --home DIR` built (one model per home), asks every LoCoMo dev
question once for its keyword and vector candidates (the same calls search() makes), and scores
merge rules offline on two splits of the conversations: the constants are chosen on the tuning
split (26, 30, 41) and must hold on the held-out split (42, 43), which played no part in
choosing them.

    python bench/fusion_study.py --home DIR --model GGUF [--json OUT] [--lines] [--dates]

``--dates`` adds the step that ranks the daily logs of the dates a question names higher
(memd/search/when.py) to memd's rule, at several weights and widths.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memd.embed.process import ProcessEmbedder
from memd.index.index import Index
from memd.index.store import ChunkRow
from memd.markdown.discover import daily_date
from memd.search.keyword import bm25_to_score, keyword_match
from memd.search.when import closeness, named_dates
from memd.text import tokens_among

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
    kw: float = 0.0  # the keyword-only score (BM25 plus overlap/density/path/length boosts)
    vec: float = 0.0  # cosine similarity
    kw_rank: int = 0  # 1-based, 0: not a keyword candidate
    vec_rank: int = 0
    line: float = 0.0  # the best cosine of any one line of the chunk (--lines)
    pair: float = 0.0  # the best cosine of two adjacent lines' mean vector (--lines)


Rule = Callable[[list[Cand]], list[float]]


def boosted(row: ChunkRow, found: set[str], terms: Sequence[str]) -> float:
    query = list(dict.fromkeys(terms))
    base = bm25_to_score(row.score)
    if not query:
        return base
    overlap = len(found)
    path_boost = 0.18 * sum(1 for t in query if t in row.path.lower())
    return (
        base
        + 0.45 * overlap / len(query)
        + 0.2 * overlap / max(1, row.words)
        + path_boost
        + min(len(row.text) / 160, 0.18)
    )


def candidates(index: Index, question: str, qvec: Any) -> list[Cand]:
    with index.reader() as store:
        match, terms = keyword_match(question, store.reads.doc_freqs)
        kw_rows = store.reads.keyword_candidates(match, None, DEPTH) if match else []
        vec_rows = store.reads.vector_candidates(qvec, None, 100_000)  # every chunk's cosine
    by_id: dict[int, Cand] = {}
    wanted = set(terms)
    scored = [(boosted(r, tokens_among(r.text, wanted), terms), r) for r in kw_rows]
    scored.sort(key=lambda sr: -sr[0])
    for rank, (score, r) in enumerate(scored, 1):
        by_id[r.id] = Cand(r.path, r.start_line, r.end_line, kw=score, kw_rank=rank)
    for rank, r in enumerate(vec_rows, 1):
        if rank <= DEPTH:
            c = by_id.setdefault(r.id, Cand(r.path, r.start_line, r.end_line))
            c.vec_rank = rank
        if r.id in by_id:
            by_id[r.id].vec = max(0.0, r.score)
    return list(by_id.values())


def norm(values: list[float]) -> list[float]:
    """Each value over the best of this query (0 stays 0)."""
    top = max(values, default=0.0)
    return [v / top if top > 0 else 0.0 for v in values]


def minmax(values: list[float], present: list[bool]) -> list[float]:
    got = [v for v, p in zip(values, present) if p]
    if not got:
        return [0.0] * len(values)
    lo, hi = min(got), max(got)
    return [
        ((v - lo) / (hi - lo) if hi > lo else 1.0) if p else 0.0 for v, p in zip(values, present)
    ]


def rule_keyword(cands: list[Cand]) -> list[float]:
    return [c.kw if c.kw_rank else -1.0 for c in cands]


def rule_vector(cands: list[Cand]) -> list[float]:
    return [c.vec if c.vec_rank else -1.0 for c in cands]


def rule_linear(w: float) -> Rule:
    """(1 - w) × keyword score over the query's best + w × cosine min-max over the candidates."""

    def rule(cands: list[Cand]) -> list[float]:
        kw = norm([c.kw for c in cands])
        vec = minmax([c.vec for c in cands], [bool(c.vec_rank) for c in cands])
        return [(1 - w) * k + w * v for k, v in zip(kw, vec)]

    return rule


def rule_rrf(k: float, w: float) -> Rule:
    """Reciprocal-rank fusion: (1 - w)/(k + keyword rank) + w/(k + vector rank)."""

    def rule(cands: list[Cand]) -> list[float]:
        return [
            (1 - w) * (1 / (k + c.kw_rank) if c.kw_rank else 0.0)
            + w * (1 / (k + c.vec_rank) if c.vec_rank else 0.0)
            for c in cands
        ]

    return rule


@dataclass
class Dated:
    """memd.search's date step over ``rule``: a daily log's score plus ``weight`` × its
    closeness to the dates the question names, as memd.search adds it."""

    rule: Rule
    weight: float
    width: int

    def __call__(self, cands: list[Cand], question: str) -> list[float]:
        scores = self.rule(cands)
        names = named_dates(question, datetime.date.today())
        if not names:
            return scores
        near = []
        for c in cands:
            day = daily_date(c.path)
            near.append(closeness(names, day, self.width) if day else 0.0)
        return [s + self.weight * n for s, n in zip(scores, near)]


def evaluate(
    rule: Rule | Dated, questions: list[dict[str, Any]], pool: dict[str, list[Cand]]
) -> dict[str, float]:
    hits = {1: 0, 5: 0, 10: 0}
    rr = 0.0
    for q in questions:
        cands = pool[q["qid"]]
        scores = rule(cands, q["question"]) if isinstance(rule, Dated) else rule(cands)
        order = sorted(range(len(cands)), key=lambda i: (-scores[i], cands[i].path, cands[i].start))
        ranked = [cands[i] for i in order][:10]
        evidence = [(e["path"], e["line"]) for e in q["evidence"]]
        first = next(
            (
                n
                for n, c in enumerate(ranked, 1)
                if any(p == c.path and c.start <= line <= c.end for p, line in evidence)
            ),
            0,
        )
        for k in hits:
            hits[k] += bool(first and first <= k)
        rr += 1 / first if first else 0.0
    n = max(1, len(questions))
    return {"R@1": hits[1] / n, "R@5": hits[5] / n, "R@10": hits[10] / n, "MRR": rr / n}


def line_vectors(
    index: Index, embedder: ProcessEmbedder
) -> tuple[list[Cand], list[int], np.ndarray]:
    """Every chunk of ``index``, and one vector per non-blank line: (chunks, owner, vectors)."""
    with index.reader() as store:
        rows = store.conn.execute(
            "SELECT path, start_line, end_line, text FROM chunks ORDER BY id"
        ).fetchall()
    chunks: list[Cand] = []
    owner: list[int] = []
    lines: list[str] = []
    for i, (path, start, end, text) in enumerate(rows):
        chunks.append(Cand(str(path), int(str(start)), int(str(end))))
        for line in str(text).splitlines():
            if len(line.strip()) > 3 and not line.startswith("#"):
                owner.append(i)
                lines.append(line)
    vectors = np.concatenate(
        [embedder.embed_batch(lines[i : i + 32]) for i in range(0, len(lines), 32)]
    )
    return chunks, owner, vectors


def add_line_scores(
    cands: list[Cand], qvec: np.ndarray, chunks: list[Cand], owner: list[int], vectors: np.ndarray
) -> list[Cand]:
    """Give every chunk its best line's cosine; chunks found only this way join as candidates."""
    sims = vectors @ qvec
    best = np.full(len(chunks), -1.0, dtype=np.float32)
    np.maximum.at(best, np.asarray(owner), sims)
    owners = np.asarray(owner)
    same = owners[1:] == owners[:-1]
    pairs = vectors[1:] + vectors[:-1]
    pairs /= np.linalg.norm(pairs, axis=1, keepdims=True)
    pair_best = np.full(len(chunks), -1.0, dtype=np.float32)
    np.maximum.at(pair_best, owners[1:][same], (pairs @ qvec)[same])
    pair_best = np.maximum(pair_best, best)
    by_key = {(c.path, c.start): c for c in cands}
    position = {(c.path, c.start): i for i, c in enumerate(chunks)}
    for key, c in by_key.items():  # every candidate gets its best line's cosine
        c.line = float(best[position[key]])
        c.pair = float(pair_best[position[key]])
    for i in np.argsort(-best)[:DEPTH]:  # and the best chunks by line join the candidates
        c = chunks[int(i)]
        if (c.path, c.start) not in by_key:
            by_key[(c.path, c.start)] = Cand(
                c.path, c.start, c.end, line=float(best[i]), pair=float(pair_best[i])
            )
    return list(by_key.values())


def rule_line(cands: list[Cand]) -> list[float]:
    return [c.line for c in cands]


def rule_kw_line(w: float) -> Rule:
    """(1 - w) × keyword over the best + w × best-line cosine min-max over the candidates."""

    def rule(cands: list[Cand]) -> list[float]:
        kw = norm([c.kw for c in cands])
        line = minmax([c.line for c in cands], [c.line > 0 for c in cands])
        return [(1 - w) * k + w * v for k, v in zip(kw, line)]

    return rule


def rule_kw_chunk_pair(a: float, b: float) -> Rule:
    """memd's rule: (1 - a - b) × keyword over the best + a × chunk cosine + b × best line or
    pair cosine, both min-max over the candidates (a = 0.1, b = 0.2 in memd.search)."""

    def rule(cands: list[Cand]) -> list[float]:
        kw = norm([c.kw for c in cands])
        vec = minmax([c.vec for c in cands], [c.vec > 0 for c in cands])
        pair = [max(c.pair, c.vec) for c in cands]
        line = minmax(pair, [p > 0 for p in pair])
        return [(1 - a - b) * k + a * v + b * p for k, v, p in zip(kw, vec, line)]

    return rule


def rule_kw_line_rrf(k: float, w: float) -> Rule:
    def rule(cands: list[Cand]) -> list[float]:
        order = sorted(range(len(cands)), key=lambda i: -cands[i].line)
        rank = {i: r for r, i in enumerate(order, 1) if cands[i].line > 0}
        return [
            (1 - w) * (1 / (k + c.kw_rank) if c.kw_rank else 0.0)
            + w * (1 / (k + rank[i]) if i in rank else 0.0)
            for i, c in enumerate(cands)
        ]

    return rule


def gather(
    indexes: dict[str, Index], qrels: list[dict[str, Any]], model: str, *, lines: bool
) -> dict[str, list[Cand]]:
    """Every question's candidates (and, with ``lines``, every chunk's best-line cosine)."""
    embedder = ProcessEmbedder(model, threads=2)
    by_line = (
        {conv: line_vectors(index, embedder) for conv, index in indexes.items()} if lines else {}
    )
    pool: dict[str, list[Cand]] = {}
    for start in range(0, len(qrels), 32):
        batch = qrels[start : start + 32]
        qvecs = embedder.embed_batch([q["question"] for q in batch], kind="query")
        for q, qvec in zip(batch, qvecs):
            pool[q["qid"]] = candidates(indexes[q["conv"]], q["question"], qvec)
            if lines:
                pool[q["qid"]] = add_line_scores(pool[q["qid"]], qvec, *by_line[q["conv"]])
    embedder.close()
    return pool


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="a home `bench/locomo.py --home` filled")
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--json", default="")
    ap.add_argument("--lines", action="store_true", help="also score one vector per line")
    ap.add_argument("--pool", default="", help="keep the candidates in this file between runs")
    ap.add_argument("--dates", action="store_true", help="also score the date step")
    args = ap.parse_args(argv)
    qrels = [json.loads(line) for line in (Path(args.data) / "qrels.jsonl").open()]
    indexes = {}
    for path in sorted((Path(args.home) / "daemon-local" / "state" / "indexes").glob("*.sqlite")):
        conv = path.name.split("-")[0]
        index = Index(path)
        index.open()
        indexes[conv] = index
    pool_file = Path(args.pool) if args.pool else None
    if pool_file is not None and pool_file.is_file():
        pool: dict[str, list[Cand]] = pickle.loads(pool_file.read_bytes())
    else:
        pool = gather(indexes, qrels, args.model, lines=args.lines)
        if pool_file is not None:
            pool_file.write_bytes(pickle.dumps(pool))
    split = {
        "tune": [q for q in qrels if q["conv"] in TUNE],
        "hold": [q for q in qrels if q["conv"] in HOLD],
        "all": qrels,
    }
    rules: dict[str, Rule | Dated] = {"keyword": rule_keyword, "vector": rule_vector}
    for w in (0.1, 0.2, 0.3, 0.4, 0.5):
        rules[f"linear w={w}"] = rule_linear(w)
    for k in (10, 30, 60):
        for w in (0.3, 0.4, 0.5):
            rules[f"rrf k={k} w={w}"] = rule_rrf(k, w)
    if args.lines:
        rules["line"] = rule_line
        for w in (0.2, 0.3, 0.4, 0.5, 0.6):
            rules[f"kw+line w={w}"] = rule_kw_line(w)
        for k in (10, 30, 60):
            for w in (0.4, 0.5, 0.6):
                rules[f"kw+line rrf k={k} w={w}"] = rule_kw_line_rrf(k, w)
        for a, b in ((0.0, 0.2), (0.1, 0.1), (0.1, 0.2), (0.1, 0.3), (0.2, 0.2), (0.2, 0.3)):
            rules[f"kw+chunk {a}+pair {b}"] = rule_kw_chunk_pair(a, b)
    if args.dates:
        memd_rule = rule_kw_chunk_pair(0.1, 0.2) if args.lines else rule_linear(0.3)
        for weight in (0.2, 0.3, 0.4, 0.5, 0.7):
            for width in (3, 7, 14):
                rules[f"memd+date {weight} {width}d"] = Dated(memd_rule, weight, width)
        for weight in (0.2, 0.4):
            rules[f"keyword+date {weight} 7d"] = Dated(rule_keyword, weight, 7)
    table = {
        name: {s: evaluate(rule, qs, pool) for s, qs in split.items()}
        for name, rule in rules.items()
    }
    print(f"{'rule':<24}" + "".join(f"{s + ' ' + m:>12}" for s in split for m in ("R@5", "MRR")))
    for name, by_split in table.items():
        cells = "".join(f"{by_split[s][m]:>12.3f}" for s in split for m in ("R@5", "MRR"))
        print(f"{name:<24}{cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    for index in indexes.values():
        index.close()
    return (
        0
        if all(math.isfinite(v) for t in table.values() for s in t.values() for v in s.values())
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
