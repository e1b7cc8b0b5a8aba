"""How search cost grows with the corpus: 1k, 10k and 100k chunks, 1 to 64 clients.

Each size is the LoCoMo conversations copied N times under memory/cNN/ (byte for byte, so after
the first copy every vector comes from the embedding cache), served by `memd run` with the local
MiniLM model. For each size: single-client latency of keyword and hybrid search, throughput with
1, 4, 16 and 64 concurrent clients, and the daemon's RSS; then the ratios against the smallest.

    python bench/scale_bench.py [--copies 3,25,250] [--queries 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

import memd_client

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import (  # noqa: E402
    SHARED,
    build_corpus,
    concurrent,
    start_daemon,
    stop_daemon,
    summary,
    timed_searches,
    wait_indexed,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--copies", default="3,25,250")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--home", default="", help="reuse this MEMD_HOME (its embedding cache)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    data = Path(args.data)
    questions = [json.loads(line)["question"] for line in (data / "qrels.jsonl").open()]
    questions = questions[: args.queries]
    home = Path(args.home or tempfile.mkdtemp(prefix="memd-scale-"))
    home.mkdir(parents=True, exist_ok=True)
    sock = Path(tempfile.mkdtemp(prefix="memd-s-", dir="/tmp")) / "memd.sock"
    sizes: list[dict[str, object]] = []
    for copies in (int(c) for c in args.copies.split(",")):
        ws_root = home / f"workspace-{copies}"
        if not ws_root.exists():
            build_corpus(data, ws_root, copies)
        proc = start_daemon(home, sock, "local", args.model)
        row: dict[str, object] = {"copies": copies}
        try:
            name = f"w{copies}"
            with memd_client.connect(sock, timeout=None) as c:
                c.workspace_add(str(ws_root), name=name)
                t = time.perf_counter()
                c.reindex(workspace=name)
                st = wait_indexed(c, name, vectors=True)
                row["index_seconds"] = round(time.perf_counter() - t, 1)
                row["files"], row["chunks"] = st["files_indexed"], st["chunks"]
            timed_searches(sock, name, questions[:20], "hybrid")  # warm up
            for mode in ("keyword", "hybrid"):
                single = timed_searches(sock, name, questions, mode)
                row[f"{mode}_latency"] = summary(single)
                row[f"{mode}_throughput"] = {
                    str(n): concurrent(sock, name, questions, mode, n)["throughput_rps"]
                    for n in (int(x) for x in args.clients.split(","))
                }
            row["rss_mb"] = round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)
            index = next((home / "state" / "indexes").glob("workspace-" + str(copies) + "*.sqlite"))
            row["index_mb"] = round(index.stat().st_size / 2**20, 1)
            with memd_client.connect(sock) as c:
                c.workspace_remove(name)  # keeps the next size's daemon small
        finally:
            stop_daemon(proc)
        print(json.dumps(row), flush=True)
        sizes.append(row)
    base = sizes[0]
    for row in sizes:
        row["growth"] = {
            "chunks": round(int(row["chunks"]) / int(base["chunks"]), 1),  # type: ignore[call-overload]
            "keyword_p50": round(
                row["keyword_latency"]["p50_ms"] / base["keyword_latency"]["p50_ms"],
                2,  # type: ignore[index]
            ),
            "hybrid_p50": round(
                row["hybrid_latency"]["p50_ms"] / base["hybrid_latency"]["p50_ms"],
                2,  # type: ignore[index]
            ),
        }
    result = {"model": Path(args.model).name, "queries": len(questions), "sizes": sizes}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
