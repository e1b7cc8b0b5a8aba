"""How search cost grows with the corpus: ~1k, ~10k and ~100k chunks, 1 to 64 clients.

Each size is socket_bench's corpus (the LoCoMo conversations copied N times with their dates
moved on, text byte for byte) in a MEMD_HOME of its own under --home, served by `memd run` with
the local MiniLM model. Vectors come from the embedding cache: --seed-cache names a filled one
(every size starts from a copy of it), otherwise the first size fills it with the real model.
For each size: the first index (vectors from the cache), single-client latency of keyword and
hybrid search, throughput with 1, 4, 16 and 64 concurrent clients, the daemon's RSS idle and
under load, and the index size; then each figure as a ratio of the smallest size's.

    python bench/scale_bench.py [--copies 3,25,250] [--queries 200] [--home DIR]
                                [--seed-cache FILE] [--json OUT]

Homes are kept, so a second run reuses the built indexes (its index time is then not a
first index and is reported as null).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

import memd_client

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import (  # noqa: E402
    SHARED,
    build_corpus,
    code_state,
    concurrent,
    environment,
    start_daemon,
    stop_daemon,
    summary,
    timed_searches,
    wait_indexed,
)


class PeakRss:
    """The highest RSS of a process, sampled every 100 ms while the block runs."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss")

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(
    home: Path, sock: Path, model: str, copies: int, questions: list[str], clients: list[int]
) -> dict[str, Any]:
    name = "scale"
    ws_root = home / "workspace"
    row: dict[str, Any] = {"copies": copies}
    proc = start_daemon(home, sock, "local", model)
    try:
        with memd_client.connect(sock, timeout=None) as c:
            known = {w["name"] for w in c.workspace_list()["workspaces"]}
            t = time.perf_counter()
            if name not in known:
                c.workspace_add(str(ws_root), name=name)
            st = wait_indexed(c, name, vectors=True)
            row["index_seconds"] = None if name in known else round(time.perf_counter() - t, 1)
            row["files"], row["chunks"] = st["files_indexed"], st["chunks"]
            row["index_mb"] = round(st["index_bytes"] / 2**20, 1)
        timed_searches(sock, name, questions[:20], "hybrid")  # warm: model, caches, pages
        time.sleep(2)
        row["rss_idle_mb"] = round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)
        with PeakRss(proc.pid) as peak:
            for mode in ("keyword", "hybrid"):
                row[f"{mode}_latency"] = summary(timed_searches(sock, name, questions, mode))
                row[f"{mode}_throughput_rps"] = {
                    str(n): concurrent(sock, name, questions, mode, n)["throughput_rps"]
                    for n in clients
                }
        row["rss_loaded_mb"] = round(peak.peak / 2**20, 1)
    finally:
        stop_daemon(proc)
    return row


def growth(rows: list[dict[str, Any]]) -> None:
    """Add each size's figures as ratios of the first (smallest) size's."""
    base = rows[0]
    for row in rows:
        row["growth"] = {
            "chunks": round(row["chunks"] / base["chunks"], 1),
            "keyword_p50": round(
                row["keyword_latency"]["p50_ms"] / base["keyword_latency"]["p50_ms"], 2
            ),
            "hybrid_p50": round(
                row["hybrid_latency"]["p50_ms"] / base["hybrid_latency"]["p50_ms"], 2
            ),
            "rss_loaded": round(row["rss_loaded_mb"] / base["rss_loaded_mb"], 2),
            "index_mb": round(row["index_mb"] / base["index_mb"], 1),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--copies", default="3,25,250")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--home", default="", help="keep each size's MEMD_HOME under this folder")
    ap.add_argument("--seed-cache", default="", help="a filled embedding-cache.sqlite to copy")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    data = Path(args.data)
    questions = [json.loads(line)["question"] for line in (data / "qrels.jsonl").open()]
    questions = questions[: args.queries]
    clients = [int(n) for n in args.clients.split(",")]
    root = Path(args.home or tempfile.mkdtemp(prefix="memd-scale-"))
    sock_dir = Path(tempfile.mkdtemp(prefix="memd-s-", dir="/tmp"))
    seed = Path(args.seed_cache) if args.seed_cache else None
    rows: list[dict[str, Any]] = []
    try:
        for copies in (int(c) for c in args.copies.split(",")):
            home = root / f"size-{copies}"
            if not (home / "workspace").exists():
                build_corpus(data, home / "workspace", copies)
            cache = home / "state" / "embedding-cache.sqlite"
            if seed is not None and not cache.exists():
                cache.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(seed, cache)
            row = measure(home, sock_dir / "memd.sock", args.model, copies, questions, clients)
            print(json.dumps(row), flush=True)
            rows.append(row)
            seed = seed or cache  # the first size filled it: the others start from it
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    growth(rows)
    result = {
        **environment(),
        "code": code_state(),
        "model": Path(args.model).name,
        "queries": len(questions),
        "sizes": rows,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
