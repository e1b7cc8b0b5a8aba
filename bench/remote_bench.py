"""A first index through a remote embedding API: requests, concurrency, tokens and time.

Builds a workspace of 40 daily notes (about 60 KB, deterministic), starts an OpenAI-shaped
HTTP server on 127.0.0.1 that counts what it is sent (tests/provider_server.py) and takes a
set time per embedding request, starts ``memd run`` with ``provider = "openai"`` pointed at it,
registers the workspace and times it until every file has its vectors. Reports the requests,
the most requests in flight at once, the connections opened, the texts and (estimated) tokens
sent, and the seconds, once per simulated latency.

    python bench/remote_bench.py [--latency 0.05,0.3] [--json OUT] [--env KEY=VALUE ...]
    python bench/remote_bench.py --code OTHER_CHECKOUT   # the same, with another memd
    python bench/remote_bench.py --batch                 # the Batch API, restarted mid-batch
    python bench/remote_bench.py --during --files 400    # appends and searches while it runs

``--during`` also times an append every 0.2 s from the start, and a hybrid search every 0.2 s
once the keyword rows are in, until 10 s after that (400 notes keep the embedding busy that
long): what a writer or a search waits for behind the document requests. Its seconds and
requests include those appends. ``--batch`` sets the Batch
API threshold low, holds the batch in progress, stops memd, starts it again, and lets the batch
complete: it reports the batch calls, the live requests (none for the batched texts) and the
status lines before and after.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

# The bench starts its daemons itself: a client must not start one of its own meanwhile.
os.environ["MEMD_AUTOSTART"] = "0"

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from socket_bench import (  # noqa: E402
    checkout_name,
    code_state,
    environment,
    start_daemon,
    stop_daemon,
    summary,
)

import memd_client  # noqa: E402
from tests.provider_server import FakeProvider, Reply, Seen  # noqa: E402

DIMS = 64
DURING_S = 10.0
KEY = "sk-bench-" + "x" * 24
WORDS = (
    "deploy staging cluster vega orion build rollback migration postgres index latency "
    "review alice bob carol dashboard alert pager retry queue worker cache token budget "
    "invoice customer ticket release branch merge flaky test script cron backup restore "
    "decided agreed prefers dislikes meeting lunch flight hotel berlin lisbon tokyo"
).split()


def write_notes(ws: Path, files: int = 40, seed: int = 11) -> int:
    """``files`` daily notes of about 1.5 KB each (a heading and 15 list items); their bytes."""
    rng = random.Random(seed)
    (ws / "memory").mkdir(parents=True)
    day = datetime.date(2026, 1, 5)
    total = 0
    for n in range(files):
        lines = [f"# {day + datetime.timedelta(days=n)}", ""]
        for i in range(15):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 16)))
            lines.append(f"- {9 + i // 2:02d}:{(i * 7) % 60:02d} {words}.")
        text = "\n".join(lines) + "\n"
        (ws / "memory" / f"{day + datetime.timedelta(days=n)}.md").write_text(text)
        total += len(text.encode())
    return total


def vector(text: str) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return [float(x) for x in np.random.default_rng(seed).standard_normal(DIMS)]


def respond(seen: Seen) -> Reply:
    texts = seen.body.get("input") if isinstance(seen.body, dict) else None
    if not isinstance(texts, list):
        return 400, {}, {"error": {"message": "expected input"}}
    tokens = sum(max(1, len(t) // 4) for t in texts)
    data = [
        {"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(texts)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return 200, {}, {"object": "list", "data": data, "model": "bench", "usage": usage}


def daemon_env(server: FakeProvider, extra: list[str]) -> dict[str, str]:
    env = {
        "OPENAI_API_KEY": KEY,
        "MEMD_EMBEDDING_BASE_URL": server.url + "/v1",
        "MEMD_EMBEDDING_MODEL": "text-embedding-3-small",
        "MEMD_EMBEDDING_DIMENSIONS": str(DIMS),
        "MEMD_DREAMING_RECORD_RECALLS": "false",
    }
    for item in extra:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def workspace_state(c: memd_client.Client, name: str) -> dict[str, Any]:
    return dict(c.status(workspace=name)["workspaces"][0])


def indexed(st: dict[str, Any]) -> bool:
    return (
        st["identity"]["state"] == "valid"
        and not st["rebuilding"]
        and st["files_on_disk"] > 0
        and st["files_indexed"] == st["files_on_disk"]
        and st["files_pending"] == 0
    )


def wait_until(c: memd_client.Client, name: str, limit: float = 900.0) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        st = workspace_state(c, name)
        if indexed(st):
            return st
        time.sleep(0.05)
    raise SystemExit(f"{name} not indexed within {limit:g} s")


class During:
    """Appends every 0.2 s, and hybrid searches every 0.2 s once the keyword rows are in
    (``ready``), on their own connections, timed."""

    def __init__(self, sock: Path, name: str) -> None:
        self.sock, self.name = sock, name
        self.ready = threading.Event()
        self.appends: list[float] = []
        self.searches: list[float] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._appends, daemon=True),
            threading.Thread(target=self._searches, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _appends(self) -> None:
        with memd_client.connect(self.sock, timeout=120) as c:
            n = 0
            while not self.stop.wait(0.2):
                t = time.perf_counter()
                c.append(self.name, f"bench entry {n}: the deploy of vega moved to friday")
                self.appends.append((time.perf_counter() - t) * 1000)
                n += 1

    def _searches(self) -> None:
        while not self.ready.wait(0.05):
            if self.stop.is_set():
                return
        with memd_client.connect(self.sock, timeout=120) as c:
            n = 0
            while not self.stop.wait(0.2):
                t = time.perf_counter()
                # A question not asked before: its vector is not in any cache.
                c.search(self.name, f"when did we decide on the lisbon flight {n}", mode="hybrid")
                self.searches.append((time.perf_counter() - t) * 1000)
                n += 1

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return {"append": summary(self.appends), "search": summary(self.searches)}


def run_one(
    latency: float, code: Path | None, extra: list[str], during: bool, tmp: Path, files: int
) -> dict[str, Any]:
    home = tmp / f"home-{latency:g}"
    home.mkdir(mode=0o700)
    ws = home / "ws"
    size = write_notes(ws, files)
    server = FakeProvider(latency=latency)
    server.responder = respond
    sock = home / "memd.sock"
    proc = start_daemon(home, sock, "openai", "", daemon_env(server, extra), code=code)
    try:
        with memd_client.connect(sock, timeout=120) as c:
            started = time.perf_counter()
            c.workspace_add(ws, name="notes")
            side = None
            if during:  # DURING_S seconds from when the keyword rows are in, then left alone
                watch = During(sock, "notes")
                while True:
                    st = workspace_state(c, "notes")
                    if st["files_indexed"] >= st["files_on_disk"] > 0:
                        break
                    time.sleep(0.05)
                keyword_s = time.perf_counter() - started
                watch.ready.set()
                time.sleep(DURING_S)
                side = {"keyword_rows_s": round(keyword_s, 2), **watch.finish()}
            st = wait_until(c, "notes")
            seconds = time.perf_counter() - started
            status_text = c.status(workspace="notes")
    finally:
        stop_daemon(proc)
        server.close()
    counts = server.counts
    per = counts.per_request_texts
    return {
        "latency_s": latency,
        "bytes": size,
        "files": st["files_indexed"],
        "chunks": st["chunks"],
        "requests": counts.requests,
        "peak_in_flight": counts.peak,
        "connections": counts.connections,
        "texts": counts.texts,
        "tokens": counts.tokens,
        "texts_per_request": {
            "max": max(per) if per else 0,
            "mean": round(statistics.fmean(per), 1) if per else 0,
        },
        "seconds": round(seconds, 2),
        "during": side,
        "status": status_text,
    }


def run_batch(code: Path | None, extra: list[str], tmp: Path) -> dict[str, Any]:
    """A first index through the Batch API with a daemon restart while the batch runs."""
    home = tmp / "home-batch"
    home.mkdir(mode=0o700)
    ws = home / "ws"
    write_notes(ws)
    server = FakeProvider(latency=0.05)
    server.responder = respond
    server.batches.hold.set()
    sock = home / "memd.sock"
    env = daemon_env(
        server,
        ["MEMD_EMBEDDING_BATCH_MIN_TOKENS=1000", "MEMD_EMBEDDING_BATCH_POLL_SECONDS=1", *extra],
    )
    proc = start_daemon(home, sock, "openai", "", env, code=code)
    started = time.perf_counter()
    try:
        with memd_client.connect(sock, timeout=120) as c:
            c.workspace_add(ws, name="notes")
            while not server.batches.batches:
                time.sleep(0.05)
            time.sleep(1.5)  # polled at least once: in progress
            before = c.status(workspace="notes")
    finally:
        stop_daemon(proc)
    ids_before = sorted(server.batches.batches)
    proc = start_daemon(home, sock, "openai", "", env, code=code)
    try:
        with memd_client.connect(sock, timeout=120) as c:
            time.sleep(1.5)
            resumed = c.status(workspace="notes")
            server.batches.hold.clear()
            st = wait_until(c, "notes")
            after = c.status(workspace="notes")
    finally:
        stop_daemon(proc)
        server.close()
    counts = server.counts
    return {
        "batches_created": len(server.batches.batches),
        "batch_ids_before_restart": ids_before,
        "batch_calls": counts.batch_calls,
        "batch_texts": counts.batch_texts,
        "batch_tokens": counts.batch_tokens,
        "live_requests": counts.requests,
        "live_texts": counts.texts,
        "chunks": st["chunks"],
        "seconds": round(time.perf_counter() - started, 2),
        "status_mid_batch": before,
        "status_after_restart": resumed,
        "status_done": after,
    }


def status_text(status: dict[str, Any]) -> str:
    from memd.ctl.display_status import status_lines

    return "\n".join(status_lines(status, time.time()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", default="0.05,0.3", help="seconds per request, comma-separated")
    ap.add_argument("--code", default="", help="another checkout's memd to run")
    ap.add_argument("--json", default="", help="where to write the figures")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the daemon")
    ap.add_argument("--during", action="store_true", help="time appends and searches meanwhile")
    ap.add_argument("--files", type=int, default=40, help="daily notes (about 1.5 KB each)")
    ap.add_argument("--batch", action="store_true", help="the Batch API with a restart")
    args = ap.parse_args(argv)
    code = Path(args.code).resolve() if args.code else None
    out: dict[str, Any] = {
        "environment": environment(),
        "code": checkout_name(code) if code else code_state(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="remote-bench-") as tmp:
        if args.batch:
            out["batch"] = run_batch(code, args.env, Path(tmp))
            b = out["batch"]
            print(
                f"batch: {b['batches_created']} batch(es), {b['batch_calls']} Batch API calls, "
                f"{b['batch_texts']} texts / {b['batch_tokens']} tokens batched, "
                f"{b['live_requests']} live requests ({b['live_texts']} texts), {b['seconds']} s"
            )
            for key in ("status_mid_batch", "status_after_restart", "status_done"):
                print(f"\n--- {key}\n{status_text(b[key])}")
        else:
            print(
                "| latency | requests | peak in flight | connections | texts | tokens | seconds |"
            )
            print("|---|---|---|---|---|---|---|")
            for latency in (float(x) for x in args.latency.split(",")):
                r = run_one(latency, code, args.env, args.during, Path(tmp), args.files)
                out["runs"].append(r)
                print(
                    f"| {latency * 1000:.0f} ms | {r['requests']} | {r['peak_in_flight']} | "
                    f"{r['connections']} | {r['texts']} | {r['tokens']} | {r['seconds']} |"
                )
                if r["during"]:
                    print(f"  during: {json.dumps(r['during'])}")
            print(f"\n{status_text(out['runs'][-1]['status'])}")
        text = json.dumps(out, indent=2, default=str).replace(tmp, "<tmp>")
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
