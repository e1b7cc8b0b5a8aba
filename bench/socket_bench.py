"""Search latency, concurrency, edit-to-searchable and idle cost of a running daemon.

Builds a ~10,000-chunk workspace from the LoCoMo conversations (each copied COPIES times under
memory/cNNN/ with moved dates, text byte for byte, so their vectors come from the embedding
cache after the first copy; see build_corpus), starts `memd run` with the local MiniLM model, and measures over the real socket.

    python bench/socket_bench.py [--copies 25] [--queries 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

import memd_client

ROOT = Path(__file__).resolve().parent.parent
# A benchmark's clients never start a memd of their own: one that connected before the
# benchmark's daemon listened would start another, with the benchmark's settings missing.
os.environ["MEMD_AUTOSTART"] = "0"
SHARED = ROOT.parent / "shared"


@contextlib.contextmanager
def spinning(n: int) -> Iterator[int]:
    """``n`` processes that only spin (at the caller's priority), killed on leaving."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield len(procs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Where and with what a benchmark ran: date, machine, versions, commit."""
    import apsw

    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu = names[0].split(":", 1)[1].strip() if names else ""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu": cpu or platform.processor(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {
            "memd": version("memd"),
            "apsw": apsw.apsw_version(),
            "sqlite": apsw.sqlite_lib_version(),
            "sqlite-vec": version("sqlite-vec"),
            "llama-cpp-python": version("llama_cpp_python"),
            "numpy": version("numpy"),
            "msgpack": version("msgpack"),
        },
    }


def code_state() -> dict[str, Any]:
    """The commit, and the files of memd with edits: a daemon runs the working tree as it is."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "memd", "client"], capture_output=True, text=True
    )
    return {
        "commit": head.stdout.strip() or None,
        "uncommitted": dirty.stdout.splitlines() if dirty.returncode == 0 else None,
    }


def checkout_name(code: Path) -> str:
    """How a result names another checkout: by its commit, not by where it lay on this machine."""
    head = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return f"checkout of {head.stdout.strip()}" if head.returncode == 0 else "another checkout"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def build_corpus(data: Path, ws: Path, copies: int, *, distinct: bool = False) -> None:
    """Copy the LoCoMo conversations ``copies`` times into a workspace, deterministically.

    Copy k of a conversation lives under memory/cNNN/<conversation>/ with each daily log's date
    moved k x 53 weeks on (so the copies span years, as a long-lived agent's logs do). The text
    is kept byte for byte: after the first copy every chunk's vector comes from the embedding
    cache, which is what makes 100,000 chunks of real text affordable on two cores.

    ``distinct``: after the first copy, each turn of a log is replaced by one drawn at random
    from every conversation's turns (headings and blank lines stay), so every chunk is a text,
    and a vector, of its own, while each line is still a real turn whose vector the cache
    holds: only the chunks' own vectors are embedded. The vector half then meets distinct
    vectors, as in a real workspace, not a few hundred repeated.
    """
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Long-Term Memory\n\nBenchmark corpus built from LoCoMo.\n")
    convs = sorted(p for p in data.iterdir() if p.is_dir())
    turns = [
        line
        for conv in (convs if distinct else [])
        for src in sorted((conv / "memory").glob("*.md"))
        for line in src.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    rng = random.Random(20261207)
    for k in range(copies):
        for conv in convs:
            target = ws / "memory" / f"c{k:03d}" / conv.name
            target.mkdir(parents=True)
            for src in sorted((conv / "memory").glob("*.md")):
                try:
                    name = f"{datetime.date.fromisoformat(src.stem) + datetime.timedelta(weeks=53 * k)}.md"
                except ValueError:
                    name = src.name
                if not distinct or k == 0:
                    shutil.copyfile(src, target / name)
                    continue
                lines = [
                    line if not line.strip() or line.startswith("#") else rng.choice(turns)
                    for line in src.read_text().splitlines()
                ]
                (target / name).write_text("\n".join(lines) + "\n")


def start_daemon(
    home: Path,
    sock: Path,
    provider: str,
    model: str,
    extra_env: Mapping[str, str] | None = None,
    code: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``memd run`` on ``home``; with ``code``, the memd of that checkout. ``python -m`` puts
    the working directory ahead of PYTHONPATH, so the daemon starts in ``code`` (else in this
    checkout): a daemon started from one checkout with another on PYTHONPATH runs the first."""
    env = dict(
        os.environ,
        MEMD_HOME=str(home),
        MEMD_SOCKET=str(sock),
        MEMD_EMBEDDING_PROVIDER=provider,
        # Absolute: a daemon of another checkout starts in that directory (below).
        MEMD_LOCAL_MODEL=str(Path(model).resolve()) if model else "",
    )
    env.update(extra_env or {})
    if code is not None:
        env["PYTHONPATH"] = f"{code}{os.pathsep}{code / 'client'}"
    log = open(home / "daemon.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "memd", "--log-level", "info", "run"],
        env=env,
        stdout=log,
        stderr=log,
        cwd=code or ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with memd_client.connect(sock, timeout=2) as c:
                c.hello()
                return proc
        except memd_client.MemdError:
            time.sleep(0.1)
    raise SystemExit("daemon did not start; see daemon.log")


def stop_daemon(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)


def wait_indexed(c: memd_client.Client, ws: str, *, vectors: bool) -> dict[str, Any]:
    """Poll status until the workspace is indexed (``vectors``: embedded too). A status walks
    the workspace to compare every file with the index (70-130 ms at 3,201 files while the
    daemon embeds), so the polls thin out as the wait grows: a twentieth of the time waited,
    0.5 to 5 s apart, and a long first index is not slowed by its own measurement."""
    start = time.monotonic()
    while True:
        st: dict[str, Any] = dict(c.status(workspace=ws)["workspaces"][0])
        settled = st["identity"]["state"] == "valid" and not st["freshness"]["rebuilding"]
        if (
            settled
            and st["files_indexed"] == st["files_on_disk"]
            and (not vectors or st["files_pending"] == 0)
        ):
            return st
        time.sleep(min(5.0, max(0.5, (time.monotonic() - start) / 20)))


def fresh_slices(qs: list[str], *sizes: int) -> list[list[str]]:
    """``qs`` cut into consecutive slices of ``sizes``: no question in two of them (the daemon keeps
    recent query vectors: a question asked again would time that cache)."""
    if sum(sizes) > len(qs):
        raise SystemExit(f"{sum(sizes)} distinct questions needed, {len(qs)} in the data")
    out, at = [], 0
    for size in sizes:
        out.append(qs[at : at + size])
        at += size
    return out


def timed_searches(sock: Path, ws: str, questions: list[str], mode: str) -> list[float]:
    out = []
    with memd_client.connect(sock) as c:
        for q in questions:
            t = time.perf_counter()
            c.search(ws, q, mode=mode)
            out.append((time.perf_counter() - t) * 1000)
    return out


def concurrent(
    sock: Path, ws: str, questions: list[str], mode: str, clients: int
) -> dict[str, float]:
    per = max(1, len(questions) // clients)
    lat: list[float] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        mine = timed_searches(sock, ws, questions[i * per : (i + 1) * per] or questions[:per], mode)
        with lock:
            lat.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {
        "clients": clients,
        "requests": len(lat),
        "throughput_rps": round(len(lat) / elapsed, 1),
        **summary(lat),
    }


def edit_to_searchable(sock: Path, ws_root: Path, ws: str, edits: int) -> list[float]:
    out = []
    target = next((ws_root / "memory" / "c000").rglob("*.md"))
    with memd_client.connect(sock) as c:
        for i in range(edits):
            token = f"zqx{i}marker{int(time.time())}"
            with open(target, "a") as f:
                f.write(f"\n- benchmark edit {token}\n")
            t = time.perf_counter()
            while True:
                if c.search(ws, token, mode="keyword")["results"]:
                    out.append((time.perf_counter() - t) * 1000)
                    break
                if time.perf_counter() - t > 30:
                    raise SystemExit(f"edit {i} not searchable after 30 s")
                time.sleep(0.01)
    return out


def idle_cost(pid: int, seconds: float = 20.0, settle: float = 5.0) -> dict[str, float]:
    """CPU share and RSS of a daemon left alone, after ``settle`` seconds for the work the
    last requests queued (recall recording, a debounced sync) to finish."""
    p = psutil.Process(pid)
    time.sleep(settle)
    p.cpu_percent(None)
    time.sleep(seconds)
    return {
        "cpu_percent": round(p.cpu_percent(None), 2),
        "rss_mb": round(p.memory_info().rss / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--copies", type=int, default=25)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--home", default="", help="reuse this MEMD_HOME (its embedding cache)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    data = Path(args.data)
    qrels = [json.loads(line) for line in (data / "qrels.jsonl").open()]
    questions = [q["question"] for q in qrels][: args.queries]
    home = Path(args.home or tempfile.mkdtemp(prefix="memd-sockbench-"))
    home.mkdir(parents=True, exist_ok=True)
    sock_dir = Path(tempfile.mkdtemp(prefix="memd-b-", dir="/tmp"))
    sock = sock_dir / "memd.sock"
    ws_root = home / "workspace"
    if not ws_root.exists():
        build_corpus(data, ws_root, args.copies)
    result: dict[str, object] = {
        **environment(),
        "code": code_state(),
        "copies": args.copies,
        "model": Path(args.model).name,
    }

    proc = start_daemon(home, sock, "local", args.model)
    try:
        with memd_client.connect(sock, timeout=None) as c:
            c.workspace_add(str(ws_root), name="bench")
            t = time.perf_counter()
            c.reindex(workspace="bench")
            st = wait_indexed(c, "bench", vectors=True)
            result["index_seconds"] = round(time.perf_counter() - t, 1)
            result["files"], result["chunks"] = st["files_indexed"], st["chunks"]
        timed_searches(sock, "bench", questions[:20], "hybrid")  # warm up
        result["idle_with_model"] = idle_cost(proc.pid)
        for mode in ("keyword", "hybrid"):
            result[f"{mode}_latency"] = summary(timed_searches(sock, "bench", questions, mode))
            # Throughput both ways through concurrent(): 1 client against 16, same questions.
            one = concurrent(sock, "bench", questions, mode, 1)
            many = concurrent(sock, "bench", questions, mode, 16)
            result[f"{mode}_throughput"] = {
                "1_client_rps": one["throughput_rps"],
                "16_clients_rps": many["throughput_rps"],
                "ratio": round(many["throughput_rps"] / one["throughput_rps"], 2),
                "16_clients_latency": {k: v for k, v in many.items() if k.endswith("_ms")},
            }
        result["edit_to_searchable"] = summary(
            edit_to_searchable(sock, ws_root, "bench", args.edits)
        )
    finally:
        stop_daemon(proc)

    # Keyword-only daemon: what memd costs without a model loaded.
    proc = start_daemon(home, sock, "none", "")
    try:
        with memd_client.connect(sock, timeout=None) as c:
            c.reindex(workspace="bench")
            wait_indexed(c, "bench", vectors=False)
            timed_searches(sock, "bench", questions[:20], "keyword")
        result["idle_without_model"] = idle_cost(proc.pid)
    finally:
        stop_daemon(proc)
        shutil.rmtree(sock_dir, ignore_errors=True)

    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
