"""The cost of running the local model in a worker process instead of inside the daemon.

Three figures, for one model and thread count:

- query embedding: the median time to embed one short question, through the worker
  (ProcessEmbedder: a msgpack frame each way over a pipe) and in-process (LlamaEmbedder), over
  the LoCoMo questions, alternating the two so both see the same machine;
- document throughput: the LoCoMo chunks in batches, through the worker and in-process;
- memory: a real `memd run` with the model, after indexing one LoCoMo workspace and settling,
  RSS of the daemon and of its model worker, each on its own.

The in-process side loads the model in the load mode the worker found working on this CPU (on
CPUs whose AMX kernels crash llama.cpp, extra buffer types off), so it can run at all.

    python bench/worker_boundary.py [--model PATH] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

import memd_client
from memd.embed.llama import LlamaEmbedder
from memd.embed.process import ProcessEmbedder
from memd.index.chunk import chunk_text
from memd.markdown.discover import discover

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import (  # noqa: E402  (a sibling script)
    SHARED,
    code_state,
    environment,
    start_daemon,
    stop_daemon,
    wait_indexed,
)


def chunks_of(data: Path, counter: LlamaEmbedder | ProcessEmbedder) -> list[str]:
    texts: list[str] = []
    for ws in sorted(p for p in data.iterdir() if p.is_dir()):
        for f in discover(ws).files:
            content = f.abs.read_text(encoding="utf-8")
            chunks = chunk_text(
                content, 400, 80, count_tokens=counter.count_tokens, max_tokens=counter.max_tokens
            )
            texts.extend(c.text for c in chunks)
    return list(dict.fromkeys(texts))


def questions_of(data: Path, n: int) -> list[str]:
    lines = (data / "qrels.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["question"] for line in lines[:n]]


def rss_mb(proc: psutil.Process) -> float:
    rss: int = proc.memory_info().rss
    return round(rss / 2**20, 1)


def daemon_memory(model: str, data: Path, settle: float) -> dict[str, float]:
    """RSS of `memd run` and of its model worker after indexing one workspace and settling."""
    with tempfile.TemporaryDirectory(prefix="memd-boundary-", dir="/tmp") as tmp:
        home = Path(tmp)
        sock = home / "memd.sock"
        proc = start_daemon(home, sock, "local", model)
        try:
            ws = sorted(p for p in data.iterdir() if p.is_dir())[0]
            with memd_client.connect(sock, timeout=600) as c:
                c.workspace_add(str(ws), name="boundary")
                wait_indexed(c, "boundary", vectors=True)
            time.sleep(settle)
            daemon = psutil.Process(proc.pid)
            workers = daemon.children()
            return {
                "daemon_rss_mb": rss_mb(daemon),
                "worker_rss_mb": sum(rss_mb(w) for w in workers),
                "workers": len(workers),
            }
        finally:
            stop_daemon(proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--chunks", type=int, default=0, help="embed only the first N chunks")
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    data = Path(args.data)

    worker = ProcessEmbedder(args.model, threads=args.threads, batch_size=args.batch)
    worker.probe()
    inproc = LlamaEmbedder(args.model, threads=args.threads, extra_bufts=worker.mode.extra_bufts)
    if worker.mode.one_thread:
        inproc.threads = 1
    inproc.load()
    texts = chunks_of(data, worker)
    if args.chunks:
        texts = texts[: args.chunks]
    questions = questions_of(data, args.queries)

    over_pipe: list[float] = []
    in_process: list[float] = []
    for q in questions[:20]:  # warm both
        worker.embed_batch([q], kind="query")
        inproc.embed_batch([q], kind="query")
    for q in questions:
        t = time.perf_counter()
        worker.embed_batch([q], kind="query")
        over_pipe.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        inproc.embed_batch([q], kind="query")
        in_process.append((time.perf_counter() - t) * 1000)

    def throughput(e: LlamaEmbedder | ProcessEmbedder) -> float:
        start = time.perf_counter()
        for i in range(0, len(texts), args.batch):
            e.embed_batch(texts[i : i + args.batch])
        return len(texts) / (time.perf_counter() - start)

    # Alternate, twice each, and keep each side's better run: the machine's noise is larger
    # than the difference being measured.
    docs_worker = max(throughput(worker), throughput(worker))
    docs_inproc = max(throughput(inproc), throughput(inproc))
    mode = worker.mode.label
    worker.close()
    inproc.close()

    memory = daemon_memory(args.model, data, args.settle)
    result = {
        **environment(),
        "code": code_state(),
        "model": Path(args.model).name,
        "threads": args.threads,
        "load_mode": mode,
        "queries": len(questions),
        "query_ms_worker_p50": round(statistics.median(over_pipe), 3),
        "query_ms_in_process_p50": round(statistics.median(in_process), 3),
        "query_ms_added_p50": round(
            statistics.median(over_pipe) - statistics.median(in_process), 3
        ),
        "chunks": len(texts),
        "docs_per_s_worker": round(docs_worker, 2),
        "docs_per_s_in_process": round(docs_inproc, 2),
        "docs_ratio": round(docs_worker / docs_inproc, 3),
        **memory,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
