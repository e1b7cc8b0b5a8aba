"""A fresh daemon's first minutes and its steady state, two codes in turn, one client.

Each run starts ``memd run`` (the local model, as a user would) on a built MEMD_HOME with the
given code, then asks keyword questions one at a time for ``--seconds`` (a question every
0.2 s), noting each answer's latency against the time since the start and, every five seconds,
the CPU each of the daemon's threads used (psutil; names from py-spy when it is installed).
Then, once the daemon's log says its keyword postings are built (a code without them: at
once), the steady state: the first ``--queries`` LoCoMo questions, twice. Runs alternate
between the codes (a, b, b, a, ...), each on a home of its own (``--homes``: copies of one
built home, so that no code writes to the other's file).

    python bench/fresh_daemon.py --codes before=DIR,after=DIR --homes before=H1,after=H2
                                 [--reps 2] [--seconds 120] [--busy N] [--json OUT]

With ``--busy N``, N processes that only spin (at the daemon's priority) run through every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import memd_client

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_bench import warm_os_cache  # noqa: E402
from socket_bench import SHARED, code_state, environment, spinning, summary  # noqa: E402

BUILT = "keyword postings:"  # the daemon's log line when its postings are ready


def start(home: Path, sock: Path, code: Path, model: str) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        MEMD_HOME=str(home),
        MEMD_SOCKET=str(sock),
        MEMD_EMBEDDING_PROVIDER="local",
        MEMD_LOCAL_MODEL=str(Path(model).resolve()),  # the daemon starts in `code`
        MEMD_AUTOSTART="0",  # a client must never start a daemon of its own here
        PYTHONPATH=f"{code}{os.pathsep}{code / 'client'}",
    )
    log = open(home / "daemon.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd", "--log-level", "info", "run"],
        env=env,
        stdout=log,
        stderr=log,
        cwd=code,
    )
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited; see {home / 'daemon.log'}")
        try:
            with memd_client.connect(sock, timeout=2) as c:
                c.hello()
                return proc
        except memd_client.MemdError:
            time.sleep(0.05)


def thread_names(pid: int) -> dict[str, str]:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True)
    return dict(re.findall(r'Thread (\d+) \([^)]*\): "([^"]+)"', dump.stdout))


def one_run(
    code: Path, home: Path, model: str, questions: list[str], seconds: float, n: int
) -> dict[str, Any]:
    sock = Path(tempfile.mkdtemp(prefix="memd-fd-", dir="/tmp")) / "memd.sock"
    log_at = (home / "daemon.log").stat().st_size if (home / "daemon.log").exists() else 0
    warm_os_cache(home)
    t0 = time.monotonic()
    proc = start(home, sock, code, model)
    ready = time.monotonic() - t0
    daemon = psutil.Process(proc.pid)
    names: dict[str, str] = {}
    timeline: list[tuple[float, float]] = []
    cpu: list[dict[str, Any]] = []
    try:
        with memd_client.connect(sock, timeout=None) as c:
            last = {t.id: t.user_time + t.system_time for t in daemon.threads()}
            last_at, i = time.monotonic(), 0
            while time.monotonic() - t0 < seconds:
                q = questions[i % len(questions)]
                i += 1
                t = time.perf_counter()
                c.search("scale", q, mode="keyword")
                timeline.append(
                    (round(time.monotonic() - t0, 2), round((time.perf_counter() - t) * 1000, 2))
                )
                if time.monotonic() - last_at >= 5:
                    now = {t.id: t.user_time + t.system_time for t in daemon.threads()}
                    span = time.monotonic() - last_at
                    used = {str(k): round((v - last.get(k, 0.0)) / span, 3) for k, v in now.items()}
                    cpu.append({"t": round(time.monotonic() - t0, 1), "cpu": used})
                    last, last_at = now, time.monotonic()
                    if not names:
                        names = thread_names(proc.pid)
                time.sleep(0.2)
            built_at = wait_built(home, log_at, code)
            steady = [
                timed(c, q) for _ in range(2) for q in questions[:n]
            ]  # the same questions twice
    finally:
        proc.terminate()
        proc.wait(60)
    with (home / "daemon.log").open("rb") as f:
        f.seek(log_at)
        built = [ln for ln in f.read().decode(errors="replace").splitlines() if BUILT in ln]
    return {
        "ready_s": round(ready, 2),
        "postings": built[-1].split(BUILT, 1)[1].strip() if built else None,
        "steady_after_s": built_at,
        "steady": summary(steady),
        "first_minutes": timeline,
        "threads_cpu": cpu,
        "thread_names": names,
    }


def timed(c: memd_client.Client, q: str) -> float:
    t = time.perf_counter()
    c.search("scale", q, mode="keyword")
    return (time.perf_counter() - t) * 1000


def wait_built(home: Path, log_at: int, code: Path, limit: float = 900.0) -> float | None:
    """Wait for the postings' log line (a code without postings: none to wait for)."""
    if not (code / "memd" / "index" / "keywords.py").exists():
        return None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with (home / "daemon.log").open("rb") as f:
            f.seek(log_at)
            if BUILT.encode() in f.read():
                return round(limit - (deadline - time.monotonic()), 1)
        time.sleep(1)
    raise SystemExit("the postings were not built in time")


def by_window(timeline: list[tuple[float, float]], width: float = 15.0) -> dict[str, float]:
    windows: dict[int, list[float]] = {}
    for at, ms in timeline:
        windows.setdefault(int(at // width), []).append(ms)
    return {
        f"{int(k * width)}s": round(statistics.median(v), 1) for k, v in sorted(windows.items())
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codes", required=True, help="name=DIR,name=DIR: checkouts to run")
    ap.add_argument("--homes", required=True, help="name=DIR,...: a built home for each code")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--busy", type=int, default=0, help="spinning processes during the runs")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    os.environ["MEMD_AUTOSTART"] = "0"
    with spinning(args.busy) as busy:
        return measure(args, busy=busy)


def measure(args: argparse.Namespace, *, busy: int) -> int:
    codes = {k: Path(v).resolve() for k, v in (p.split("=", 1) for p in args.codes.split(","))}
    homes = {k: Path(v).resolve() for k, v in (p.split("=", 1) for p in args.homes.split(","))}
    qs = [json.loads(line)["question"] for line in (Path(args.data) / "qrels.jsonl").open()]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
    names = list(codes)
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            run = one_run(codes[name], homes[name], args.model, qs, args.seconds, args.queries)
            runs[name].append(run)
            print(
                name,
                rep,
                json.dumps(
                    {
                        "postings": run["postings"],
                        "steady_p50": run["steady"].get("p50_ms"),
                        "first_minutes": by_window(run["first_minutes"]),
                    }
                ),
                flush=True,
            )
    result = {
        **environment(),
        "code": code_state(),
        "busy_processes": busy,
        "codes": {k: str(v.name) for k, v in codes.items()},
        "runs": runs,
        "medians": {
            name: {
                "steady_p50_ms": statistics.median(r["steady"]["p50_ms"] for r in rs),
                "steady_p95_ms": statistics.median(r["steady"]["p95_ms"] for r in rs),
            }
            for name, rs in runs.items()
        },
    }
    print(json.dumps(result["medians"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
