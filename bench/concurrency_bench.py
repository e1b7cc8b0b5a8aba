"""Keyword searches a second from 1 and from 16 client processes, held long enough to be steady,
with the CPU each of memd's processes spent per search.

alternate_bench.py's 16-client figure times 200 searches, about a quarter of a second at 10,000
chunks: it measures the readers' start and 16 connections being opened as much as the searches.
Here each daemon is started, left 20 s to check its files, warmed with 200 searches from 16
clients (which starts its reader processes), and then timed on ``--searches`` searches from 16
processes, each with its connection open before the clock starts, twice; the CPU time of the
daemon and of its readers over each run comes from /proc (psutil). Keyword search only: it
embeds nothing, so a question asked again times nothing cached. Codes alternate (new, old, ...).

With ``--readers 2,0`` the daemons of this checkout run with those numbers of reader processes
(``search.reader_processes``, through a config file of the run's own), in turn like codes.

    python bench/concurrency_bench.py --home DIR/size-25 [--old CHECKOUT] [--readers N,M]
                                      [--reps 2] [--searches 640] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import memd_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import (  # noqa: E402
    SHARED,
    checkout_name,
    code_state,
    concurrent,
    environment,
    start_daemon,
    stop_daemon,
    timed_searches,
)

CLIENTS = 16
SETTLE_S = 20.0


def client(sock: str, questions: list[str], go: Any) -> None:
    with memd_client.connect(Path(sock)) as c:
        c.hello()
        go.wait()
        for q in questions:
            c.search("scale", q, mode="keyword")


def clients(sock: Path, questions: list[str], n: int) -> float:
    """Searches a second from ``n`` processes, each with its share, connected before the start."""
    per = len(questions) // n
    go = mp.Event()
    procs = [
        mp.Process(target=client, args=(str(sock), questions[i * per : (i + 1) * per], go))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # every client connected and waiting
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    return per * n / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of the daemon and of its reader processes (the model worker apart)."""
    daemon = psutil.Process(pid)
    out = {"daemon": sum(daemon.cpu_times()[:2]), "readers": 0.0}
    for child in daemon.children(recursive=True):
        try:
            if "memd.readers.host" in " ".join(child.cmdline()):
                out["readers"] += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return out


def one_run(
    home: Path,
    sock: Path,
    model: str,
    code: Path | None,
    qs: list[str],
    n: int,
    env: dict[str, str],
) -> dict[str, Any]:
    proc = start_daemon(home, sock, "local", model, extra_env=env, code=code)
    try:
        timed_searches(sock, "scale", qs[:50], "keyword")
        time.sleep(SETTLE_S)
        t = time.perf_counter()
        one = len(timed_searches(sock, "scale", qs[:n], "keyword")) / (time.perf_counter() - t)
        concurrent(sock, "scale", qs[:200], "keyword", CLIENTS)  # starts the readers
        runs = []
        for _ in range(2):
            before = cpu_seconds(proc.pid)
            rps = clients(sock, qs[:n], CLIENTS)
            after = cpu_seconds(proc.pid)
            runs.append(
                {
                    "rps": round(rps, 1),
                    **{
                        f"{k}_cpu_ms_per_search": round(1000 * (after[k] - before[k]) / n, 3)
                        for k in after
                    },
                }
            )
    finally:
        stop_daemon(proc)
    best = max(runs, key=lambda r: r["rps"])
    return {"rps_1": round(one, 1), "runs_16": runs, "ratio_16": round(best["rps"] / one, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="a MEMD_HOME holding the workspace 'scale'")
    ap.add_argument("--old", default="", help="a checkout of the earlier code")
    ap.add_argument("--readers", default="", help="reader counts to compare, e.g. 2,0")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--searches", type=int, default=640)
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    qs = [json.loads(line)["question"] for line in (Path(args.data) / "qrels.jsonl").open()]
    sock = Path(tempfile.mkdtemp(prefix="memd-c-", dir="/tmp")) / "memd.sock"
    codes: dict[str, tuple[Path | None, dict[str, str]]] = {"new": (None, {})}
    if args.old:
        codes["old"] = (Path(args.old), {})
    for count in filter(None, args.readers.split(",")):
        config = sock.parent / f"readers-{int(count)}.toml"
        config.write_text(f"[search]\nreader_processes = {int(count)}\n")
        codes[f"readers={int(count)}"] = (None, {"MEMD_CONFIG": str(config)})
    if args.readers:
        del codes["new"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
    for rep in range(args.reps):
        for name in codes if rep % 2 == 0 else reversed(list(codes)):
            code, env = codes[name]
            run = one_run(Path(args.home), sock, args.model, code, qs, args.searches, env)
            runs[name].append(run)
            print(rep, name, json.dumps(run), flush=True)
    medians = {
        name: {
            "rps_1": statistics.median(r["rps_1"] for r in rs),
            "rps_16": statistics.median(x["rps"] for r in rs for x in r["runs_16"]),
            "daemon_cpu_ms_per_search": statistics.median(
                x["daemon_cpu_ms_per_search"] for r in rs for x in r["runs_16"]
            ),
            "readers_cpu_ms_per_search": statistics.median(
                x["readers_cpu_ms_per_search"] for r in rs for x in r["runs_16"]
            ),
        }
        for name, rs in runs.items()
    }
    print(json.dumps(medians, indent=2))
    if args.json:
        result = {
            **environment(),
            "code": code_state(),
            "old": checkout_name(Path(args.old)) if args.old else None,
            "runs": runs,
            "medians": medians,
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
