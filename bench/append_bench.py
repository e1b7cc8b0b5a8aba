"""Append latency to a daily log as it grows: an append should cost what it adds.

Builds a workspace whose daily log (today's ``memory/YYYY-MM-DD.md``) holds SIZE bytes of
varied log lines, starts ``memd run`` (keyword-only, or the local MiniLM model), waits until it
is indexed (with its vectors), then appends short entries one at a time over the socket and
times each call (it returns once the text is searchable by keyword) and, with a model, the time
until the entry has its vectors too.

    python bench/append_bench.py [--sizes 0.1,7] [--appends 20] [--provider local] [--json OUT]
    python bench/append_bench.py --code OTHER_CHECKOUT   # the same, with another memd
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import (  # noqa: E402
    SHARED,
    checkout_name,
    code_state,
    environment,
    start_daemon,
    stop_daemon,
)

import memd_client  # noqa: E402

WORDS = (
    "deploy staging cluster vega orion build rollback migration postgres index latency "
    "review alice bob carol dashboard alert pager retry queue worker cache token budget "
    "invoice customer ticket release branch merge flaky test script cron backup restore"
).split()


def log_line(rng: random.Random, n: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
    return f"- {n // 60 % 24:02d}:{n % 60:02d} {words} (#{n})"


def write_log(path: Path, size: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    lines, total, n = [], 0, 0
    while total < size:
        line = f"## Session {n // 40}" if n % 40 == 0 else log_line(rng, n)
        lines.append(line)
        total += len(line) + 1
        n += 1
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def wait_ready(c: memd_client.Client, ws: str, *, vectors: bool, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = c.status(workspace=ws)["workspaces"][0]
        done = st["files_indexed"] == st["files_on_disk"] and not st["freshness"]["rebuilding"]
        if done and (not vectors or st["files_pending"] == 0):
            return
        time.sleep(0.5)
    raise SystemExit(f"{ws} was not indexed within {timeout:.0f} s")


def run_size(
    home: Path, size_mb: float, appends: int, provider: str, model: str, code: Path | None
) -> dict[str, Any]:
    ws_root = home / f"ws-{size_mb:g}"
    (ws_root / "memory").mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()
    log = ws_root / "memory" / f"{today}.md"
    write_log(log, int(size_mb * 1_000_000))
    sock = Path(tempfile.mkdtemp(prefix="memd-sock-")) / "memd.sock"  # a private directory
    proc = start_daemon(home, sock, provider, model, code=code)
    rng = random.Random(11)
    call_ms: list[float] = []
    vectors_ms: list[float] = []
    try:
        with memd_client.connect(sock, timeout=600) as c:
            name = f"log{str(size_mb).replace('.', '_')}"
            c.workspace_add(ws_root, name=name)
            wait_ready(c, name, vectors=provider != "none", timeout=3600)
            for i in range(appends):
                text = log_line(rng, 100_000 + i)
                t = time.perf_counter()
                c.append(name, text)
                call_ms.append((time.perf_counter() - t) * 1000)
                if provider != "none":
                    while c.status(workspace=name)["workspaces"][0]["files_pending"]:
                        time.sleep(0.01)
                    vectors_ms.append((time.perf_counter() - t) * 1000)
                time.sleep(0.2)  # appends a moment apart, as an agent makes them
            size = log.stat().st_size
    finally:
        stop_daemon(proc)
    out: dict[str, Any] = {
        "log_bytes": size,
        "appends": appends,
        "append_ms": summary(call_ms),
    }
    if vectors_ms:
        out["until_vectors_ms"] = summary(vectors_ms)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "median": round(statistics.median(ordered), 1),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max": round(ordered[-1], 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0.1,7", help="daily log sizes in MB, comma-separated")
    ap.add_argument("--appends", type=int, default=20)
    ap.add_argument("--provider", choices=("none", "local"), default="local")
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--home", default="", help="reuse this MEMD_HOME (its embedding cache)")
    ap.add_argument("--code", default="", help="run the daemon of another checkout")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    code = Path(args.code).resolve() if args.code else None
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="memd-append-"))
    home.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "bench": "append",
        "environment": environment(),
        "code": code_state() if code is None else {"checkout": checkout_name(code)},
        "provider": args.provider,
        "model": Path(args.model).name if args.provider == "local" else None,
        "sizes": {},
    }
    for size in (float(s) for s in args.sizes.split(",")):
        r = run_size(home, size, args.appends, args.provider, args.model, code)
        results["sizes"][f"{size:g} MB"] = r
        print(f"{size:g} MB: {json.dumps(r)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
