"""A query's embedding on one llama.cpp thread and on two, at the pace queries come, with what
each costs the model worker in CPU.

A benchmark that embeds questions back to back keeps the worker's second thread hot: llama.cpp
built with OpenMP (llama-cpp-python's default) lets a thread spin for a while after its work
before it sleeps. Agents search seconds apart, so the second thread is asleep when a query
comes. Here every query waits ``--gap`` seconds after the one before; one worker per thread
count, taking turns question by question, so both see the same machine. The worker's CPU
time comes from /proc (psutil) over the timed queries.

    python bench/query_threads.py [--model PATH] [--gap 1.0] [--queries 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from memd.embed.process import ProcessEmbedder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import SHARED, code_state, environment  # noqa: E402
from worker_boundary import questions_of  # noqa: E402


def worker_cpu(embedder: ProcessEmbedder) -> float:
    """CPU seconds so far of ``embedder``'s worker process."""
    proc = embedder._proc  # noqa: SLF001 - the bench reads the worker's pid
    assert proc is not None
    times = psutil.Process(proc.pid).cpu_times()
    return float(times.user + times.system)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between queries")
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    counts = [int(t) for t in args.threads.split(",")]
    workers = {t: ProcessEmbedder(args.model, threads=t) for t in counts}
    for w in workers.values():
        w.probe()
    questions = questions_of(Path(args.data), args.queries + 10)
    for q in questions[:10]:  # loaded and warm
        for w in workers.values():
            w.embed_batch([q], kind="query")
    time.sleep(args.gap)
    times: dict[int, list[float]] = {t: [] for t in counts}
    cpu = dict.fromkeys(counts, 0.0)
    for i, q in enumerate(questions[10:]):
        for t in counts if i % 2 == 0 else reversed(counts):
            before = worker_cpu(workers[t])
            start = time.perf_counter()
            workers[t].embed_batch([q], kind="query")
            times[t].append((time.perf_counter() - start) * 1000)
            time.sleep(args.gap)  # the worker's threads spin or sleep in here, as after a search
            cpu[t] += worker_cpu(workers[t]) - before
    result: dict[str, Any] = {}
    for t in counts:
        ms = sorted(times[t])
        result[str(t)] = {
            "query_ms_p50": round(statistics.median(ms), 2),
            "query_ms_p90": round(ms[int(0.9 * len(ms))], 2),
            "worker_cpu_ms_per_query": round(1000 * cpu[t] / len(ms), 2),
        }
        print(f"{t} thread(s): {json.dumps(result[str(t)])}", flush=True)
    for w in workers.values():
        w.close()
    if args.json:
        out = {
            **environment(),
            "code": code_state(),
            "model": Path(args.model).name,
            "gap_s": args.gap,
            "queries": len(questions) - 10,
            "threads": result,
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
