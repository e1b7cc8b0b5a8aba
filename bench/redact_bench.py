"""What redaction costs per megabyte of notes, on three kinds of text.

- ``notes``: the LoCoMo dev conversations (../shared/data/locomo-dev), ordinary prose: most
  blocks hold none of the rules' literals and are let through by their needles;
- ``worst``: 20,000 varied lines that each say "password", "token" or "key" and hold no
  secret, so that every rule that looks for those words runs on every line;
- ``secrets``: the hostile corpora's lines (tests/hostile/secrets*.txt), which all redact.

Each text is redacted whole, in-process, with the block memory cleared before every run (a
first index, not an append); the figure is the median of ``--reps`` runs. To set two codes side
by side, run the script with each on PYTHONPATH, alternating:

    PYTHONPATH=OLD_CHECKOUT:OLD_CHECKOUT/client python bench/redact_bench.py --json a.json
    python bench/redact_bench.py --json b.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import memd
from memd.redact import engine, redact

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def worst_case(lines: int = 20_000) -> str:
    rng = random.Random(7)
    subjects = ("password", "token", "API key", "secret", "passphrase", "session key")
    verbs = ("is rotated every", "must be changed after", "expires in", "was reset on")
    out = []
    for i in range(lines):
        s, v = rng.choice(subjects), rng.choice(verbs)
        out.append(f"- The {s} for service {i} {v} {rng.randint(2, 90)} days; see the runbook.")
    return "\n".join(out) + "\n"


def texts() -> dict[str, str]:
    notes = sorted((SHARED / "data" / "locomo-dev").rglob("*.md"))
    hostile = ROOT / "tests" / "hostile"
    corpus = [
        line[2:].split("\t")[0].replace("\\n", "\n")
        for name in ("secrets.txt", "secrets_families.txt")
        for line in (hostile / name).read_text(encoding="utf-8").splitlines()
        if line.startswith("+ ")
    ]
    return {
        "notes": "\n".join(p.read_text(encoding="utf-8") for p in notes),
        "worst": worst_case(),
        "secrets": "\n\n".join(corpus) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    report: dict[str, object] = {"code": str(Path(memd.__file__).resolve().parent.parent)}
    for name, text in texts().items():
        runs = []
        for _ in range(args.reps):
            engine._MEMO.clear()
            t = time.perf_counter()
            redact(text)
            runs.append(time.perf_counter() - t)
        mb = len(text.encode()) / 1e6
        median = statistics.median(runs)
        report[name] = {
            "mb": round(mb, 3),
            "ms": round(median * 1000, 1),
            "mb_s": round(mb / median, 2),
        }
        print(f"{name:8} {mb:6.2f} MB  {median * 1000:8.1f} ms  {mb / median:6.2f} MB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
