"""Where one hybrid search's time goes, stage by stage, on a built index, in-process.

Runs memd.search.search (mode hybrid, the daemon's default options) over the index of a
MEMD_HOME (scale_bench.py builds them) for each LoCoMo question. The query vectors are
embedded first, by the model the index was built with, and handed to the search as they are:
the table is the search's own work beside the query's embedding. Each stage is timed by
wrapping the function that does it (medians over the questions, ms of the searching thread's
CPU time; ``--clock wall`` for elapsed time). The socket, the request's checks and the reply
come on top. The index is only read.

Two options set the search as the daemon meets it when its query has every core:
``--every-core`` leaves the keyword half until the vector comes (as memd.search does then),
and ``--flush-mb N`` reads N MB of memory as the vector is taken, as the model's weights
stream through the caches while the query embeds (74 MB for e5 Q4_0), so that the work after
the vector starts on cold caches.

    python bench/hybrid_profile.py --home DIR/size-25 [--queries 200] [--model GGUF]
                                   [--every-core] [--flush-mb 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

import memd.index.reads as reads_module
import memd.search
import memd.search.finish
import memd.search.fusion
import memd.search.hits
import memd.search.keyword
from memd.embed.base import Embedder, Kind, Vectors
from memd.embed.process import ProcessEmbedder
from memd.index.index import Index
from memd.index.keywords import KeywordIndex
from memd.index.reads import SearchReads
from memd.index.sketch import Sketch
from memd.search import search
from memd.search.options import SearchOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))

from keyword_profile import Stages  # noqa: E402
from socket_bench import SHARED, code_state, environment  # noqa: E402

STAGES: list[tuple[str, Any, str]] = [
    ("keyword: document frequencies", SearchReads, "doc_freqs"),
    ("keyword: the postings' top k", KeywordIndex, "top"),
    ("keyword: FTS5 ranks (postings not ready)", reads_module, "top_ranked"),
    ("keyword candidates, in all", SearchReads, "keyword_candidates"),
    ("vector: the sketch's projected pass", Sketch, "candidates"),
    ("vector: the 8-bit ranking of its best", Sketch, "closest"),
    ("vector: stored vectors read", SearchReads, "chunk_vectors"),
    ("vector: candidates' rows read", SearchReads, "chunks_by_id"),
    ("vector candidates, in all", SearchReads, "vector_candidates"),
    ("merge: line vectors read", SearchReads, "line_vectors"),
    (
        "merge: line vectors made ready (read, cast, pairs' norms)",
        memd.search.fusion._Lines,
        "__init__",
    ),
    ("merge: cosines of chunks and lines", memd.search.fusion, "_cosines"),
    # memd.search calls these by the names it imported: they are wrapped there.
    ("keyword half, before the vector (its lines ready too)", memd.search, "keyword_half"),
    ("merge, after the vector", memd.search, "_merge"),
    ("decay, MMR, thresholds", memd.search, "_finish"),
    ("snippet windows", memd.search.hits.Hit, "window"),
]


class Given(Embedder):
    """The vectors embedded beforehand, under the settings of the model that made them (the
    index accepts them as its own)."""

    def __init__(
        self,
        model: ProcessEmbedder,
        vectors: dict[str, Vectors],
        *,
        every_core: bool = False,
        flush_mb: int = 0,
    ) -> None:
        self.provider, self.model, self.dims = model.provider, model.model, model.dims
        self.max_tokens, self.batch_size = model.max_tokens, model.batch_size
        self._settings = model.settings()
        self.vectors = vectors
        self.every_core = every_core
        self.flush = np.ones(flush_mb << 17) if flush_mb else None  # float64: 8 bytes each

    def query_takes_every_core(self) -> bool:
        return self.every_core

    def start_query(self, text: str) -> Future[Vectors]:
        return _Flushing(self.vectors[text], self.flush)

    def settings(self) -> dict[str, object]:
        return self._settings

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        return np.stack([self.vectors[t] for t in texts])


class _Flushing(Future[Vectors]):
    """A query vector that, when taken, first reads ``flush`` through the caches."""

    def __init__(self, vector: Vectors, flush: np.ndarray[Any, Any] | None) -> None:
        super().__init__()
        self.flush = flush
        self.set_result(vector)

    def result(self, timeout: float | None = None) -> Vectors:
        if self.flush is not None:
            self.flush.sum()
        return super().result(timeout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--every-core", action="store_true", help="the keyword half after the vector")
    ap.add_argument("--flush-mb", type=int, default=0, help="MB read as the vector is taken")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    path = next((Path(args.home) / "state" / "indexes").glob("*.sqlite"))
    qs = [json.loads(line)["question"] for line in (Path(args.data) / "qrels.jsonl").open()]
    qs = [q.strip() for q in qs[: args.queries]]  # as a search strips them
    model = ProcessEmbedder(args.model)
    try:
        embedded = model.embed_batch(qs, kind="query")
        vectors = dict(zip(qs, embedded, strict=True))
        given = Given(model, vectors, every_core=args.every_core, flush_mb=args.flush_mb)
    finally:
        model.close()
    index = Index(path)  # read only: never opened for writing
    index.keywords.build(background=False)
    options = SearchOptions(mode="hybrid")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    stages = Stages(clock)
    stages.current = "hybrid"
    for label, owner, name in STAGES:
        if hasattr(owner, name):  # (earlier code may lack a stage)
            stages.wrap(label, owner, name)
    try:
        for q in qs[:20]:  # warm: the sketch loads, pages come in
            search(index, q, options, embedder=given)
        stages.now.clear()
        for q in qs:
            t = clock()
            outcome = search(index, q, options, embedder=given)
            stages.done(clock() - t)
            assert outcome.mode == "hybrid", outcome.note
        chunks = len(index._sketch) if index._sketch is not None else 0
    finally:
        index.close()
    runs = stages.runs["hybrid"]
    table = {label: round(statistics.median(v), 3) for label, v in runs.items() if any(v)}
    result = {
        **environment(),
        "code": code_state(),
        "queries": len(qs),
        "vectors": chunks,
        "clock": args.clock,
        "every_core": args.every_core,
        "flush_mb": args.flush_mb,
        "median_ms": table,
    }
    print(json.dumps(result, indent=2))
    print("\n| stage | median ms |\n|---|---:|")
    for label in ["search, in all", *stages.labels]:
        if label in table:
            print(f"| {label} | {table[label]:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
