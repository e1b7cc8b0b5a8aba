"""Held mixed load (reliability notes §8.2, G8.1): many sessions at a fixed offered rate.

Starts `memd run` as a subprocess (the fake embedder unless --model is given) on a workspace of
LoCoMo conversations copied COPIES times plus 16 "hot" files that an editor rewrites (--edits a
second, 30 by default: one file each time), then drives it open-loop like wrk2: request i is due at i / RATE and goes to client
i % CLIENTS (one connection each); latency counts from the due time, so a slow reply delays the
requests queued behind it instead of hiding them (no coordinated omission). Mix: 70% search
(keyword and hybrid alternating), 20% get, 10% append. The daemon's RSS, threads, fds and WAL
are sampled every second; the report gives their first and last values and the slope.

Clients are threads of this process, or of --procs processes; the report says whether the
client side kept up (its CPU share of one core and how late requests left).

The other held-load scenarios (reliability notes G8.2–G8.5) run on top of this load:

- ``--bulk-edit AT:N`` rewrites N indexed files at once AT seconds into the measured run (a
  ``git checkout``; with --model, new text the embedder must embed: the embed lane saturated)
  and reports how long the index took to catch up, and each kind's latency before, during and
  after (the editor pauses meanwhile, so "caught up" means no file pending);
- ``--bulk-edit AT:N:EVERY`` repeats that checkout every EVERY seconds (each file gains a line);
- ``--dream-every S`` runs dreaming with apply (all phases) every S seconds, as a scheduled
  night would, and reports each run's seconds;
- ``--churn RATE`` adds connect / one ``get`` / close cycles at RATE per second on their own
  schedule, with the time from connect to first reply;
- a long ``--seconds`` is the soak: the resource trend is reported per ten minutes and as the
  slope after the first five minutes, besides the slope over the whole run. Besides the
  daemon's own figures, the samples hold its children's RSS (the reader processes and the
  model's worker), how many reader processes run, and the rows of ``vector_log`` and
  ``fts_log`` (the logs that keep the sketch and the postings in step, which the writer trims).

    python bench/load_bench.py [--clients 64] [--rate 500] [--seconds 120] [--copies 25]
                               [--procs 1] [--model PATH] [--edits 30] [--bulk-edit AT:N[:EVERY]]
                               [--dream-every S]
                               [--churn RATE]
                               [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import psutil

import memd_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import (  # noqa: E402  (a sibling script)
    build_corpus,
    code_state,
    environment,
    start_daemon,
    stop_daemon,
    summary,
    wait_indexed,
)

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
KINDS = ("keyword", "hybrid", "get", "append")
HOT = 16
WORDS = (
    "orion billing postgres deploy freeze retro cluster staging kafka backup restore vacuum "
    "index latency budget owner pager rotation schema migration rollback canary release"
).split()

Plan = list[tuple[float, str, str]]  # (offset from t0 in s, kind, argument)


def slope_per_min(ys: list[float], dt: float = 1.0) -> float:
    """Least-squares slope of samples taken every ``dt`` seconds, per minute."""
    n = len(ys)
    if n < 2:
        return 0.0
    xs = [i * dt for i in range(n)]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 60


# -- corpus ---------------------------------------------------------------------------------------


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."


def hot_text(k: int, version: int) -> str:
    rng = random.Random(k * 100_003 + version)
    body = "".join(f"- {sentence(rng)}\n" for _ in range(20))
    return f"# Hot note {k}\n\nversion hotv{k}x{version}\n\n{body}"


def build_workspace(data: Path, ws: Path, copies: int) -> list[str]:
    """The scale corpus of socket_bench (LoCoMo copied ``copies`` times), plus HOT files;
    returns the memory files' paths for ``get``."""
    if not (ws / "memory").exists():
        build_corpus(data, ws, copies)
    (ws / "memory" / "hot").mkdir(exist_ok=True)
    for k in range(HOT):
        (ws / "memory" / "hot" / f"note-{k}.md").write_text(hot_text(k, 0))
    return sorted(str(p.relative_to(ws)) for p in ws.rglob("*.md") if p.parent != ws / "memory")


def schedule(
    rels: list[str], queries: list[str], clients: int, rate: float, seconds: float
) -> list[Plan]:
    rng = random.Random(42)
    plans: list[Plan] = [[] for _ in range(clients)]
    searches = 0
    for i in range(int(rate * seconds)):
        r = rng.random()
        if r < 0.7:
            kind = "keyword" if searches % 2 == 0 else "hybrid"
            searches += 1
            arg = rng.choice(queries)
        elif r < 0.9:
            kind, arg = "get", rng.choice(rels)
        else:
            kind, arg = "append", f"Load note loadz{i}q from the load benchmark."
        plans[i % clients].append((i / rate, kind, arg))
    return plans


# -- daemon ---------------------------------------------------------------------------------------


class Sampler:
    """The daemon's RSS, threads, fds and WAL size, its children's RSS and the rows of the two
    logs the writer trims, once a second."""

    def __init__(self, pid: int, index_dir: Path) -> None:
        self.proc = psutil.Process(pid)
        self.index_dir = index_dir
        self.samples: list[dict[str, float]] = []

    def sample(self) -> dict[str, float]:
        wal = 0
        for p in self.index_dir.glob("*.sqlite-wal"):
            try:
                wal += p.stat().st_size
            except FileNotFoundError:
                pass
        children, readers = 0, 0
        for child in self.proc.children():
            try:
                children += child.memory_info().rss
                readers += "memd.readers" in " ".join(child.cmdline())
            except psutil.Error:  # it exited meanwhile
                pass
        return {
            "rss_mb": round(self.proc.memory_info().rss / 2**20, 1),
            "threads": self.proc.num_threads(),
            "fds": self.proc.num_fds(),
            "wal_mb": round(wal / 2**20, 2),
            "children_rss_mb": round(children / 2**20, 1),
            "readers": readers,
            **self.log_rows(),
        }

    def log_rows(self) -> dict[str, float]:
        """Rows in ``vector_log`` and ``fts_log`` over the index files (read-only, in WAL mode
        a reader blocks no one)."""
        rows = {"vector_log_rows": 0.0, "fts_log_rows": 0.0}
        for path in self.index_dir.glob("*.sqlite"):
            try:
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
                try:
                    for table in ("vector_log", "fts_log"):
                        with contextlib.suppress(sqlite3.OperationalError):  # not in this file
                            (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                            rows[f"{table}_rows"] += n
                finally:
                    conn.close()
            except sqlite3.Error:
                pass
        return rows

    def run(self, start: float, seconds: int, stop: threading.Event) -> None:
        for n in range(seconds + 1):
            if stop.wait(max(0.0, start + n - time.monotonic())):
                return
            self.samples.append(self.sample())

    def report(self) -> dict[str, Any]:
        """First, last and highest value of each resource, its slope over the whole run and
        after the first five minutes (when the run is longer than ten), and for runs of ten
        minutes or more the median of each ten-minute window: a trend, not one noisy end."""
        if not self.samples:
            return {}
        out: dict[str, Any] = {}
        for key in self.samples[0]:
            ys = [s[key] for s in self.samples]
            row: dict[str, Any] = {
                "start": ys[0],
                "end": ys[-1],
                "max": max(ys),
                "slope_per_min": round(slope_per_min(ys), 3),
            }
            if len(ys) > 600:
                row["slope_per_min_after_5_min"] = round(slope_per_min(ys[300:]), 3)
                row["median_per_10_min"] = [
                    statistics.median(ys[i : i + 600]) for i in range(0, len(ys) - 599, 600)
                ]
            out[key] = row
        return out


# -- clients (run in this process or in a worker process) -----------------------------------------


def call(c: memd_client.Client, kind: str, arg: str) -> None:
    if kind in ("keyword", "hybrid"):
        c.search("load", arg, mode=kind)
    elif kind == "get":
        if c.get("load", arg)["missing"]:
            raise RuntimeError(f"get: {arg} reported missing")
    else:
        c.append("load", arg)


def run_clients(
    sock: str, plans: list[Plan], t0: float, warmup: float, deadline: float
) -> dict[str, Any]:
    """Drive ``plans`` (one per connection) from monotonic time ``t0``; CLOCK_MONOTONIC is
    shared by all processes, so several worker processes keep one schedule. Requests still
    unsent at ``deadline`` (an overloaded daemon's backlog) are counted, not sent."""
    clients = [memd_client.connect(sock, timeout=30) for _ in plans]
    lat: dict[str, list[float]] = {k: [] for k in KINDS}
    timeline: list[tuple[float, str, float]] = []  # (offset, kind, ms) of measured replies
    lag: list[float] = []
    errors: list[str] = []
    unsent = [0]
    done = [0]  # successful replies, warm-up included
    lock = threading.Lock()
    me = psutil.Process()

    def loop(c: memd_client.Client, plan: Plan) -> None:
        mine: list[tuple[str, float, float, float]] = []
        bad: list[str] = []
        for n, (offset, kind, arg) in enumerate(plan):
            if time.monotonic() > deadline:
                with lock:
                    unsent[0] += len(plan) - n
                break
            due = t0 + offset
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.monotonic()
            try:
                call(c, kind, arg)
            except Exception as exc:
                bad.append(f"{kind} {arg!r}: {type(exc).__name__}: {exc}")
                continue
            with lock:
                done[0] += 1
            if offset >= warmup:
                ms = (time.monotonic() - due) * 1000
                mine.append((kind, ms, (sent - due) * 1000, offset))
        with lock:
            for kind, ms, late, offset in mine:
                lat[kind].append(ms)
                lag.append(late)
                timeline.append((offset, kind, ms))
            errors.extend(bad)

    cpu0 = me.cpu_times()
    threads = [
        threading.Thread(target=loop, args=(c, p)) for c, p in zip(clients, plans, strict=True)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()
    cpu1 = me.cpu_times()
    return {
        "latencies": lat,
        "timeline": timeline,
        "send_lag": lag,
        "errors": errors,
        "unsent": unsent[0],
        "completed": done[0],
        "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        "end": time.monotonic(),
    }


def churn(sock: str, rel: str, rate: float, start: float, end: float) -> dict[str, Any]:
    """Connect, ``get`` one file, close: ``rate`` cycles a second from monotonic ``start`` to
    ``end``, in a process of its own (the 64 client threads would otherwise share its GIL).
    Reports the time from connect to the first reply, and the rate achieved."""
    ttfr: list[float] = []
    errors: list[str] = []
    n = 0
    while (due := start + n / rate) < end:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t = time.monotonic()
        try:
            with memd_client.connect(sock, timeout=10) as c:
                c.get("load", rel)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            ttfr.append((time.monotonic() - t) * 1000)
        n += 1
    return {
        "offered_per_s": rate,
        "achieved_per_s": round(len(ttfr) / max(1e-9, time.monotonic() - start), 1),
        "errors": len(errors),
        "first_errors": errors[:5],
        "connect_to_first_reply": summary(ttfr),
    }


class BulkEdit:
    """Rewrite ``n`` indexed files at once (a header line added: every chunk of the file
    changes) and time how long the index takes to have none pending (keyword search sees
    every edit) and then none unembedded (vectors too); with ``every``, again every ``every``
    seconds until the run ends."""

    def __init__(self, ws: Path, rels: list[str], n: int) -> None:
        self.ws = ws
        self.rels = [r for r in rels if "/hot/" not in r][:n]
        self.paused = threading.Event()  # the hot-file editor waits while this is set
        self.result: dict[str, Any] = {"files": len(self.rels)}
        self.repeats: list[dict[str, Any]] = []

    def run(self, sock: str, at: float, stop: threading.Event, every: float = 0.0) -> None:
        round_ = 0
        while not stop.wait(max(0.0, at + round_ * every - time.monotonic())):
            result = self.once(sock, stop, round_)
            if round_ == 0:
                self.result.update(result)
            else:
                self.repeats.append(result)
            round_ += 1
            if not every:
                return

    def once(self, sock: str, stop: threading.Event, round_: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        self.paused.set()
        try:
            t = time.monotonic()
            result["at_s"] = t
            for i, rel in enumerate(self.rels):
                path = self.ws / rel
                path.write_text(
                    f"Revision bulkrev{i}r{round_} of this note.\n\n" + path.read_text()
                )
            result["write_s"] = round(time.monotonic() - t, 2)
            with memd_client.connect(sock, timeout=None) as c:
                while not stop.is_set():
                    fresh = c.status(workspace="load")["workspaces"][0]["freshness"]
                    if fresh["pending_files"] == 0 and "searchable_s" not in result:
                        result["searchable_s"] = round(time.monotonic() - t, 2)
                    if fresh["pending_files"] == 0 and fresh["unembedded_files"] == 0:
                        break
                    time.sleep(0.25)
                result["caught_up_s"] = round(time.monotonic() - t, 2)
                last = f"bulkrev{len(self.rels) - 1}r{round_}"
                hits = c.search("load", last, mode="keyword")["results"]
                result["last_file_found"] = any(h["path"] == self.rels[-1] for h in hits)
        finally:
            self.paused.clear()
        result["window"] = (t, time.monotonic())
        return result


class Dreamer:
    """Dreaming with apply every ``every`` seconds: the seconds each run took, and errors."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.runs: list[float] = []
        self.errors: list[str] = []

    def run(self, sock: str, start: float, stop: threading.Event) -> None:
        n = 1
        while not stop.wait(max(0.0, start + n * self.every - time.monotonic())):
            t = time.monotonic()
            try:
                with memd_client.connect(sock, timeout=600) as c:
                    c.dream("load", apply=True)
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                self.runs.append(round(time.monotonic() - t, 2))
            n += 1


def windows(
    timeline: list[tuple[float, str, float]], cuts: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """Each kind's latency summary within each named window of schedule offsets."""
    out: dict[str, Any] = {}
    for name, (lo, hi) in cuts.items():
        out[name] = {
            k: summary([ms for off, kind, ms in timeline if kind == k and lo <= off < hi])
            for k in KINDS
        }
    return out


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default="", help="a GGUF for the local provider (default: fake)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rate", type=float, default=500.0, help="offered requests per second")
    ap.add_argument("--seconds", type=int, default=120, help="measured duration")
    ap.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    ap.add_argument("--grace", type=float, default=30.0, help="then stop sending the backlog")
    ap.add_argument("--copies", type=int, default=25)
    ap.add_argument("--procs", type=int, default=1, help="client processes")
    ap.add_argument("--home", default="", help="reuse this MEMD_HOME (corpus, caches)")
    ap.add_argument(
        "--bulk-edit", default="", metavar="AT:N[:EVERY]", help="rewrite N files at AT s"
    )
    ap.add_argument("--dream-every", type=float, default=0.0, help="dream with apply every S s")
    ap.add_argument("--edits", type=float, default=30.0, help="hot-file rewrites per second")
    ap.add_argument("--churn", type=float, default=0.0, help="connect/get/close cycles per second")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below
    data = Path(args.data)
    queries = [
        json.loads(line)["question"]
        for line in (data / "qrels.jsonl").read_text().splitlines()
        if line.strip()
    ]
    home = Path(args.home or tempfile.mkdtemp(prefix="memd-loadbench-"))
    home.mkdir(parents=True, exist_ok=True)
    sock_dir = Path(tempfile.mkdtemp(prefix="memd-l-", dir="/tmp"))
    sock = sock_dir / "memd.sock"
    ws = home / "workspace"
    rels = build_workspace(data, ws, args.copies)
    plans = schedule(rels, queries, args.clients, args.rate, args.warmup + args.seconds)
    result: dict[str, Any] = {
        **environment(),
        "code": code_state(),
        "clients": args.clients,
        "offered_rps": args.rate,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "client_procs": args.procs,
        "embedder": Path(args.model).name if args.model else "fake",
        "cpus": os.cpu_count(),
    }

    proc = start_daemon(home, sock, "local" if args.model else "fake", args.model or "")
    stop = threading.Event()
    try:
        with memd_client.connect(sock, timeout=None) as c:
            c.workspace_add(str(ws), name="load")
            t = time.perf_counter()
            c.reindex(workspace="load")
            st = wait_indexed(c, "load", vectors=True)
            result["index_seconds"] = round(time.perf_counter() - t, 1)
            result["files"], result["chunks"] = st["files_indexed"], st["chunks"]
        print(f"indexed {result['files']} files / {result['chunks']} chunks", file=sys.stderr)

        sampler = Sampler(proc.pid, home / "state" / "indexes")
        versions = [0] * HOT
        bulk: BulkEdit | None = None
        if args.bulk_edit:
            at, n, *repeat = args.bulk_edit.split(":")
            bulk = BulkEdit(ws, rels, int(n))
        dreamer = Dreamer(args.dream_every) if args.dream_every else None

        def editor() -> None:
            rng = random.Random(3)
            while not stop.wait(1 / args.edits):
                if bulk is not None and bulk.paused.is_set():
                    continue
                for k in rng.sample(range(HOT), 1):
                    versions[k] += 1
                    (ws / "memory" / "hot" / f"note-{k}.md").write_text(hot_text(k, versions[k]))

        margin = 1.0 if args.procs == 1 else 5.0  # time for worker processes to start
        t0 = time.monotonic() + margin
        deadline = t0 + args.warmup + args.seconds + args.grace
        side = [
            threading.Thread(target=editor, name="editor"),
            threading.Thread(
                target=sampler.run, args=(t0 + args.warmup, args.seconds, stop), name="sampler"
            ),
        ]
        if bulk is not None:
            side.append(
                threading.Thread(
                    target=bulk.run,
                    args=(
                        str(sock),
                        t0 + args.warmup + float(at),
                        stop,
                        float(repeat[0]) if repeat else 0.0,
                    ),
                    name="bulk-edit",
                )
            )
        if dreamer is not None:
            side.append(
                threading.Thread(
                    target=dreamer.run, args=(str(sock), t0 + args.warmup, stop), name="dreamer"
                )
            )
        for worker in side:
            worker.start()
        churner = None
        if args.churn:
            churn_pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            churner = churn_pool.submit(
                churn,
                str(sock),
                rels[0],
                args.churn,
                t0 + args.warmup,
                t0 + args.warmup + args.seconds,
            )
        me = psutil.Process()
        cpu0 = me.cpu_times()
        try:
            if args.procs == 1:
                parts = [run_clients(str(sock), plans, t0, args.warmup, deadline)]
            else:
                ctx = multiprocessing.get_context("spawn")
                groups = [plans[i :: args.procs] for i in range(args.procs)]
                with ProcessPoolExecutor(args.procs, mp_context=ctx) as pool:
                    futures = [
                        pool.submit(run_clients, str(sock), g, t0, args.warmup, deadline)
                        for g in groups
                    ]
                    parts = [f.result() for f in futures]
        finally:
            if churner is not None:
                result["churn"] = churner.result()
                churn_pool.shutdown()
            stop.set()
            for worker in side:
                worker.join()
        cpu1 = me.cpu_times()
        end = max(p["end"] for p in parts)
        result["resources"] = sampler.report()
        result["resource_samples"] = sampler.samples
    finally:
        stop.set()
        stop_daemon(proc)
        shutil.rmtree(sock_dir, ignore_errors=True)

    lat = {k: [ms for p in parts for ms in p["latencies"][k]] for k in KINDS}
    measured = sum(len(v) for v in lat.values())
    errors = [e for p in parts for e in p["errors"]]
    lag = [ms for p in parts for ms in p["send_lag"]]
    wall = end - t0
    if args.procs == 1:
        cpu_share = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / wall
    else:
        cpu_share = max(p["cpu_s"] for p in parts) / wall
    result["achieved_rps"] = round(measured / (end - t0 - args.warmup), 1)
    result["completed_rps_overall"] = round(sum(p["completed"] for p in parts) / wall, 1)
    result["unsent_backlog"] = sum(p["unsent"] for p in parts)
    if not result["unsent_backlog"]:  # else we cannot tell which appends went out
        appended = [a for plan in plans for _, k, a in plan if k == "append"]
        text = "".join(p.read_text() for p in (ws / "memory").glob("*.md"))
        result["appends_missing"] = sum(a not in text for a in appended)
    else:
        result["appends_missing"] = None
    result["errors"] = len(errors)
    result["first_errors"] = errors[:10]
    result["latency_from_schedule"] = {k: summary(v) for k, v in lat.items()}
    if bulk is not None and "window" in bulk.result:
        lo, hi = (w - t0 for w in bulk.result.pop("window"))
        result["bulk_edit"] = bulk.result
        timeline = [e for p in parts for e in p["timeline"]]
        result["bulk_edit"]["latency"] = windows(
            timeline, {"before": (args.warmup, lo), "during": (lo, hi), "after": (hi, 1e9)}
        )
        result["bulk_edit"].pop("at_s", None)
        result["bulk_edit"]["repeats"] = [
            {k: v for k, v in r.items() if k not in ("window", "at_s")} for r in bulk.repeats
        ]
    if dreamer is not None:
        result["dreaming"] = {
            "every_s": dreamer.every,
            "runs": len(dreamer.runs),
            "ms": summary([s * 1000 for s in dreamer.runs]),
            "errors": dreamer.errors[:5],
        }
    result["all_kinds"] = summary([ms for v in lat.values() for ms in v])
    # send_lag: how late requests left their client (it includes waiting for the previous
    # reply on the same connection). A client process near one full core means its own GIL
    # limits the offered rate.
    result["client_side"] = {
        "busiest_process_cpu_of_one_core": round(cpu_share, 2),
        "send_lag": summary(lag),
        "verdict": (
            "client process near one full core: its GIL may limit the offered rate; use --procs"
            if cpu_share > 0.85
            else "client side kept up (not the bottleneck)"
        ),
    }
    text = json.dumps(result, indent=2)
    print(text if len(text) < 20_000 else json.dumps({**result, "resource_samples": "…"}, indent=2))
    if args.json:
        Path(args.json).write_text(text + "\n")
    if not args.home:
        shutil.rmtree(home, ignore_errors=True)
    failed = errors or result["appends_missing"] or result["unsent_backlog"]
    return 1 if failed or (dreamer is not None and dreamer.errors) else 0


if __name__ == "__main__":
    sys.exit(main())
