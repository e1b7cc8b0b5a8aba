"""Line vectors from the chunk's own pass ("late chunking") against lines embedded on their own.

Today each chunk is embedded whole and each of its vector lines (memd.index.chunk.vector_lines)
once more as a text of its own. Late chunking embeds each chunk once with per-token outputs
(llama.cpp pooling NONE) and mean-pools the tokens: all of them for the chunk's vector, a line's
span for the line's vector. The chunk's token sequence is built line by line (the model's
leading special tokens and document prefix, each line tokenized alone, the trailing special
tokens), so every line's span is exact. Variants:

- ``separate``: today's index, lines embedded as texts of their own (the baseline);
- ``chunks``: no line vectors at all, the floor both ways of making them should clear;
- ``late``: a line's vector is the mean of its own tokens;
- ``late+ctxW``: the line's mean plus W times the means of the lines before and after it;
- ``late-cC``: the line's mean less C times the chunk's mean (what all its lines share).

Each LoCoMo dev conversation is indexed in-process by memd's own Syncer; a late variant only
replaces the step that turns chunks into vectors (``ChunkEmbedding._chunk_vectors``, patched
here, for the duration of the build). Every question goes through memd's own search(), hybrid
and vector-only, scored as ../shared/bench/locomo_score.py does (a hit at k when an evidence
line lies inside one of the top k results): R@1/5/10 and MRR, overall and per category, on the
tuning split (26, 30, 41) and the held-out split (42, 43), which plays no part in choosing a
constant. Also counted: texts and tokens a first index embeds, and the seconds it takes.

The model's outputs are computed once and kept in ``--store`` (a pickle); later runs only
index and search. Run with::

    PYTHONPATH=.:client python bench/late_study.py --model MODEL.gguf \\
        --store late-minilm.pickle --json bench/results/late-study-MODEL.json
"""

from __future__ import annotations

import argparse
import collections
import json
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from memd.config import IndexConfig
from memd.embed.base import Embedder, Kind, Vectors, normalize
from memd.embed.llama import LlamaEmbedder
from memd.index.chunk import _split_lines, vector_lines
from memd.index.embedding import ChunkEmbedding
from memd.index.index import Index
from memd.index.report import SyncReport
from memd.index.sync import Syncer
from memd.search import search
from memd.search.options import SearchOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import SHARED, code_state, environment  # noqa: E402  (a sibling script)

TUNE = ("26", "30", "41")
HOLD = ("42", "43")
KS = (1, 5, 10)
CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}
K = TypeVar("K")


@dataclass(frozen=True)
class Variant:
    late: bool
    lines: bool = True  # False: chunk vectors only, no line vectors at all
    context: float = 0.0  # share of each neighbouring line's mean added to a line's
    centre: float = 0.0  # share of the chunk's mean taken from a line's


VARIANTS = {
    "separate": Variant(late=False),
    "chunks": Variant(late=False, lines=False),
    "late": Variant(late=True),
    "late+ctx0.25": Variant(late=True, context=0.25),
    "late+ctx0.5": Variant(late=True, context=0.5),
    "late+ctx1": Variant(late=True, context=1.0),
    "late-c0.5": Variant(late=True, centre=0.5),
    "late-c0.75": Variant(late=True, centre=0.75),
    "late+ctx0.5-c0.5": Variant(late=True, context=0.5, centre=0.5),
}


@dataclass
class Pass:
    """One pass of the model over a chunk: its token vectors summed per line (every line of
    the chunk, in order), and over the whole sequence (special tokens and prefix included)."""

    sums: np.ndarray[Any, np.dtype[np.float32]]  # (lines, dims)
    counts: np.ndarray[Any, np.dtype[np.int64]]  # (lines,)
    total: np.ndarray[Any, np.dtype[np.float32]]  # (dims,)
    tokens: int


class TokenModel:
    """The same GGUF loaded with pooling NONE: one vector per token of a chunk's sequence."""

    def __init__(self, path: str, prefix: str, threads: int) -> None:
        import llama_cpp

        self.llama_cpp: Any = llama_cpp
        meta_ctx = LlamaEmbedder(path).max_tokens
        self.llm: Any = llama_cpp.Llama(
            model_path=path,
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
            verbose=False,
            n_ctx=meta_ctx,
            n_batch=meta_ctx,
            n_ubatch=meta_ctx,
            n_threads=threads,
            n_threads_batch=threads,
        )
        self.n_ctx = meta_ctx
        self.dims = int(self.llm.n_embd())
        # The special tokens around a text: those before and after its own.
        bare = self._tok("x", special=False)
        full = self._tok("x", special=True)
        at = next(i for i in range(len(full)) if full[i : i + len(bare)] == bare)
        self.lead = full[:at] + self._tok(prefix, special=False)
        self.trail = full[at + len(bare) :]

    def _tok(self, text: str, *, special: bool) -> list[int]:
        if not text:
            return []
        data = text.encode("utf-8", "surrogatepass")
        return list(self.llm.tokenize(data, add_bos=special, special=False))

    def run(self, text: str) -> Pass:
        """Decode the chunk once; pool each line's span."""
        lines = _split_lines(text)
        spans = [self._tok(line, special=False) for line in lines]
        seq = self.lead + [t for s in spans for t in s] + self.trail
        if len(seq) > self.n_ctx:
            raise ValueError(f"{len(seq)} tokens exceed the context of {self.n_ctx}")
        llm = self.llm
        llm._batch.reset()
        llm._batch.add_sequence(seq, 0, True)
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        ptr = self.llama_cpp.llama_get_embeddings(llm._ctx.ctx)
        out = np.ctypeslib.as_array(ptr, shape=(len(seq), self.dims)).astype(np.float32)
        llm._batch.reset()
        sums = np.zeros((len(lines), self.dims), dtype=np.float32)
        at = len(self.lead)
        for i, span in enumerate(spans):
            sums[i] = out[at : at + len(span)].sum(axis=0)
            at += len(span)
        counts = np.array([len(s) for s in spans], dtype=np.int64)
        return Pass(sums, counts, out.sum(axis=0), len(seq))

    def close(self) -> None:
        self.llm.close()


def line_numbers(text: str) -> list[int]:
    """Indices (into the chunk's lines) of the lines vector_lines gives vectors, in order."""
    lines = _split_lines(text)
    at = [
        i
        for i, line in enumerate(lines)
        if len(line.strip()) > 3 and not line.lstrip().startswith("#")
    ]
    at = at if len(at) >= 2 else []
    assert [lines[i] for i in at] == [t for t, _ in vector_lines(text)]
    return at


def late_vectors(text: str, passed: Pass, variant: Variant) -> tuple[Vectors, Vectors | None]:
    """A chunk's vector and its vector lines' vectors (None when it has none), from one pass."""
    chunk = normalize(passed.total / passed.tokens)[0]
    at = line_numbers(text)
    if not at:
        return chunk, None
    means = passed.sums / np.maximum(passed.counts, 1)[:, None]
    own = means[at].astype(np.float64)
    if variant.context:
        for row, i in enumerate(at):
            for j in (i - 1, i + 1):
                if 0 <= j < len(means) and passed.counts[j]:
                    own[row] += variant.context * means[j]
    if variant.centre:
        own -= variant.centre * (passed.total / passed.tokens)
    return chunk, normalize(own)


class Stored(Embedder):
    """memd's LlamaEmbedder with its outputs kept (``store``), and the model's chunk passes
    for the late variants. Counts what a first index sends: each distinct text once."""

    def __init__(self, real: LlamaEmbedder, tokens: TokenModel, store: dict[str, Any]) -> None:
        self.real, self.tokens, self.store = real, tokens, store
        self.provider, self.model, self.dims = real.provider, real.model, real.dims
        self.max_tokens, self.batch_size = real.max_tokens, real.batch_size
        self.sent = collections.Counter[str]()
        self._seen: set[str] = set()
        for key in ("document", "query", "counts", "passes", "seconds"):
            store.setdefault(key, {})

    def settings(self) -> dict[str, object]:
        return self.real.settings()

    def count_tokens(self, text: str) -> int:
        memo = self.store["counts"]
        if text not in memo:
            memo[text] = self.real.count_tokens(text)
        return int(memo[text])

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        memo = self.store[kind]
        missing = [t for t in dict.fromkeys(texts) if t not in memo]
        if missing:
            t0 = time.perf_counter()
            memo.update(zip(missing, self.real.embed_batch(missing, kind=kind), strict=True))
            self.store["seconds"][kind] = self.store["seconds"].get(kind, 0.0) + (
                time.perf_counter() - t0
            )
        if kind == "document":
            for text in texts:
                if text not in self._seen:
                    self._seen.add(text)
                    self.sent["texts"] += 1
                    self.sent["tokens"] += self.count_tokens(text)
        return np.stack([memo[t] for t in texts])

    def chunk_pass(self, text: str) -> Pass:
        memo = self.store["passes"]
        if text not in memo:
            t0 = time.perf_counter()
            memo[text] = self.tokens.run(text)
            self.store["seconds"]["late"] = self.store["seconds"].get("late", 0.0) + (
                time.perf_counter() - t0
            )
        passed: Pass = memo[text]
        if text not in self._seen:
            self._seen.add(text)
            self.sent["texts"] += 1
            self.sent["tokens"] += passed.tokens
        return passed


@contextmanager
def late_chunking(embedder: Stored, variant: Variant) -> Iterator[None]:
    """Have every Syncer make chunk and line vectors from one pass over each chunk."""

    def chunk_vectors(
        self: ChunkEmbedding,
        e: Embedder,
        chunks: list[tuple[K, str, str]],
        report: SyncReport,
        *,
        embed: bool,
        max_chars: int | None = None,
    ) -> dict[K, tuple[Vectors, Vectors | None]]:
        if not embed:
            return {}
        out = {}
        for key, _, text in chunks:
            out[key] = late_vectors(text, embedder.chunk_pass(text), variant)
            report.embedded += 1
        return out

    old = ChunkEmbedding._chunk_vectors
    ChunkEmbedding._chunk_vectors = chunk_vectors  # type: ignore[method-assign]
    try:
        yield
    finally:
        ChunkEmbedding._chunk_vectors = old  # type: ignore[method-assign]


def build(
    data: Path, convs: Sequence[str], home: Path, embedder: Stored, *, lines: bool = True
) -> dict[str, Index]:
    config = IndexConfig(line_vectors=lines)
    indexes = {}
    for conv in convs:
        index = Index(home / f"{conv}.sqlite", use_vec=False)
        index.open()
        report = Syncer(index, data / conv, config=config, embedder=embedder).sync()
        if report.errors:
            raise SystemExit(f"{conv}: {report.errors}")
        indexes[conv] = index
    return indexes


Got = dict[str, list[tuple[str, int, int]]]


def ask(indexes: dict[str, Index], embedder: Stored, qrels: list[dict[str, Any]], mode: str) -> Got:
    options = SearchOptions(mode=mode, max_results=10)  # type: ignore[arg-type]
    got = {}
    for q in qrels:
        outcome = search(indexes[q["conv"]], q["question"], options, embedder=embedder)
        got[q["qid"]] = [(h.path, h.start_line, h.end_line) for h in outcome.results]
    return got


def score(qrels: list[dict[str, Any]], got: Got) -> dict[str, Any]:
    """As locomo_score.py: R@k (some evidence line inside one of the top k) and MRR."""
    hits = collections.Counter[int]()
    cats: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    rr = 0.0
    for q in qrels:
        first = next(
            (
                i
                for i, (path, start, end) in enumerate(got[q["qid"]])
                if any(e["path"] == path and start <= e["line"] <= end for e in q["evidence"])
            ),
            None,
        )
        cat = cats[str(q["category"])]
        cat["n"] += 1
        if first is not None:
            rr += 1 / (first + 1)
            cat["rr"] += 1 / (first + 1)  # type: ignore[assignment]
        for k in KS:
            if first is not None and first < k:
                hits[k] += 1
                cat[f"R@{k}"] += 1
    n = max(1, len(qrels))
    return {
        "questions": len(qrels),
        **{f"R@{k}": round(hits[k] / n, 4) for k in KS},
        "MRR": round(rr / n, 4),
        "by_category": {
            c: {
                "n": v["n"],
                **{f"R@{k}": round(v[f"R@{k}"] / v["n"], 4) for k in KS},
                "MRR": round(v["rr"] / v["n"], 4),
            }
            for c, v in sorted(cats.items())
        },
        "hits": {q["qid"]: _rank(q, got) for q in qrels},
    }


def _rank(q: dict[str, Any], got: Got) -> int:
    """Rank (1-based) of the first result holding an evidence line; 0 when none does."""
    for i, (path, start, end) in enumerate(got[q["qid"]]):
        if any(e["path"] == path and start <= e["line"] <= end for e in q["evidence"]):
            return i + 1
    return 0


def paired(a: dict[str, int], b: dict[str, int], k: int) -> dict[str, int]:
    """Questions found in the top k by one method and not the other (for a sign test)."""
    win = sum(1 for q in a if 0 < a[q] <= k and not 0 < b[q] <= k)
    lose = sum(1 for q in a if 0 < b[q] <= k and not 0 < a[q] <= k)
    return {"better": win, "worse": lose}


def embed_seconds(real: LlamaEmbedder, texts: list[str]) -> float:
    """What embedding ``texts`` takes with memd's own embedder, in its batches."""
    t0 = time.perf_counter()
    for start in range(0, len(texts), real.batch_size):
        real.embed_batch(texts[start : start + real.batch_size])
    return time.perf_counter() - t0


def timed_sample(
    real: LlamaEmbedder, tokens: TokenModel, chunks: list[str], rounds: int
) -> dict[str, Any]:
    """The three ways over the same chunks, interleaved round by round (the machine's other
    load falls on all three alike); the fastest round of each, in seconds."""
    lines = [line for text in chunks for line, _ in vector_lines(text)]
    best: dict[str, float] = {}
    for _ in range(rounds):
        timings = {
            "separate": embed_seconds(real, chunks + lines),
            "late": _timed(lambda: [tokens.run(t) for t in chunks]),
            "chunks only": embed_seconds(real, chunks),
        }
        for name, seconds in timings.items():
            best[name] = round(min(best.get(name, seconds), seconds), 2)
    return {"chunks": len(chunks), "lines": len(lines), "rounds": rounds, "seconds": best}


def _timed(work: Any) -> float:
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--store", required=True, help="the model's outputs, kept between runs")
    ap.add_argument("--data", default=str(SHARED / "data" / "locomo-dev"))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--modes", default="hybrid,vector")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sample", type=int, default=40, help="chunks timed three ways")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    data = Path(args.data)
    qrels = [json.loads(line) for line in (data / "qrels.jsonl").open()]
    convs = sorted({q["conv"] for q in qrels})
    store_path = Path(args.store)
    store: dict[str, Any] = pickle.loads(store_path.read_bytes()) if store_path.is_file() else {}
    real = LlamaEmbedder(args.model, threads=args.threads)
    tokens = TokenModel(args.model, real.prefixes.document, args.threads)
    splits = {
        "tune": [q for q in qrels if q["conv"] in TUNE],
        "hold": [q for q in qrels if q["conv"] in HOLD],
    }
    table: dict[str, Any] = {}
    sent: dict[str, dict[str, int]] = {}
    try:
        for name in args.variants.split(","):
            variant = VARIANTS[name]
            embedder = Stored(real, tokens, store)
            home = Path(tempfile.mkdtemp(prefix="memd-late-"))
            try:
                if variant.late:
                    with late_chunking(embedder, variant):
                        indexes = build(data, convs, home, embedder)
                else:
                    indexes = build(data, convs, home, embedder, lines=variant.lines)
                sent[name] = dict(embedder.sent)
                for mode in args.modes.split(","):
                    got = ask(indexes, embedder, qrels, mode)
                    table[f"{name} {mode}"] = {s: score(qs, got) for s, qs in splits.items()}
                for index in indexes.values():
                    index.close()
            finally:
                shutil.rmtree(home, ignore_errors=True)
                store_path.write_bytes(pickle.dumps(store))
            print(f"{name}: {sent[name]}", file=sys.stderr, flush=True)
        chunks = sorted(store["passes"])
        costs = {
            "separate": {
                **sent.get("separate", {}),
                "seconds": round(store["seconds"].get("document", 0.0), 2),
            },
            "late": {
                **sent.get("late", {}),
                "seconds": round(store["seconds"].get("late", 0.0), 2),
            },
            "chunks only (no line vectors)": {
                "texts": len(chunks),
                "tokens": sum(embedder.count_tokens(t) for t in chunks),
            },
        }
        sample = chunks[:: max(1, len(chunks) // args.sample)][: args.sample]
        timing = timed_sample(real, tokens, sample, args.rounds) if args.sample else {}
    finally:
        real.close()
        tokens.close()
    for name in list(table):
        base = table.get("separate " + name.split(" ")[1])
        if base is None:
            continue
        for s in splits:
            table[name][s]["vs separate"] = {
                f"R@{k}": paired(table[name][s]["hits"], base[s]["hits"], k) for k in (1, 5)
            }
    show(table, costs, splits)
    print(f"timed sample: {timing}")
    if args.json:
        for row in table.values():
            for s in splits:
                row[s].pop("hits")
        result = {
            "benchmark": "late_study",
            "model": Path(args.model).name,
            "data": "locomo-dev",
            "splits": {"tune": TUNE, "hold": HOLD},
            "categories": CATEGORIES,
            "variants": {k: vars(v) for k, v in VARIANTS.items()},
            "cost (first index, 5 conversations)": costs,
            "timed sample (interleaved)": timing,
            "results": table,
            "environment": environment(),
            "code": code_state(),
        }
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def show(table: dict[str, Any], costs: dict[str, Any], splits: dict[str, Any]) -> None:
    cols = [(s, m) for s in splits for m in ("R@1", "R@5", "R@10", "MRR")]
    print(f"{'variant':<26}" + "".join(f"{s + ' ' + m:>11}" for s, m in cols) + "  cat3 R@5")
    for name, row in table.items():
        cells = "".join(f"{row[s][m]:>11.3f}" for s, m in cols)
        cat3 = " ".join(f"{row[s]['by_category'].get('3', {}).get('R@5', 0):.3f}" for s in splits)
        print(f"{name:<26}{cells}  {cat3}")
    for name, cost in costs.items():
        print(f"{name}: {cost}")


if __name__ == "__main__":
    sys.exit(main())
