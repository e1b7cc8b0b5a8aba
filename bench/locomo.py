"""Retrieval quality on LoCoMo (../shared/data/locomo-dev), measured through the daemon's socket.

Starts `memd run` (bench/socket_bench.py's helpers), registers each conversation workspace with
`workspace_add`, asks every question of its own workspace with `search` (max_results 10,
min_score 0) and scores the ranked hits with ../shared/bench/locomo_score.py: R@1/5/10 and MRR,
overall and by question category, plus the search latency over the socket. Variants: keyword,
vector and hybrid search, each with MMR or temporal decay where it says so, all served by one
daemon with the embedding model, and keyword search from a second daemon without any embedder.

    python bench/locomo.py [--variants hybrid,keyword,...] [--embedder local|fake] [--model GGUF]
                           [--home DIR] [--json OUT] [--dream] [--env KEY=VALUE ...]

``--dream`` first runs dreaming (Light, REM, Deep, with apply) over each workspace as the night
after its last note would, so MEMORY.md gains its promotions and DREAMS.md its entry, then
searches; ``--env`` passes settings to the daemons (``MEMD_INDEX_DIARY=true``, say).

The workspaces are copied into the MEMD_HOME (the daemon writes next to them; the shared data
stays untouched), and each daemon gets a MEMD_HOME of its own under it (`daemon-local`,
`daemon-none`), so `--home DIR` keeps the indexes and the embedding cache between runs: the
first run embeds the 395 chunks (about 100 s with MiniLM on two cores), later runs start at once.
Recall recording is switched off: it would write a recall store for every question and compete
with the searches for the CPU. Prints Markdown tables for docs/benchmarks.md; writes all figures,
the machine and the library versions as JSON (default bench/results/locomo.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

import memd_client
from memd.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import (  # noqa: E402
    ROOT,
    SHARED,
    code_state,
    environment,
    start_daemon,
    stop_daemon,
    summary,
    wait_indexed,
)

MAX_RESULTS = 10
KS = (1, 5, 10)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
# Searches that are not timed, so that the first timed ones do not pay for cold caches.
WARMUP = 20
NO_MODEL = "none"


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    mode: str
    decay: bool = False
    mmr: bool = False
    # False: served by the daemon started without any embedder (provider "none").
    model: bool = True


VARIANTS = (
    Variant("keyword", "keyword", "keyword"),
    Variant("keyword+mmr", "keyword + MMR", "keyword", mmr=True),
    Variant("keyword+decay", "keyword + temporal decay", "keyword", decay=True),
    Variant("vector", "vector only", "vector"),
    Variant("hybrid", "hybrid", "hybrid"),
    Variant("hybrid+mmr", "hybrid + MMR", "hybrid", mmr=True),
    Variant("hybrid+decay", "hybrid + temporal decay", "hybrid", decay=True),
    Variant("keyword-nomodel", "keyword, daemon without embedder", "keyword", model=False),
)


@dataclass
class Run:
    """One variant's answers: the results file the scorer reads, and how the daemon replied."""

    variant: Variant
    results: Path
    latencies_ms: list[float]
    modes: collections.Counter[str]
    notes: collections.Counter[str]


def copy_workspaces(data: Path, dest: Path, convs: Iterable[str]) -> dict[str, Path]:
    """Copy each conversation's Markdown files under ``dest`` (only files that differ, so a
    reused home keeps its mtimes and its index stays valid)."""
    roots = {}
    for conv in convs:
        for src in sorted((data / conv).rglob("*.md")):
            target = dest / conv / src.relative_to(data / conv)
            body = src.read_bytes()
            if not target.is_file() or target.read_bytes() != body:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(body)
        roots[conv] = dest / conv
    return roots


def dream(root: Path, folder: Path) -> dict[str, int]:
    """Dream over ``root`` with apply, at 03:00 UTC the day after its last daily note; what
    it wrote (and what an earlier run left) starts from the data set's files each time."""
    from datetime import UTC, datetime, timedelta

    from memd.clock import Clock
    from memd.dreams.dream import DreamOptions, run_dream

    (root / "DREAMS.md").unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    days = sorted(p.stem[:10] for p in (root / "memory").glob("????-??-??*.md"))
    night = datetime.fromisoformat(days[-1]).replace(tzinfo=UTC) + timedelta(days=1, hours=3)
    run = run_dream(root, DreamOptions(apply=True), clock=Clock.at(night, "UTC"), folder=folder)
    return {
        "staged": len(run["light"]["staged"]),
        "truths": len(run["rem"]["truths"]),
        "promoted": len(run["deep"]["applied"]),
        "diary_chars": len((root / "DREAMS.md").read_text()),
    }


def workspace_name(conv: str) -> str:
    return f"locomo-{conv}"


def ask(c: memd_client.Client, variant: Variant, qrels: Sequence[dict[str, Any]], out: Path) -> Run:
    run = Run(variant, out, [], collections.Counter(), collections.Counter())
    with out.open("w") as f:
        for q in qrels:
            t = time.perf_counter()
            reply = c.search(
                workspace_name(q["conv"]),
                q["question"],
                max_results=MAX_RESULTS,
                min_score=0.0,
                mode=variant.mode,
                decay=variant.decay,
                mmr=variant.mmr,
            )
            run.latencies_ms.append((time.perf_counter() - t) * 1000)
            run.modes[reply["mode"]] += 1
            if note := reply["note"]:
                run.notes[note] += 1
            hits = [
                {"path": h["path"], "start_line": h["start_line"], "end_line": h["end_line"]}
                for h in reply["results"]
            ]
            f.write(json.dumps({"qid": q["qid"], "results": hits}) + "\n")
    return run


def serve(
    provider: str,
    model: str,
    home: Path,
    sock: Path,
    roots: dict[str, Path],
    qrels: Sequence[dict[str, Any]],
    variants: Sequence[Variant],
    runs_dir: Path,
    extra_env: dict[str, str],
) -> tuple[dict[str, Any], list[Run]]:
    """Start a daemon with ``provider``, index the workspaces, ask every variant's questions."""
    home.mkdir(parents=True, exist_ok=True)
    code = code_state()
    env = {"MEMD_DREAMING_RECORD_RECALLS": "false", **extra_env}
    proc = start_daemon(home, sock, provider, model, extra_env=env)
    try:
        with memd_client.connect(sock) as c:  # reindex below waits as long as indexing takes
            t = time.perf_counter()
            for conv, root in roots.items():
                c.workspace_add(root, name=workspace_name(conv))
            for conv in roots:
                c.reindex(workspace=workspace_name(conv))
                wait_indexed(c, workspace_name(conv), vectors=provider != NO_MODEL)
            index_seconds = time.perf_counter() - t
            states = [c.status(workspace=workspace_name(conv))["workspaces"][0] for conv in roots]
            active = {st["provider"]["active"] for st in states}
            if active != {provider}:
                raise SystemExit(f"asked for provider {provider!r}, the daemon uses {active}")
            info: dict[str, Any] = {
                "provider": provider,
                "model": states[0]["provider"]["model"],
                "dims": states[0]["provider"]["dims"],
                "memd_version": c.hello(client="bench/locomo.py")["version"],
                "code": code,
                "sqlite_vec_loaded": states[0]["vector_store"]["sqlite_vec"],
                "sqlite_vec_version": states[0]["vector_store"]["sqlite_vec_version"],
                "index_seconds": round(index_seconds, 1),
                "files": sum(st["files_indexed"] for st in states),
                "chunks": sum(st["chunks"] for st in states),
                "vectors": sum(st["vectors"] for st in states),
                "cache_entries": states[0]["cache_entries"],
            }
            for q in qrels[:WARMUP]:
                c.search(workspace_name(q["conv"]), q["question"], mode=variants[0].mode)
            runs = []
            for v in variants:
                runs.append(ask(c, v, qrels, runs_dir / f"{v.name}.jsonl"))
                print(f"{v.name}: asked {len(qrels)} questions", file=sys.stderr, flush=True)
            info["rss_mb_after"] = round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)
    finally:
        stop_daemon(proc)
    return info, runs


def score(qrels: Path, results: Path) -> dict[str, Any]:
    """The shared scorer's report (run as the data set's README says)."""
    scorer = SHARED / "bench" / "locomo_score.py"
    ks = ",".join(map(str, KS))
    out = subprocess.run(
        [sys.executable, str(scorer), str(qrels), str(results), "--k", ks],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report: dict[str, Any] = json.loads(out)
    return report


def figures(run: Run, qrels: Path, by_category: dict[int, Path]) -> dict[str, Any]:
    overall = score(qrels, run.results)
    if overall["answered"] != overall["questions"]:
        raise SystemExit(f"{run.variant.name}: {overall['answered']} of {overall['questions']}")
    cats = {}
    for cat, path in by_category.items():
        part = score(path, run.results)  # the scorer's by_category has no MRR: score subsets
        cats[str(cat)] = {
            "name": CATEGORIES.get(cat, "?"),
            "n": part["questions"],
            "mrr": part["mrr"],
            **{f"R@{k}": part[f"R@{k}"] for k in KS},
        }
    v = run.variant
    return {
        "label": v.label,
        "daemon": "model" if v.model else "no embedder",
        "request": {"mode": v.mode, "decay": v.decay, "mmr": v.mmr},
        "modes_used": dict(run.modes),
        "notes": dict(run.notes),
        "mrr": overall["mrr"],
        **{f"R@{k}": overall[f"R@{k}"] for k in KS},
        **{f"allR@{k}": overall[f"allR@{k}"] for k in KS},
        "by_category": cats,
        "latency_ms": summary(run.latencies_ms),
    }


def share(value: float, n: int) -> str:
    """A recall to three places from the scorer's four: rounding its hit count, not 0.xxx5."""
    return f"{round(value * n) / n:.3f}"


def markdown(variants: dict[str, dict[str, Any]], counts: dict[int, int]) -> str:
    lines = [
        "| variant | R@1 | R@5 | R@10 | MRR | search p50 (socket) |",
        "|---|---|---|---|---|---|",
    ]
    n = sum(counts.values())
    for fig in variants.values():
        lines.append(
            f"| {fig['label']} | {share(fig['R@1'], n)} | {share(fig['R@5'], n)} "
            f"| {share(fig['R@10'], n)} | {fig['mrr']:.3f} | {fig['latency_ms']['p50_ms']:.1f} ms |"
        )
    cats = sorted(counts)
    lines += [
        "",
        "By category, R@5 ("
        + ", ".join(f"{c} {CATEGORIES.get(c, '?')} n={counts[c]}" for c in cats)
        + "):",
        "",
        "| variant | " + " | ".join(str(c) for c in cats) + " |",
        "|---|" + "---|" * len(cats),
    ]
    for fig in variants.values():
        row = " | ".join(share(fig["by_category"][str(c)]["R@5"], counts[c]) for c in cats)
        lines.append(f"| {fig['label']} | {row} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument(
        "--variants",
        default=",".join(v.name for v in VARIANTS),
        help="comma-separated, from: %(default)s",
    )
    ap.add_argument("--embedder", default="local", choices=["local", "fake"])
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--home", default="", help="MEMD_HOME to keep and reuse (indexes, cache)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "locomo.json"))
    ap.add_argument("--dream", action="store_true", help="dream over each workspace first")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the daemons")
    args = ap.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.env)

    known = {v.name: v for v in VARIANTS}
    wanted = [name.strip() for name in args.variants.split(",") if name.strip()]
    if unknown := [name for name in wanted if name not in known]:
        ap.error(f"unknown variants {', '.join(unknown)}; known: {', '.join(known)}")
    selected = [known[name] for name in wanted]

    data = Path(args.data)
    qrels_path = data / "qrels.jsonl"
    qrels = [json.loads(line) for line in qrels_path.open()]
    convs = sorted({q["conv"] for q in qrels})
    home = Path(args.home or tempfile.mkdtemp(prefix="memd-locomo-")).resolve()
    runs_dir = home / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    roots = copy_workspaces(data, home / "workspaces", convs)
    if args.dream:
        dreamed = {conv: dream(root, home / "dreams" / conv) for conv, root in roots.items()}
    by_category: dict[int, Path] = {}
    for cat in sorted({q["category"] for q in qrels}):
        by_category[cat] = runs_dir / f"qrels-category-{cat}.jsonl"
        by_category[cat].write_text(
            "".join(json.dumps(q) + "\n" for q in qrels if q["category"] == cat)
        )
    model = str(Path(args.model).resolve()) if args.embedder == "local" else ""
    if model and not Path(model).is_file():
        raise SystemExit(f"no model at {model}")

    result: dict[str, Any] = environment()
    result |= {
        "data": os.path.relpath(data.resolve(), ROOT),
        "questions": len(qrels),
        "categories": {str(c): CATEGORIES.get(c, "?") for c in by_category},
        "request": {"max_results": MAX_RESULTS, "min_score": 0.0},
        # What the daemons read for anything a request leaves out (their config file and env).
        "search_config": asdict(
            Config.load(env={**os.environ, "MEMD_HOME": str(home / "daemon-none")}).search
        ),
        "daemons": {},
        "variants": {},
        "daemon_env": extra_env,
        "dreamed": dreamed if args.dream else None,
    }
    sock_dir = Path(tempfile.mkdtemp(prefix="memd-l-", dir="/tmp"))
    runs: dict[str, Run] = {}
    try:
        for provider, wants_model in ((args.embedder, True), (NO_MODEL, False)):
            group = [v for v in selected if v.model == wants_model]
            if not group:
                continue
            info, done = serve(
                provider,
                model if wants_model else "",
                home / f"daemon-{provider}",
                sock_dir / "memd.sock",
                roots,
                qrels,
                group,
                runs_dir,
                extra_env,
            )
            result["daemons"][provider] = info
            runs |= {r.variant.name: r for r in done}
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)

    for v in selected:  # in the order asked for
        result["variants"][v.name] = figures(runs[v.name], qrels_path, by_category)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    counts = collections.Counter(q["category"] for q in qrels)
    print(markdown(result["variants"], dict(counts)))
    if args.home:
        print(f"\nfigures in {out}; ranked results in {runs_dir}", file=sys.stderr)
    else:
        print(f"\nfigures in {out}", file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
