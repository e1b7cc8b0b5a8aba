"""Held load, short sample (reliability notes §8.2–8.3): 64 sessions at a fixed offered rate.

An open-loop generator (like wrk2) gives every request a scheduled send time; latency counts
from that time, so a slow reply delays the requests behind it instead of hiding them
(coordinated omission). The mix is 70% search (keyword and hybrid alternating), 20% get and
10% append, while an editor rewrites a few files every 100 ms. Pass: zero errors, every
appended text on disk and searchable, and no upward trend in the daemon's RSS, threads, fds or
WAL. Latency percentiles are printed, not asserted (timed figures belong to the
benchmarks; `bench/load_bench.py` is the full run).

MEMD_LOAD_SECONDS (default 8) lengthens the run; MEMD_LOAD_RATE (default 50 req/s) sets the
offered rate.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

import memd_client
from memd.config import Config
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd.index.index import MAX_READERS

from .daemon_fixture import running_daemon

# The workload is the held-load benchmark's (bench/load_bench.py), run shorter and in-process.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from load_bench import WORDS, Plan, call, hot_text, sentence  # noqa: E402
from load_bench import schedule as bench_schedule  # noqa: E402
from socket_bench import pct  # noqa: E402

LOCOMO = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo-dev"
CLIENTS = 64
# 200 req/s is above what one 2-core machine serves when the daemon and its 64 clients share
# one process (and one GIL): about 70-80 req/s of this mix here. Held load must stay below
# capacity, or latency and memory grow with the backlog by construction.
RATE = float(os.environ.get("MEMD_LOAD_RATE", "50"))
SECONDS = float(os.environ.get("MEMD_LOAD_SECONDS", "8"))
WARMUP = 4.0  # seconds of the same schedule before measuring (caches, arenas, connections)
FILES = 200
HOT = 8  # files the editor keeps rewriting


# -- the workspace ------------------------------------------------------------------------------


def build_workspace(root: Path) -> tuple[list[str], list[str]]:
    """~200 Markdown files (LoCoMo memory files if present, else generated sentences) plus HOT
    files for the editor; returns the relative paths and the search queries."""
    (root / "memory" / "hot").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Long-Term Memory\n\nThe load-test workspace.\n")
    sources = sorted(LOCOMO.glob("*/memory/*.md")) if LOCOMO.is_dir() else []
    rels = ["MEMORY.md"]
    rng = random.Random(7)
    for i in range(FILES - HOT):
        rel = f"memory/c{i // 50:02d}/f{i:03d}.md"
        if sources:
            text = sources[i % len(sources)].read_text(encoding="utf-8")
        else:
            text = f"# Notes {i}\n\n" + "".join(f"- {sentence(rng)}\n" for _ in range(40))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
        rels.append(rel)
    for k in range(HOT):
        rel = f"memory/hot/note-{k}.md"
        (root / rel).write_text(hot_text(k, 0), encoding="utf-8")
        rels.append(rel)
    qrels = LOCOMO / "qrels.jsonl"
    if sources and qrels.is_file():
        lines = qrels.read_text(encoding="utf-8").splitlines()
        queries = [json.loads(line)["question"] for line in lines if line.strip()]
    else:
        queries = [" ".join(rng.sample(WORDS, 3)) for _ in range(300)]
    return rels, queries


# -- the open-loop schedule ---------------------------------------------------------------------


def schedule(rels: list[str], queries: list[str], rate: float, seconds: float) -> list[Plan]:
    """The benchmark's open-loop schedule for CLIENTS clients; the first WARMUP seconds are not
    measured."""
    return bench_schedule(rels, queries, CLIENTS, rate, WARMUP + seconds)


def sampler(config: Config, clients: list[memd_client.Client]) -> Callable[[], dict[str, float]]:
    """Daemon-side resources, measured in this process (the daemon runs on a thread here).

    The clients' sockets live in this process too: they are subtracted from the fd count.
    Their 64 threads and the daemon's 64 connection threads are constant during the run.
    """
    proc = psutil.Process()

    def sample() -> dict[str, float]:
        fds = os.listdir("/proc/self/fd")
        index_fds = [fd for fd in fds if _target(fd).startswith(str(config.index_dir))]
        wal = 0
        for p in config.index_dir.glob("*.sqlite-wal"):
            try:
                wal += p.stat().st_size
            except FileNotFoundError:
                pass
        return {
            "rss_mb": proc.memory_info().rss / 2**20,
            "threads": threading.active_count(),
            "fds": len(fds) - len(index_fds) - sum(c.connected for c in clients),
            "index_fds": len(index_fds),
            "wal_mb": wal / 2**20,
        }

    return sample


# -- the test -----------------------------------------------------------------------------------


def test_held_load(tmp_path: Path, config: Config) -> None:
    root = tmp_path / "ws"
    rels, queries = build_workspace(root)
    plans = schedule(rels, queries, RATE, SECONDS)
    with running_daemon(config, embedder=FakeEmbedder()) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=60) as admin:
            admin.workspace_add(str(root), name="load")
            admin.reindex("load", timeout=60)
            st = admin.status("load")["workspaces"][0]
            assert st["files_indexed"] == len(rels), st
        result = run_load(daemon, config, root, plans)
        with memd_client.connect(daemon.socket_path, timeout=60) as c:
            check_after(c, root, plans, result["hot_versions"])
    report(result)
    check_resources(result["samples"])
    assert not result["errors"], f"{len(result['errors'])} errors, first: {result['errors'][:5]}"


def run_load(daemon: Daemon, config: Config, root: Path, plans: list[Plan]) -> dict[str, Any]:
    clients = [memd_client.connect(daemon.socket_path, timeout=30) for _ in range(CLIENTS)]
    sample = sampler(config, clients)
    latencies: dict[str, list[float]] = {k: [] for k in ("keyword", "hybrid", "get", "append")}
    errors: list[str] = []
    samples: list[dict[str, float]] = []
    hot_versions = [0] * HOT
    lock = threading.Lock()
    stop = threading.Event()
    all_done = threading.Event()
    finished: list[int] = []

    def client_loop(c: memd_client.Client, plan: Plan, t0: float) -> None:
        mine: list[tuple[str, float]] = []
        for offset, kind, arg in plan:
            due = t0 + offset
            if stop.wait(max(0.0, due - time.perf_counter())):
                break
            try:
                call(c, kind, arg)
            except Exception as exc:  # every failure counts; the test reports them all
                with lock:
                    errors.append(f"{kind} {arg!r}: {type(exc).__name__}: {exc}")
                continue
            if offset >= WARMUP:
                mine.append((kind, (time.perf_counter() - due) * 1000))
        with lock:
            for kind, ms in mine:
                latencies[kind].append(ms)
            finished.append(1)
            if len(finished) == CLIENTS:
                all_done.set()
        stop.wait()  # stay alive until every client is done: a constant thread count

    def editor() -> None:
        rng = random.Random(3)
        while not stop.wait(0.1):
            for k in rng.sample(range(HOT), 3):
                hot_versions[k] += 1
                (root / f"memory/hot/note-{k}.md").write_text(
                    hot_text(k, hot_versions[k]), encoding="utf-8"
                )

    def sample_loop(t0: float) -> None:
        for n in range(int(SECONDS)):  # once a second while the measured load runs
            if stop.wait(max(0.0, t0 + WARMUP + n - time.perf_counter())):
                return
            samples.append(sample())

    try:
        t0 = time.perf_counter() + 0.2
        threads = [
            threading.Thread(target=client_loop, args=(c, plan, t0), name=f"load-client-{i}")
            for i, (c, plan) in enumerate(zip(clients, plans, strict=True))
        ]
        threads.append(threading.Thread(target=editor, name="load-editor"))
        threads.append(threading.Thread(target=sample_loop, args=(t0,), name="load-sampler"))
        for t in threads:
            t.start()
        try:
            all_done.wait(WARMUP + SECONDS + 60)
            elapsed = time.perf_counter() - t0 - WARMUP
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        for c in clients:
            c.close()
    return {
        "latencies": latencies,
        "errors": errors,
        "samples": samples,
        "hot_versions": hot_versions,
        "elapsed": elapsed,
        "sent": sum(len(v) for v in latencies.values()),
    }


def check_after(
    c: memd_client.Client, root: Path, plans: list[Plan], hot_versions: list[int]
) -> None:
    """Every append is on disk and searchable; the index caught up with the editor."""
    on_disk = "".join(p.read_text(encoding="utf-8") for p in (root / "memory").glob("*.md"))
    appended = [arg for plan in plans for _, kind, arg in plan if kind == "append"]
    missing = [text for text in appended if text not in on_disk]
    assert not missing, f"{len(missing)} appended texts are not on disk: {missing[:5]}"
    for text in appended[:: max(1, len(appended) // 10)]:
        token = text.split()[2]
        hits = c.search("load", token, mode="keyword")["results"]
        assert any(token in chunk_text(root, h) for h in hits), (token, hits[:2])
    for k, version in enumerate(hot_versions):
        token = f"hotv{k}x{version}"
        hits = c.search("load", token, mode="keyword", wait_ms=10_000)["results"]
        assert hits and hits[0]["path"] == f"memory/hot/note-{k}.md", (token, hits[:1])


def chunk_text(root: Path, hit: dict[str, Any]) -> str:
    lines = (root / hit["path"]).read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[hit["start_line"] - 1 : hit["end_line"]])


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def check_resources(samples: list[dict[str, float]]) -> None:
    """No upward trend: the mean of the last third against the mean of the first third.

    The index's read connections are pooled and opened as concurrent searches need them, so
    their files (database, WAL, shared memory: up to three each) may grow until the pool is
    full: they are held to the pool's bound instead, and every other fd to the trend.
    """
    assert len(samples) >= 3, samples
    third = len(samples) // 3
    allowed = {"rss_mb": 20.0, "threads": 4, "fds": 8}
    for key, limit in allowed.items():
        first = statistics.fmean(s[key] for s in samples[:third])
        last = statistics.fmean(s[key] for s in samples[-third:])
        assert last - first <= limit, f"{key} grew {first:.1f} -> {last:.1f}: {samples}"
    assert max(s["wal_mb"] for s in samples) <= 64, samples
    # the writer's connection, the pooled readers' and a rebuild's, three files each
    assert max(s["index_fds"] for s in samples) <= 3 * (MAX_READERS + 2), samples


def report(result: dict[str, Any]) -> None:
    rate = result["sent"] / result["elapsed"]
    print(
        f"\nheld load: {CLIENTS} clients, offered {RATE:g} req/s for {SECONDS:g} s, "
        f"achieved {rate:.1f} req/s, {len(result['errors'])} errors"
    )
    for kind, ms in result["latencies"].items():
        if ms:
            print(
                f"  {kind:8s} n={len(ms):5d}  p50 {pct(ms, 50):7.1f} ms  "
                f"p95 {pct(ms, 95):7.1f} ms  p99 {pct(ms, 99):7.1f} ms"
            )
    first, last = result["samples"][0], result["samples"][-1]
    print(
        "  resources first -> last: "
        + ", ".join(f"{k} {first[k]:.1f} -> {last[k]:.1f}" for k in first)
    )
