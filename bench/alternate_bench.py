"""Two codes' daemons on one built index, measured in turn: old, new, new, old, old, new, ...

On a shared VM a single run of each code can differ by half from the next run of the same
code (the page cache is taken back, a neighbour computes), and whichever code runs second is
measured in other weather. Here the two alternate, each starting its daemon afresh on the same
MEMD_HOME (an index scale_bench built), and each figure is reported per run and as the median
of the runs: single-client latency over 200 questions, then throughput with 1 and with 16
concurrent clients (200 questions each, the 16 after a burst of 100 that is not counted), in
one search mode. No question is asked twice of one daemon (a repeat's vector is kept, and
would time that cache; runs before 2026-12-05 repeated 50-100 % of theirs). After the
single-client run each run records what the model worker says of its queries (status: how
many had each llama.cpp thread count, and their median time in llama.cpp), so that a hybrid
p50 can be set against the query it waited for.

With ``--busy N``, N processes that only spin (at the daemon's priority) run through every
measurement: searches while the cores are contended, which is when agents search. The
report then gives p95 over p50 too.

    python bench/alternate_bench.py --home DIR/size-25 --old CHECKOUT [--mode hybrid]
                                    [--reps 4] [--busy N] [--old-home COPY] [--settle]
                                    [--quiet-start S]
                                    [--json OUT]

``--quiet-start S`` waits S seconds after the warm-up before measuring: a daemon just started
checks its files and loads its caches, and the model worker gives a query every core only
while nothing else runs (memd/embed/host.py), so the first minute is a regime of its own.

``--settle`` starts measuring once the daemon's keyword postings are built (status
``fts.ranking``): at 100,000 chunks a fresh daemon ranks through FTS5 for its first 10-20 s.

``--old-home`` gives the earlier code its own copy of the home, for code whose index schema
differs (it would migrate or rebuild the shared file).
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

import memd_client

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import (  # noqa: E402
    ROOT,
    SHARED,
    checkout_name,
    code_state,
    concurrent,
    environment,
    fresh_slices,
    spinning,
    start_daemon,
    stop_daemon,
    summary,
    timed_searches,
)


def one_run(
    home: Path,
    sock: Path,
    model: str,
    code: Path,
    mode: str,
    qs: list[str],
    settle: bool,
    quiet_start: float = 0.0,
) -> dict[str, Any]:
    proc = start_daemon(home, sock, "local", model, code=code)
    try:
        settled_s = settled(sock) if settle else None
        # Each search asks a question this daemon has not been asked: it keeps the vectors
        # of recent queries (memd/embed/queued.py), and a repeat would time that cache.
        warm, timed, one_q, burst, many = fresh_slices(qs, 30, 200, 200, 100, 200)
        timed_searches(sock, "scale", warm, "hybrid")  # warm: model, caches, pages
        time.sleep(quiet_start)
        latency = summary(timed_searches(sock, "scale", timed, mode))
        queries = worker_queries(sock)
        one = concurrent(sock, "scale", one_q, mode, 1)["throughput_rps"]
        # Sessions that overlap start memd's reader processes (memd/readers): a short burst
        # first, so that the figure is the steady state under such load, not the start-up.
        concurrent(sock, "scale", burst, mode, 16)
        sixteen = concurrent(sock, "scale", many, mode, 16)["throughput_rps"]
    finally:
        stop_daemon(proc)
    return {
        "settled_s": settled_s,
        "latency": latency,
        "worker_queries": queries,
        "rps_1": one,
        "rps_16": sixteen,
        "ratio_16": round(sixteen / one, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="a MEMD_HOME holding the workspace 'scale'")
    ap.add_argument("--old", required=True, help="a checkout of the earlier code")
    ap.add_argument(
        "--old-home", default="", help="a copy of --home for the earlier code (another schema)"
    )
    ap.add_argument("--mode", default="hybrid", choices=["keyword", "hybrid", "vector"])
    ap.add_argument("--reps", type=int, default=4, help="runs of each code")
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--busy", type=int, default=0, help="spinning processes during the runs")
    ap.add_argument(
        "--quiet-start", type=float, default=0.0, help="seconds to wait after the warm-up"
    )
    ap.add_argument(
        "--settle",
        action="store_true",
        help="measure once the keyword postings are built (the steady state), not from the start",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    with spinning(args.busy) as busy:
        return measure(args, busy=busy)


def worker_queries(sock: Path) -> dict[str, Any] | None:
    """The model worker's queries so far by their llama.cpp threads, and what the recent ones
    took in llama.cpp (status; None without a local model, or from code before it said)."""
    with memd_client.connect(sock, timeout=None) as c:
        ws = c.status(workspace="scale")["workspaces"][0]
    worker = (ws.get("provider") or {}).get("worker") or {}
    if "query_ms" not in worker:
        return None
    return {"threads": worker.get("query_threads"), "ms": worker["query_ms"]}


def settled(sock: Path, limit: float = 300.0) -> float:
    """Seconds until the daemon's keyword ranking no longer waits for a build (status
    ``fts.ranking`` is not ``building``; code without that field is settled at once)."""
    t0 = time.monotonic()
    with memd_client.connect(sock, timeout=None) as c:
        while time.monotonic() - t0 < limit:
            ws = c.status(workspace="scale")["workspaces"][0]
            if (ws.get("fts") or {}).get("ranking") != "building":
                break
            time.sleep(0.5)
    return round(time.monotonic() - t0, 1)


def measure(args: argparse.Namespace, *, busy: int) -> int:
    qs = [json.loads(line)["question"] for line in (Path(args.data) / "qrels.jsonl").open()]
    codes = {"old": Path(args.old).resolve(), "new": ROOT}
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    sock = Path(tempfile.mkdtemp(prefix="memd-a-", dir="/tmp")) / "memd.sock"
    for rep in range(args.reps):
        order = ["old", "new"] if rep % 2 == 0 else ["new", "old"]
        for name in order:
            home = Path(args.old_home if name == "old" and args.old_home else args.home)
            run = one_run(
                home, sock, args.model, codes[name], args.mode, qs, args.settle, args.quiet_start
            )
            runs[name].append(run)
            print(rep, name, json.dumps(run), flush=True)
    medians = {
        name: {
            "latency_p50_ms": statistics.median(r["latency"]["p50_ms"] for r in rs),
            "latency_p95_ms": statistics.median(r["latency"]["p95_ms"] for r in rs),
            "latency_p99_ms": statistics.median(r["latency"]["p99_ms"] for r in rs),
            "p95_over_p50": statistics.median(
                r["latency"]["p95_ms"] / r["latency"]["p50_ms"] for r in rs
            ),
            "rps_1": statistics.median(r["rps_1"] for r in rs),
            "rps_16": statistics.median(r["rps_16"] for r in rs),
            "ratio_16": statistics.median(r["ratio_16"] for r in rs),
        }
        for name, rs in runs.items()
    }
    result = {
        **environment(),
        "code": code_state(),
        "old": checkout_name(Path(args.old)),
        "mode": args.mode,
        "reps": args.reps,
        "busy_processes": busy,
        "settle": args.settle,
        "quiet_start_s": args.quiet_start,
        "runs": runs,
        "medians": medians,
    }
    print(json.dumps(medians, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
