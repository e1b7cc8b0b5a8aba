"""Where one keyword search's time goes, stage by stage, on a built index, in-process.

Runs memd.search.search (mode keyword, the daemon's default options) over the index of a
MEMD_HOME (scale_bench.py builds them) for each LoCoMo question, twice in turn: ranked by the
keyword postings in memory, and by FTS5 (the postings not built: what a search did before, and
does while they are being built). Each stage is timed by wrapping the function that does it;
the table gives each stage's median over the questions, in ms of the searching thread's CPU
time (``--clock wall`` for elapsed time).
The socket, the request's checks and the reply come on top (docs/benchmarks.md has those from
a running daemon). The index is only read.

    python bench/keyword_profile.py --home DIR/size-250 [--queries 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import memd.index.reads as reads_module
import memd.search.finish
import memd.search.hits
import memd.search.keyword
from memd.index.index import Index
from memd.index.keywords import KeywordIndex
from memd.index.reads import SearchReads
from memd.search import search
from memd.search.options import SearchOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import SHARED, code_state, environment  # noqa: E402

# (label, owner, attribute): the functions a keyword search spends its time in
STAGES: list[tuple[str, Any, str]] = [
    ("document frequencies", SearchReads, "doc_freqs"),
    ("rank: the postings' top k", KeywordIndex, "top"),
    ("rank: FTS5 (bound or plain)", reads_module, "top_ranked"),
    ("read the candidates' rows", SearchReads, "chunks_by_id"),
    ("keyword candidates, in all", SearchReads, "keyword_candidates"),
    ("boost: terms found in each text", memd.search.keyword, "tokens_among"),
    ("temporal decay (file ages)", memd.search.finish, "_decay"),
    ("MMR", memd.search.finish, "_mmr"),
    ("snippet windows", memd.search.hits.Hit, "window"),
]


class Stages:
    """Each stage's time per search, for the run that is current: the stages wrapped."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.labels: list[str] = []
        self.current = ""
        self.now: dict[str, float] = defaultdict(float)
        self.runs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def wrap(self, label: str, owner: Any, name: str) -> None:
        real = getattr(owner, name)
        self.labels.append(label)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = self.clock()
            try:
                return real(*args, **kwargs)
            finally:
                self.now[label] += self.clock() - t0

        setattr(owner, name, timed)

    def done(self, total: float) -> None:
        runs = self.runs[self.current]
        runs["search, in all"].append(total * 1000)
        for label in self.labels:
            runs[label].append(self.now.get(label, 0.0) * 1000)
        self.now.clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="the searching thread's CPU time (default: what a search costs, whatever else "
        "runs on a shared machine) or wall time",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    path = next((Path(args.home) / "state" / "indexes").glob("*.sqlite"))
    qs = [json.loads(line)["question"] for line in (Path(args.data) / "qrels.jsonl").open()]
    qs = qs[: args.queries]
    options = SearchOptions(mode="keyword")
    with_postings = Index(path)  # read only: never opened for writing
    t0 = time.perf_counter()
    with_postings.keywords.build(background=False)
    built = time.perf_counter() - t0
    if not with_postings.keywords.ready:
        raise SystemExit(f"postings not built: {with_postings.keywords.error}")
    without = Index(path)  # its postings never built: FTS5 ranks
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    stages = Stages(clock)
    for label, owner, name in STAGES:
        stages.wrap(label, owner, name)
    try:
        for i, q in enumerate(qs):
            for name in ["postings", "fts5"] if i % 2 == 0 else ["fts5", "postings"]:
                stages.current = name
                index = with_postings if name == "postings" else without
                t = clock()
                search(index, q, options, embedder=None)
                stages.done(clock() - t)
        memory = with_postings.keywords.nbytes
    finally:
        with_postings.close()
        without.close()
    table = {
        name: {label: round(statistics.median(v), 3) for label, v in runs.items() if any(v)}
        for name, runs in stages.runs.items()
    }
    result = {
        **environment(),
        "code": code_state(),
        "queries": len(qs),
        "postings_build_s": round(built, 1),
        "postings_mb": round(memory / 2**20, 1),
        "clock": args.clock,
        "median_ms": table,
    }
    print(json.dumps(result, indent=2))
    labels = ["search, in all", *(label for label, _, _ in STAGES)]
    print("\n| stage (median ms) | ranked by the postings | ranked by FTS5 |")
    print("|---|---|---|")
    for label in labels:
        cells = [table[n].get(label) for n in ("postings", "fts5")]
        if any(cells):
            print(
                f"| {label} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
