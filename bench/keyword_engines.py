"""Keyword top k on one built index, every way memd could rank it, side by side.

The ways, each asked the same LoCoMo questions (as memd.search.keyword.keyword_match turns them into
MATCH expressions), taken in turn question by question so that the machine's weather falls on
all alike, in-process (the ranking alone, not the socket):

- ``fts5-plain``: FTS5 ranks every match (``ORDER BY bm25() LIMIT k``), memd before the bound;
- ``fts5-bounded``: the MaxScore bound over FTS5 (memd/index/bm25.py);
- ``fts5-match-only``: the matches enumerated without ranking: the floor of any rank function
  evaluated inside SQLite, however fast (one written in C as a loadable extension included);
- ``fts5-python-rank``: bm25 as an FTS5 auxiliary function written in Python (apsw);
- ``fts5-detail-column``, ``fts5-detail-none``: the same rows in FTS5 tables of lower detail,
  built in a scratch file (they keep no positions, so a term counts once per column: other
  scores);
- ``postings``: memd's keyword postings in memory (memd/index/postings.py);
- ``tantivy``: the Tantivy engine (its Python binding, block-max WAND) over the same tokens,
  when importable (``--tantivy-path`` names a folder it was installed into; memd does not
  depend on it). Its BM25 is its own (idf, per-field norms held in one byte), so its top k is
  compared with FTS5's as an overlap.

For each: p50/p95/mean time, how many rankings equal FTS5's plain one (the same chunks in the
same order, scores within 1e-9), the build time and memory where it builds something.

    python bench/keyword_engines.py --home DIR/size-250 [--queries 200] [--k 24]
        [--engines fts5-plain,fts5-bounded,...] [--tantivy-path DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import apsw

from memd.index import bm25
from memd.index.keywords import KeywordIndex
from memd.index.store import Store
from memd.index.termcount import fts_columns, tokenizer
from memd.search.keyword import keyword_match

sys.path.insert(0, str(Path(__file__).resolve().parent))

from socket_bench import SHARED, code_state, environment, summary  # noqa: E402

Ranker = Callable[[str, int], list[tuple[int, float]]]
ENGINES = [
    "fts5-plain",
    "fts5-bounded",
    "fts5-match-only",
    "fts5-python-rank",
    "fts5-detail-column",
    "fts5-detail-none",
    "postings",
    "tantivy",
]


def open_index(home: Path) -> apsw.Connection:
    path = next((home / "state" / "indexes").glob("*.sqlite"))
    return apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)


def python_rank(conn: apsw.Connection) -> Ranker:
    """fts5_aux.c's bm25, as an auxiliary function in Python."""

    def pybm25(api: apsw.FTS5ExtensionApi, *weights: Any) -> float:
        n = api.row_count
        avgdl = api.column_total_size(-1) / n
        d = api.column_size(-1)
        idf: list[float] | None = api.aux_data  # the phrases' idf, kept for the statement
        if idf is None:
            idf = []
            for i in range(api.phrase_count):
                hits = [0]
                api.query_phrase(i, lambda _api, h: h.__setitem__(0, h[0] + 1), hits)
                value = math.log((n - hits[0] + 0.5) / (hits[0] + 0.5))
                idf.append(value if value > 0 else 1e-6)
            api.aux_data = idf
        score = 0.0
        for i in range(api.phrase_count):
            f = sum(
                float(w) * len(o) for w, o in zip(weights, api.phrase_locations(i), strict=False)
            )
            score += idf[i] * ((f * 2.2) / (f + 1.2 * (1 - 0.75 + 0.75 * d / avgdl)))
        return -score

    conn.register_fts5_function("pybm25", pybm25)

    def rank(match: str, k: int) -> list[tuple[int, float]]:
        sql = (
            "SELECT rowid, pybm25(chunks_fts, 1.0, 1.0, 0.25) AS r FROM chunks_fts "
            "WHERE chunks_fts MATCH ? ORDER BY r, rowid LIMIT ?"
        )
        return [(int(a), float(b)) for a, b in conn.execute(sql, (match, k))]

    return rank


def detail_table(conn: apsw.Connection, detail: str, scratch: Path) -> tuple[Ranker, float]:
    """The chunks' FTS rows in a table of ``detail``, in a scratch file: its ranker, build s."""
    out = apsw.Connection(str(scratch / f"fts-{detail}.sqlite"))
    out.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(body, uni, path, content='', "
        f"contentless_delete=1, detail={detail}, "
        "tokenize='porter unicode61 remove_diacritics 2')"
    )
    t0 = time.perf_counter()
    if out.execute("SELECT count(*) FROM chunks_fts_docsize").fetchone() == (0,):
        rows = conn.execute("SELECT id, path, text FROM chunks ORDER BY id")
        out.execute("BEGIN")
        while batch := list(itertools.islice(rows, 2048)):
            out.executemany(
                "INSERT INTO chunks_fts (rowid, body, uni, path) VALUES (?, ?, ?, ?)",
                [(i, *fts_columns(p, t)) for i, p, t in batch],
            )
        out.execute("COMMIT")
    built = time.perf_counter() - t0

    def rank(match: str, k: int) -> list[tuple[int, float]]:
        return bm25._plain(out, match, k)

    return rank, built


def tantivy_engine(conn: apsw.Connection, where: str, scratch: Path) -> tuple[Ranker, float]:
    """The same tokens (FTS5's own, fed whitespace-separated) in a Tantivy index."""
    if where:
        sys.path.insert(0, where)
    tv: Any = importlib.import_module("tantivy")
    builder = tv.SchemaBuilder()
    for name in ("body", "uni", "path"):
        builder.add_text_field(name, stored=False, tokenizer_name="whitespace")
    builder.add_integer_field("id", stored=True, indexed=True, fast=True)
    schema = builder.build()
    where_to = scratch / "tantivy"
    shutil.rmtree(where_to, ignore_errors=True)
    where_to.mkdir(parents=True)
    index = tv.Index(schema, path=str(where_to))
    tok = tokenizer(conn)
    t0 = time.perf_counter()
    writer = index.writer(heap_size=200_000_000, num_threads=1)
    for i, p, t in conn.execute("SELECT id, path, text FROM chunks ORDER BY id"):
        cols = [" ".join(tokens(tok, c, apsw.FTS5_TOKENIZE_DOCUMENT)) for c in fts_columns(p, t)]
        writer.add_document(tv.Document(id=int(i), body=cols[0], uni=cols[1], path=cols[2]))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    built = time.perf_counter() - t0
    searcher = index.searcher()

    def rank(match: str, k: int) -> list[tuple[int, float]]:
        clauses = []
        for part in match.split(" OR "):
            column = "uni" if part.startswith("uni : ") else None
            text = part.split('"')[1]
            stems = tokens(tok, text, apsw.FTS5_TOKENIZE_QUERY)
            for stem in stems:
                fields = [column] if column else ["body", "uni", "path"]
                for f in fields:
                    q = tv.Query.term_query(schema, f, stem)
                    if f == "path":
                        q = tv.Query.boost_query(q, 0.25)
                    clauses.append((tv.Occur.Should, q))
        found = searcher.search(tv.Query.boolean_query(clauses), k)
        return [(int(searcher.doc(addr)["id"][0]), -float(score)) for score, addr in found.hits]

    return rank, built


def tokens(tok: apsw.FTS5Tokenizer, text: str, reason: int) -> list[str]:
    found = tok(text.encode(), reason, None, include_offsets=False, include_colocated=False)
    return [str(t) for t in found]


def read_only(home: Path) -> contextlib.closing[apsw.Connection]:
    path = str(next((home / "state" / "indexes").glob("*.sqlite")))
    return contextlib.closing(apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY))


def bounded(conn: apsw.Connection, freqs: Any, match: str, k: int) -> list[tuple[int, float]]:
    return bm25.top_ranked(conn, match, k, freqs)


def match_only(conn: apsw.Connection, match: str, k: int) -> list[tuple[int, float]]:
    """Every match enumerated in SQLite (counted: no row reaches Python), none ranked."""
    sql = "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?"
    return [(0, float(r[0])) for r in conn.execute(sql, (match,))]


def in_memory(
    keywords: KeywordIndex, conn: apsw.Connection, match: str, k: int
) -> list[tuple[int, float]]:
    return keywords.top(conn, match, k) or []


def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return [r for r, _ in a] == [r for r, _ in b] and all(
        abs(x[1] - y[1]) <= 1e-9 * abs(y[1]) for x, y in zip(a, b, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="a MEMD_HOME with one built index")
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=24)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--tantivy-path", default="")
    ap.add_argument("--scratch", default="", help="keep the scratch tables here between runs")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    home = Path(args.home)
    conn = open_index(home)
    reads = Store(conn, "none", 0).reads
    qs = [json.loads(line)["question"] for line in (Path(args.data) / "qrels.jsonl").open()]
    matches = [m for q in qs[: args.queries] if (m := keyword_match(q, reads.doc_freqs)[0])]
    wanted = [e.strip() for e in args.engines.split(",") if e.strip()]
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="memd-kw-"))
    scratch.mkdir(parents=True, exist_ok=True)
    engines: dict[str, Ranker] = {}
    built: dict[str, dict[str, Any]] = {}
    for name in wanted:
        print("preparing", name, flush=True)
        if name == "fts5-plain":
            engines[name] = partial(bm25._plain, conn)
        elif name == "fts5-bounded":
            engines[name] = partial(bounded, conn, reads.doc_freqs)
        elif name == "fts5-match-only":
            engines[name] = partial(match_only, conn)
        elif name == "fts5-python-rank":
            engines[name] = python_rank(conn)
        elif name.startswith("fts5-detail-"):
            ranker, seconds = detail_table(conn, name.rsplit("-", 1)[1], scratch)
            engines[name] = ranker
            built[name] = {"build_s": round(seconds, 1)}
        elif name == "postings":
            postings = KeywordIndex(partial(read_only, home))
            c0, t0 = time.process_time(), time.perf_counter()
            postings.build(background=False)
            if not postings.ready:
                raise SystemExit(f"postings not built: {postings.error}")
            built[name] = {
                "build_s": round(time.perf_counter() - t0, 1),
                "build_cpu_s": round(time.process_time() - c0, 1),
                "memory_mb": round(postings.nbytes / 2**20, 1),
            }
            engines[name] = partial(in_memory, postings, conn)
        elif name == "tantivy":
            try:
                ranker, seconds = tantivy_engine(conn, args.tantivy_path, scratch)
            except ImportError as exc:
                print("tantivy not importable:", exc)
                continue
            engines[name] = ranker
            built[name] = {"build_s": round(seconds, 1)}
        else:
            raise SystemExit(f"unknown engine {name}")
    times: dict[str, list[float]] = {name: [] for name in engines}
    equal = dict.fromkeys(engines, 0)
    overlap: dict[str, list[float]] = {name: [] for name in engines}
    for i, match in enumerate(matches):
        plain = bm25._plain(conn, match, args.k)
        names = list(engines)
        order = names if i % 2 == 0 else names[::-1]  # in turn, both ways round
        for name in order:
            t0 = time.perf_counter()
            got = engines[name](match, args.k)
            times[name].append((time.perf_counter() - t0) * 1000)
            equal[name] += same(got, plain)
            want = {r for r, _ in plain}
            overlap[name].append(len(want & {r for r, _ in got}) / max(1, len(want)))
    result: dict[str, Any] = {
        **environment(),
        "code": code_state(),
        "index": str(next((home / "state" / "indexes").glob("*.sqlite")).name),
        "chunks": int((conn.execute("SELECT count(*) FROM chunks").fetchone() or (0,))[0]),
        "queries": len(matches),
        "k": args.k,
        "engines": {
            name: {
                **summary(times[name]),
                "same_ranking": equal[name],
                "overlap_at_k": round(statistics.fmean(overlap[name]), 4),
                **built.get(name, {}),
            }
            for name in engines
        },
    }
    print(json.dumps(result, indent=2))
    print(f"\n{result['chunks']:,} chunks, {len(matches)} questions, k = {args.k}\n")
    print("| engine | p50 · p95 · mean (ms) | same ranking as FTS5 | overlap of top k | built |")
    print("|---|---|---|---|---|")
    for name, fig in result["engines"].items():
        build = (
            f"{fig['build_s']} s" + (f", {fig['memory_mb']} MB" if "memory_mb" in fig else "")
            if "build_s" in fig
            else "-"
        )
        print(
            f"| {name} | {fig['p50_ms']} · {fig['p95_ms']} · {fig['mean_ms']} | "
            f"{fig['same_ranking']} of {len(matches)} | {fig['overlap_at_k']} | {build} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
