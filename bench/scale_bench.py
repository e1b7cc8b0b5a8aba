"""How search cost grows with the corpus: ~1k, ~10k and ~100k chunks, 1 to 64 clients.

Each size is socket_bench's corpus (the LoCoMo conversations copied N times with their dates
moved on, text byte for byte) in a MEMD_HOME of its own under --home, served by `memd run` with
the local MiniLM model. Vectors come from the embedding cache: --seed-cache names a filled one
(every size starts from a copy of it), otherwise the first size fills it with the real model.
For each size: the first index (vectors from the cache), single-client latency of keyword and
hybrid search, throughput with 1, 4, 16 and 64 concurrent clients (no question asked twice of
one daemon in one mode: see Questions), the daemon's RSS idle and under load, and the index
size; then each figure as a ratio of the smallest size's.

With --old DIR (a checkout of earlier code, e.g. ``git worktree add DIR COMMIT``) each size is
also served by that code, from a home of its own, one after the other in the same run, and
the report sets the two side by side. Idle RSS is taken after 15 s without a request. For the
new code's index two more figures come from the file itself once the daemon has stopped: the
vector fast path's recall of the exact top ten (every stored vector scored, against the
sketch's answer), and whether the keyword top k found without ranking every match equals
FTS5's plain ranking, with both timed.

    python bench/scale_bench.py [--copies 3,25,250] [--queries 200] [--home DIR]
                                [--seed-cache FILE] [--old DIR] [--distinct] [--json OUT]

``--distinct`` builds copies whose turns are drawn at random from all the conversations
(socket_bench.build_corpus): every chunk a text and a vector of its own, so the vector half
is measured as a real workspace would meet it and not on a few hundred vectors repeated.
Only the chunks' own vectors are new (each line is a real turn, cached): about 4 chunks a
second with MiniLM on one thread, some 40 minutes for 9,766 chunks on two cores.

Homes are kept, so a second run reuses the built indexes (its index time is then not a
first index and is reported as null).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import memd_client
from memd.embed.process import ProcessEmbedder
from memd.index import bm25
from memd.index.db import connect
from memd.index.sketch import Sketch, stacked
from memd.index.store import Store
from memd.search.keyword import keyword_match

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import (  # noqa: E402
    SHARED,
    build_corpus,
    checkout_name,
    code_state,
    concurrent,
    environment,
    fresh_slices,
    start_daemon,
    stop_daemon,
    summary,
    timed_searches,
    wait_indexed,
)

IDLE_S = 15.0


class PeakRss:
    """The highest RSS of a process, sampled every 100 ms while the block runs, and the
    highest sum of its reader processes' (memd/readers; the model's worker is not counted)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.readers_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss")

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.proc.memory_info().rss)
            readers = 0
            for child in self.proc.children():
                try:
                    if "memd.readers.host" in child.cmdline():
                        readers += child.memory_info().rss
                except psutil.Error:
                    pass  # it exited meanwhile
            self.readers_peak = max(self.readers_peak, readers)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Questions:
    """The questions of one run, none asked twice of a daemon in a search mode: the daemon keeps
    recent query vectors, and a repeat would time that cache (runs before 2026-12-05 did, for
    all their throughput figures). ``timed`` for latency, ``warm`` before it, and the rest
    shared out among the throughput runs."""

    def __init__(self, every: list[str], timed: int, warm: int = 20) -> None:
        if timed + warm >= len(every):
            raise SystemExit(f"--queries {timed}: the data has {len(every)} questions")
        spare = len(every) - timed - warm
        self.timed, self.spare, self.warm = fresh_slices(every, timed, spare, warm)

    def shares(self, parts: int) -> list[list[str]]:
        return fresh_slices(self.spare, *[len(self.spare) // parts] * parts)


def measure(
    home: Path,
    sock: Path,
    model: str,
    copies: int,
    questions: Questions,
    clients: list[int],
    code: Path | None = None,
) -> dict[str, Any]:
    """One size served by this checkout's memd, or by the one at ``code``."""
    name = "scale"
    ws_root = home / "workspace"
    row: dict[str, Any] = {
        "copies": copies,
        "code": checkout_name(code) if code else "this checkout",
    }
    warm_os_cache(home)
    proc = start_daemon(home, sock, "local", model, code=code)
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
        timed_searches(sock, name, questions.warm, "hybrid")  # warm: model, caches, pages
        # Idle: 15 s without a request (memd hands memory back after 10 quiet seconds).
        time.sleep(IDLE_S)
        row["rss_idle_mb"] = round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)
        with PeakRss(proc.pid) as peak:
            for mode in ("keyword", "hybrid"):
                timed = timed_searches(sock, name, questions.timed, mode)
                row[f"{mode}_latency"] = summary(timed)
                row[f"{mode}_throughput_rps"] = {
                    str(n): concurrent(sock, name, share, mode, n)["throughput_rps"]
                    for n, share in zip(clients, questions.shares(len(clients)), strict=True)
                }
        row["rss_loaded_mb"] = round(peak.peak / 2**20, 1)
        row["readers_rss_peak_mb"] = round(peak.readers_peak / 2**20, 1)
    finally:
        stop_daemon(proc)
    return row


def warm_os_cache(home: Path) -> None:
    """Read the home's index files once, so that each daemon starts with them in the OS's
    cache: on a VM whose page cache is taken back between runs, the code measured second was
    otherwise measured against a cold file as often as not."""
    for path in sorted((home / "state" / "indexes").glob("*.sqlite*")):
        with path.open("rb") as f:
            while f.read(1 << 24):
                pass


def index_file(home: Path) -> Path:
    return next((home / "state" / "indexes").glob("*.sqlite"))


def query_vectors(model: str, questions: list[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
    embedder = ProcessEmbedder(model, threads=2)
    try:
        return np.stack([embedder.embed_query(q) for q in questions]).astype(np.float32)
    finally:
        embedder.close()


def fast_path_recall(path: Path, queries: np.ndarray[Any, Any]) -> dict[str, Any]:
    """The sketch's top ten against every stored vector scored (a hit counts when its exact
    score reaches the tenth's), on the index file as the daemon left it."""
    conn = connect(path, load_vec=False, readonly=True)
    try:
        first = conn.execute("SELECT embedding FROM chunks_vec_plain LIMIT 1").fetchone()
        dims = len(first[0]) // 4 if first else 0  # float32
        _, vectors = stacked(conn.execute("SELECT id, embedding FROM chunks_vec_plain"), dims)
        store = Store(conn, "plain", vectors.shape[1], Sketch(vectors.shape[1]))
        recall = []
        for q in queries:
            tenth = np.sort(vectors @ q)[-10]
            fast = store.reads.vector_candidates(q, None, 24)[:10]
            recall.append(sum(r.score >= tenth - 1e-6 for r in fast) / 10)
    finally:
        conn.close()
    return {"recall_at_10": round(statistics.fmean(recall), 4), "recall_min": min(recall)}


def keyword_bound(path: Path, questions: list[str], k: int = 24) -> dict[str, Any]:
    """The bounded keyword top k against FTS5's plain ranking on the same file: equal lists,
    and each one's time (the FTS5 statements alone)."""
    conn = connect(path, load_vec=False, readonly=True)
    try:
        reads = Store(conn, "none", 0).reads
        plain_ms, bounded_ms, equal, asked = [], [], 0, 0
        for q in questions:
            match, _ = keyword_match(q, reads.doc_freqs)
            if not match:
                continue
            t0 = time.perf_counter()
            plain = bm25._plain(conn, match, k)
            t1 = time.perf_counter()
            bounded = bm25.top_ranked(conn, match, k, reads.doc_freqs)
            t2 = time.perf_counter()
            plain_ms.append((t1 - t0) * 1000)
            bounded_ms.append((t2 - t1) * 1000)
            asked += 1
            equal += len(plain) == len(bounded) and all(
                abs(a[1] - b[1]) <= 1e-9 * abs(a[1]) for a, b in zip(plain, bounded, strict=True)
            )
    finally:
        conn.close()
    return {
        "queries": asked,
        "same_ranking": equal,
        "plain": summary(plain_ms),
        "bounded": summary(bounded_ms),
    }


def side_by_side(rows: list[dict[str, Any]]) -> str:
    """The issue's table: each figure, old → new, per size."""
    out = [
        "| measure | " + " | ".join(f"{r['chunks']:,} chunks ({r['code']})" for r in rows) + " |"
    ]
    out.append("|---" * (len(rows) + 1) + "|")

    def line(label: str, cell: Any) -> None:
        out.append(f"| {label} | " + " | ".join(cell(r) for r in rows) + " |")

    for mode in ("keyword", "hybrid"):
        line(
            f"{mode} p50 / p99 ms",
            lambda r, m=mode: f"{r[f'{m}_latency']['p50_ms']} / {r[f'{m}_latency']['p99_ms']}",
        )
        line(
            f"{mode} 16 clients vs 1",
            lambda r, m=mode: (
                f"{r[f'{m}_throughput_rps']['16'] / r[f'{m}_throughput_rps']['1']:.2f}x"
                if "16" in r[f"{m}_throughput_rps"]
                else "-"
            ),
        )
    line("idle RSS (MB)", lambda r: str(r["rss_idle_mb"]))
    line("RSS after the client runs (MB)", lambda r: str(r["rss_loaded_mb"]))
    line("reader processes' RSS, peak (MB)", lambda r: str(r.get("readers_rss_peak_mb", "-")))
    line("vector recall@10", lambda r: str(r.get("vector", {}).get("recall_at_10", "-")))
    return "\n".join(out)


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
    ap.add_argument("--old", default="", help="a checkout of earlier code to run side by side")
    ap.add_argument(
        "--distinct",
        action="store_true",
        help="copies after the first draw their turns at random (every chunk distinct)",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    data = Path(args.data)
    every = [json.loads(line)["question"] for line in (data / "qrels.jsonl").open()]
    questions = Questions(every, args.queries)
    clients = [int(n) for n in args.clients.split(",")]
    root = Path(args.home or tempfile.mkdtemp(prefix="memd-scale-"))
    sock_dir = Path(tempfile.mkdtemp(prefix="memd-s-", dir="/tmp"))
    seed = Path(args.seed_cache) if args.seed_cache else None
    queries: np.ndarray[Any, np.dtype[np.float32]] | None = None
    rows: list[dict[str, Any]] = []
    old_rows: list[dict[str, Any]] = []
    try:
        for copies in (int(c) for c in args.copies.split(",")):
            home = root / f"size-{copies}"
            if not (home / "workspace").exists():
                build_corpus(data, home / "workspace", copies, distinct=args.distinct)
            cache = home / "state" / "embedding-cache.sqlite"
            if seed is not None and not cache.exists():
                cache.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(seed, cache)
            row = measure(home, sock_dir / "memd.sock", args.model, copies, questions, clients)
            if queries is None:  # embedded once, for every size
                queries = query_vectors(args.model, questions.timed)
            row["vector"] = fast_path_recall(index_file(home), queries)
            row["keyword_bound"] = keyword_bound(index_file(home), questions.timed)
            print(json.dumps(row), flush=True)
            rows.append(row)
            seed = seed or cache  # the first size filled it: the others start from it
            if args.old:
                old_home = root / f"size-{copies}-old"
                if not (old_home / "workspace").exists():
                    old_home.mkdir(parents=True, exist_ok=True)
                    shutil.copytree(home / "workspace", old_home / "workspace")
                old_cache = old_home / "state" / "embedding-cache.sqlite"
                if not old_cache.exists():
                    old_cache.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(seed, old_cache)
                old = measure(
                    old_home,
                    sock_dir / "memd.sock",
                    args.model,
                    copies,
                    questions,
                    clients,
                    code=Path(args.old).resolve(),
                )
                print(json.dumps(old), flush=True)
                old_rows.append(old)
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    growth(rows)
    result: dict[str, Any] = {
        **environment(),
        "code": code_state(),
        "model": Path(args.model).name,
        "queries": len(questions.timed),
        "sizes": rows,
    }
    if old_rows:
        result["old_code"] = old_rows
    print(json.dumps(result, indent=2))
    pairs = [r for new, old in zip(rows, old_rows, strict=False) for r in (old, new)]
    print(side_by_side(pairs or rows))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
