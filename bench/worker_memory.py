"""The model worker's memory and speed against how many texts go into one llama.cpp decode.

llama.cpp reserves an output row of ``n_vocab`` floats per output and, in embedding mode, every
token of a decode is an output (memd/embed/llama.py says more). This runs, in a fresh process
per setting, the same texts of the LoCoMo workspaces (chunks cut as memd cuts them, and their
lines) through ``LlamaEmbedder`` with ``MAX_SEQUENCES`` texts a decode, and reports the RSS
once loaded, the peak, after the texts, and after ``shrink()``; the seconds to embed; and the
median query time. Settings alternate over ``--rounds`` so a busy machine touches all alike.

    python bench/worker_memory.py [--model PATH ...] [--sequences 256 8 1] [--texts 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import SHARED, code_state, environment  # noqa: E402  (a sibling script)

QUERIES = ("where did we go hiking", "what does she do for work", "who adopted a dog")


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(model: str, sequences: int, limit: int, threads: int) -> dict[str, Any]:
    """One setting, measured in this process (which the parent started for it alone)."""
    from memd.embed import llama
    from memd.index.chunk import chunk_text, vector_lines
    from memd.markdown.discover import discover

    llama.MAX_SEQUENCES = sequences
    embedder = llama.LlamaEmbedder(model, threads=threads)
    embedder.load()
    loaded = _status("VmRSS")
    texts: list[str] = []
    for ws in sorted(p for p in (SHARED / "data" / "locomo-dev").iterdir() if p.is_dir()):
        for f in discover(ws).files:
            content = f.abs.read_text(encoding="utf-8")
            for c in chunk_text(content, 400, 80, count_tokens=embedder.count_tokens):
                texts.append(c.text)
                texts.extend(line for line, _ in vector_lines(c.text))
    texts = list(dict.fromkeys(texts))[:limit]
    tokens = sum(embedder.count_tokens(t) for t in texts)
    start = time.perf_counter()
    for i in range(0, len(texts), 32):
        embedder.embed_batch(texts[i : i + 32])
    seconds = time.perf_counter() - start
    after = _status("VmRSS")
    embedder.shrink()
    shrunk = _status("VmRSS")
    query_ms = []
    for _ in range(10):
        for q in QUERIES:
            t = time.perf_counter()
            embedder.embed_batch([q], kind="query")
            query_ms.append(1000 * (time.perf_counter() - t))
    return {
        "sequences": sequences,
        "texts": len(texts),
        "tokens": tokens,
        "embed_s": round(seconds, 2),
        "rss_loaded_mb": round(loaded),
        "rss_peak_mb": round(_status("VmHWM")),
        "rss_after_texts_mb": round(after),
        "rss_after_shrink_mb": round(shrunk),
        "rss_after_queries_mb": round(_status("VmRSS")),
        "query_ms_p50": round(statistics.median(query_ms), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = SHARED / "models"
    ap.add_argument(
        "--model",
        nargs="+",
        default=[
            str(models / "all-MiniLM-L6-v2.Q8_0.gguf"),
            str(models / "multilingual-e5-small.Q4_0.gguf"),
        ],
    )
    ap.add_argument("--sequences", type=int, nargs="+", default=[256, 8, 1])
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "SEQUENCES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        result = child(args.child[0], int(args.child[1]), args.texts, args.threads)
        print(json.dumps(result))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for model in args.model:
            for sequences in args.sequences:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", model, str(sequences)]
                    + ["--texts", str(args.texts), "--threads", str(args.threads)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                key = f"{Path(model).name} x{sequences}"
                runs.setdefault(key, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(key, runs[key][-1], flush=True)
    summary = {
        key: {
            field: statistics.median(r[field] for r in rs)
            for field in rs[0]
            if isinstance(rs[0][field], (int, float))
        }
        for key, rs in runs.items()
    }
    result = {**environment(), "code": code_state(), "runs": runs, "median": summary}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
