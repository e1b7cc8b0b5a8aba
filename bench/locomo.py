"""Retrieval quality on the LoCoMo workspaces of ../shared/data/locomo-dev.

Indexes each conversation workspace, runs every question against its own workspace, writes the
ranked results as JSONL and scores them with ../shared/bench/locomo_score.py.

    python bench/locomo.py --mode keyword [--embedder fake|local] [--model PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memd.config import Config, SearchConfig
from memd.embed.base import Embedder
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.search import SearchOptions, search

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def make_embedder(name: str, model: str | None) -> Embedder | None:
    if name == "none":
        return None
    if name == "fake":
        from memd.embed.fake import FakeEmbedder

        return FakeEmbedder()
    from memd.embed.llama import LlamaEmbedder

    return LlamaEmbedder(model or str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--mode", default="keyword", choices=["keyword", "vector", "hybrid"])
    ap.add_argument("--embedder", default="none", choices=["none", "fake", "local"])
    ap.add_argument("--model")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--decay", action="store_true")
    ap.add_argument("--mmr", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--home", default="", help="MEMD_HOME to reuse (its embedding cache)")
    args = ap.parse_args(argv)

    data = Path(args.data)
    qrels = [json.loads(line) for line in (data / "qrels.jsonl").open()]
    embedder = make_embedder(args.embedder, args.model)
    home = args.home or tempfile.mkdtemp(prefix="memd-locomo-")
    config = Config.load(env={"MEMD_HOME": home})
    cache = EmbeddingCache(config.cache_path)
    options = SearchOptions.from_config(
        SearchConfig(),
        mode=args.mode,
        max_results=args.k,
        min_score=0.0,
        decay=args.decay,
        mmr=args.mmr,
    )
    out_path = Path(args.out or tempfile.mkstemp(suffix=".jsonl")[1])
    indexes: dict[str, Index] = {}
    t0 = time.monotonic()
    for conv in sorted({q["conv"] for q in qrels}):
        index = Index(config.index_dir / f"{conv}.sqlite")
        index.open()
        Syncer(index, data / conv, config=config.index, embedder=embedder, cache=cache).sync()
        indexes[conv] = index
    index_s = time.monotonic() - t0
    latencies = []
    with out_path.open("w") as out:
        for q in qrels:
            t = time.perf_counter()
            outcome = search(indexes[q["conv"]], q["question"], options, embedder=embedder)
            latencies.append(time.perf_counter() - t)
            results = [
                {"path": h.path, "start_line": h.start_line, "end_line": h.end_line}
                for h in outcome.results
            ]
            out.write(json.dumps({"qid": q["qid"], "results": results}) + "\n")
    latencies.sort()
    print(
        f"indexed in {index_s:.1f}s; query p50 {latencies[len(latencies) // 2] * 1000:.2f} ms, "
        f"p95 {latencies[int(len(latencies) * 0.95)] * 1000:.2f} ms",
        file=sys.stderr,
    )
    for index in indexes.values():
        index.close()
    cache.close()
    scorer = SHARED / "bench" / "locomo_score.py"
    return subprocess.call([sys.executable, str(scorer), str(data / "qrels.jsonl"), str(out_path)])


if __name__ == "__main__":
    raise SystemExit(main())
