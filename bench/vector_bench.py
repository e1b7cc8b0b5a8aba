"""The vector half alone: sqlite-vec's exact scan against memd's in-memory sketch, at ~10k and
~100k chunks.

Vectors: the LoCoMo chunk and line vectors MiniLM made (from an embedding cache, --cache), each
repeated with a little noise (σ 0.02 per dimension, renormalised) until the size is reached,
so neighbours crowd as they do in years of similar notes. Queries: the LoCoMo dev questions,
embedded by MiniLM in its worker. Both stores are filled through memd's own Store, so the
sketch follows the file through its vector log as in the daemon.

For each size: p50/p99 of one k-NN (k = 24, the candidates of a default search) for the exact
vec0 scan and for the sketch (projected pass over every vector, the best 1% ranked again with
their 8-bit residuals, the best 96 of those scored exactly), the sketch's recall of the exact top ten (a hit counts when its exact score is at
least the tenth's), its load time and its memory.

    python bench/vector_bench.py [--sizes 10000,100000] [--queries 200] [--cache FILE]
                                 [--model FILE] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from memd.embed.process import ProcessEmbedder
from memd.index.db import atomic, connect
from memd.index.schema import migrate
from memd.index.sketch import Sketch
from memd.index.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import SHARED  # noqa: E402

K = 24


def corpus(cache: Path, size: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float32]]:
    import sqlite3

    con = sqlite3.connect(cache)
    rows = con.execute("SELECT embedding FROM embedding_cache WHERE dims = 384").fetchall()
    base = np.stack([np.frombuffer(r[0], dtype=np.float32) for r in rows])
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    parts = [base]
    while sum(len(p) for p in parts) < size:
        noisy = base + rng.normal(0, 0.02, base.shape).astype(np.float32)
        parts.append(noisy / np.linalg.norm(noisy, axis=1, keepdims=True))
    return np.concatenate(parts)[:size].astype(np.float32)


def fill(path: Path, kind: str, vectors: np.ndarray[Any, Any]) -> None:
    conn = connect(path, load_vec=kind == "vec0")
    migrate(conn)
    store = Store(conn, kind, vectors.shape[1])  # type: ignore[arg-type]
    with atomic(conn):
        store.ensure_vector_table()
        for i, v in enumerate(vectors, start=1):
            conn.execute(  # the row a hit is joined to
                "INSERT INTO chunks (id, path, start_line, end_line, hash, model, text, embedded, "
                "updated_at) VALUES (?, ?, 1, 1, '', 'm', '', 1, 0)",
                (i, f"memory/{i % 997}.md"),
            )
            store._insert_vector(i, v, None)
    conn.close()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def run(size: int, vectors: np.ndarray[Any, Any], queries: np.ndarray[Any, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        vec_path, plain_path = Path(tmp) / "vec0.sqlite", Path(tmp) / "plain.sqlite"
        fill(vec_path, "vec0", vectors)
        fill(plain_path, "plain", vectors)
        vconn = connect(vec_path, load_vec=True, readonly=True)
        pconn = connect(plain_path, load_vec=False, readonly=True)
        exact_store = Store(vconn, "vec0", vectors.shape[1])
        sketch = Sketch(vectors.shape[1])
        started = time.perf_counter()
        sketch.refresh(pconn)
        load_s = time.perf_counter() - started
        fast_store = Store(pconn, "plain", vectors.shape[1], sketch)
        exact_t: list[float] = []
        fast_t: list[float] = []
        recall: list[float] = []
        for q in queries:
            t0 = time.perf_counter()
            exact = exact_store.reads.vector_candidates(q, None, K)
            exact_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fast = fast_store.reads.vector_candidates(q, None, K)
            fast_t.append(time.perf_counter() - t0)
            tenth = exact[9].score
            recall.append(sum(r.score >= tenth - 1e-6 for r in fast[:10]) / 10)
        memory = sum(a.nbytes for a in (sketch.rows, sketch.resid, sketch.ids, sketch.live))
        vconn.close()
        pconn.close()
    return {
        "chunks": size,
        "exact_p50_ms": pct(exact_t, 50),
        "exact_p99_ms": pct(exact_t, 99),
        "sketch_p50_ms": pct(fast_t, 50),
        "sketch_p99_ms": pct(fast_t, 99),
        "speedup_p50": pct(exact_t, 50) / pct(fast_t, 50),
        "recall_at_10": statistics.fmean(recall),
        "recall_min": min(recall),
        "sketch_load_s": load_s,
        "sketch_mb": memory / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--cache", type=Path, required=True, help="an embedding cache of MiniLM")
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    qrels = [json.loads(line) for line in (SHARED / "data" / "locomo-dev" / "qrels.jsonl").open()]
    embedder = ProcessEmbedder(args.model, threads=2)
    try:
        texts = [q["question"] for q in qrels][: args.queries]
        queries = np.stack([embedder.embed_query(t) for t in texts]).astype(np.float32)
    finally:
        embedder.close()
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        row = run(size, corpus(args.cache, size), queries)
        results.append(row)
        print(
            f"{row['chunks']:>7} chunks  exact p50 {row['exact_p50_ms']:6.1f} p99 "
            f"{row['exact_p99_ms']:6.1f} ms · sketch p50 {row['sketch_p50_ms']:5.1f} p99 "
            f"{row['sketch_p99_ms']:5.1f} ms ({row['speedup_p50']:.1f}×) · recall@10 "
            f"{row['recall_at_10']:.4f} (min {row['recall_min']:.2f}) · load "
            f"{row['sketch_load_s']:.2f} s · {row['sketch_mb']:.1f} MB"
        )
    if args.json:
        args.json.write_text(json.dumps({"queries": len(queries), "sizes": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
