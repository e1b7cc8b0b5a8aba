"""When two memory snippets are the same fact: the study behind dreaming's cosine merge threshold.

Reads hand-written pairs of daily-log lines (bench/dedupe_pairs.json: paraphrases of one fact,
and hard non-paraphrases that share a topic and most words but state a different fact), embeds
both sides with a GGUF model in memd's worker process, and scores the merge rule
"token Jaccard >= 0.9 OR cosine >= t" for t from 0.70 to 0.98: true merges, false merges,
precision, and recall over the paraphrase pairs, next to Jaccard >= 0.9 alone. The recommended
t is the lowest one on the grid that adds no false merge to Jaccard's own.

    python bench/dedupe_study.py [--model GGUF] [--pairs JSON] [--json [OUT]]

The prefixes default to the model's own (memd reads them from the GGUF metadata: "passage: " and
"query: " for e5); --document-prefix and --query-prefix override them. --json alone
prints JSON instead of the table; --json OUT writes it to OUT as well as printing the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memd.dreams.similar import facts_agree
from memd.embed.process import ProcessEmbedder
from memd.text import mmr_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from socket_bench import SHARED  # noqa: E402  (a sibling script)

JACCARD = 0.9  # dreaming's token-Jaccard merge threshold
THRESHOLDS = [round(0.70 + 0.02 * i, 2) for i in range(15)]  # 0.70 … 0.98


@dataclass
class Pair:
    a: str
    b: str
    same: bool
    kind: str
    jaccard: float = 0.0
    cosine: float = 0.0


@dataclass
class Row:
    rule: str
    true_merges: int
    false_merges: int
    precision: float | None  # None when the rule merges nothing
    recall: float


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def load(path: Path) -> list[Pair]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [Pair(p["a"], p["b"], bool(p["same"]), str(p.get("kind", ""))) for p in data["pairs"]]


def score(pairs: list[Pair], embedder: ProcessEmbedder) -> None:
    """Fill in every pair's Jaccard over mmr_tokens and the cosine of its two embeddings."""
    vecs = embedder.embed_batch([t for p in pairs for t in (p.a, p.b)], kind="document")
    for i, p in enumerate(pairs):
        p.jaccard = jaccard(mmr_tokens(p.a), mmr_tokens(p.b))
        p.cosine = float(np.dot(vecs[2 * i], vecs[2 * i + 1]))


def evaluate(rule: str, pairs: list[Pair], merged: list[bool]) -> Row:
    true = sum(1 for p, m in zip(pairs, merged) if m and p.same)
    false = sum(1 for p, m in zip(pairs, merged) if m and not p.same)
    positives = sum(1 for p in pairs if p.same)
    return Row(
        rule,
        true,
        false,
        true / (true + false) if true + false else None,
        true / positives if positives else 0.0,
    )


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": float(np.min(values)),
        "median": float(np.median(values)),
        "max": float(np.max(values)),
    }


def study(pairs: list[Pair]) -> dict[str, Any]:
    by_jaccard = [p.jaccard >= JACCARD for p in pairs]
    rows = [evaluate(f"jaccard>={JACCARD}", pairs, by_jaccard)]
    for t in THRESHOLDS:
        merged = [j or p.cosine >= t for j, p in zip(by_jaccard, pairs)]
        rows.append(evaluate(f"jaccard>={JACCARD} or cos>={t:.2f}", pairs, merged))
    # memd's rule: meaning merges only texts that agree on numbers, names, days and polarity.
    agree = [facts_agree(p.a, p.b) for p in pairs]
    guarded = []
    for t in THRESHOLDS:
        merged = [j or (p.cosine >= t and ok) for j, p, ok in zip(by_jaccard, pairs, agree)]
        guarded.append(evaluate(f"jaccard>={JACCARD} or (cos>={t:.2f} and facts)", pairs, merged))
    rows += guarded
    base_false = rows[0].false_merges
    clean = [(t, r) for t, r in zip(THRESHOLDS, guarded) if r.false_merges == base_false]
    clean.sort(key=lambda tr: (-tr[1].recall, -tr[0]))
    same = [p.cosine for p in pairs if p.same]
    other = [p.cosine for p in pairs if not p.same]
    # Off the grid: cosine must exceed every non-paraphrase cosine Jaccard does not already merge.
    bar = max((p.cosine for p in pairs if not p.same and p.jaccard < JACCARD), default=-1.0)
    above = evaluate(
        f"jaccard>={JACCARD} or cos>{bar:.4f}",
        pairs,
        [j or p.cosine > bar for j, p in zip(by_jaccard, pairs)],
    )
    return {
        "pairs": len(pairs),
        "same": len(same),
        "not_same": len(other),
        "rows": [asdict(r) for r in rows],
        "cosine_same": spread(same),
        "cosine_not_same": spread(other),
        # The guarded t with the best recall that adds no false merge to Jaccard's (highest t
        # among equals; None: every t adds one).
        "recommended": (
            {"threshold": clean[0][0], "recall": clean[0][1].recall, **asdict(clean[0][1])}
            if clean
            else None
        ),
        # The exact bar: the highest non-paraphrase cosine, and what merging strictly above it buys.
        "exact": {"above": bar, **asdict(above)},
        "jaccard_false_merges": [asdict(p) for p in pairs if p.jaccard >= JACCARD and not p.same],
        "hardest_not_same": [
            asdict(p) for p in sorted((p for p in pairs if not p.same), key=lambda p: -p.cosine)
        ][:5],
        "hardest_same": [
            asdict(p) for p in sorted((p for p in pairs if p.same), key=lambda p: p.cosine)
        ][:5],
    }


def show(model: str, result: dict[str, Any]) -> None:
    print(
        f"model {Path(model).name}: {result['pairs']} pairs, "
        f"{result['same']} same, {result['not_same']} not same, "
        f"document prefix {result['prefixes']['document']!r}"
    )
    print(f"{'rule':<30}{'true':>6}{'false':>7}{'precision':>11}{'recall':>9}")
    for r in result["rows"]:
        precision = "-" if r["precision"] is None else f"{r['precision']:.4f}"
        print(
            f"{r['rule']:<30}{r['true_merges']:>6}{r['false_merges']:>7}"
            f"{precision:>11}{r['recall']:>9.4f}"
        )
    print()
    for name in ("same", "not_same"):
        s = result[f"cosine_{name}"]
        print(f"cosine {name:<9} min {s['min']:.4f}  median {s['median']:.4f}  max {s['max']:.4f}")
    print()
    for p in result["jaccard_false_merges"]:
        print(f"jaccard alone merges [{p['kind']}] {p['a']!r} / {p['b']!r} ({p['jaccard']:.4f})")
    print("highest-cosine non-paraphrases:")
    for p in result["hardest_not_same"]:
        print(f"  {p['cosine']:.4f}  [{p['kind']}] {p['a']!r} / {p['b']!r}")
    print("lowest-cosine paraphrases:")
    for p in result["hardest_same"]:
        print(f"  {p['cosine']:.4f}  [{p['kind']}] {p['a']!r} / {p['b']!r}")
    exact = result["exact"]
    print(
        f"\nno added false merge needs cos > {exact['above']:.4f}: "
        f"{exact['true_merges']}/{result['same']} paraphrases merged "
        f"(recall {exact['recall']:.4f}), {exact['false_merges']} false merges"
    )
    rec = result["recommended"]
    if rec is None:
        print("no threshold on the grid avoids a cosine false merge")
    else:
        print(
            f"recommended cosine threshold {rec['threshold']:.2f}: "
            f"{rec['true_merges']}/{result['same']} paraphrases merged "
            f"(recall {rec['recall']:.4f}), {rec['false_merges']} false merges"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2.Q8_0.gguf"))
    ap.add_argument("--pairs", default=str(Path(__file__).resolve().parent / "dedupe_pairs.json"))
    ap.add_argument("--document-prefix", default=None, help="default: the model's own")
    ap.add_argument("--query-prefix", default=None, help="default: the model's own")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--json", nargs="?", const="-", default="", help="print JSON (alone) or write it to OUT"
    )
    args = ap.parse_args(argv)
    pairs = load(Path(args.pairs))
    embedder = ProcessEmbedder(
        args.model,
        threads=args.threads,
        document_prefix=args.document_prefix,
        query_prefix=args.query_prefix,
    )
    prefixes = {"document": embedder.prefixes.document, "query": embedder.prefixes.query}
    try:
        score(pairs, embedder)
    finally:
        embedder.close()
    result = {"model": args.model, "prefixes": prefixes, **study(pairs)}
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
    else:
        show(args.model, result)
        if args.json:
            Path(args.json).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
