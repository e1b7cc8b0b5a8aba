"""The redaction corpora (tests/hostile/secrets*.txt): real secret formats, grouped by family, go;
ordinary notes, prose, Markdown and code stay as they are, byte for byte."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from memd.redact import MARK, redact
from memd.redact.prefixes import TABLE

HOSTILE = Path(__file__).with_name("hostile")
FINDINGS = HOSTILE / "secrets.txt"  # one line per earlier finding: "+ LINE\tSECRET", "- LINE"
FAMILIES = HOSTILE / "secrets_families.txt"  # "## family: ..." then "+ LINE\tSECRET[\tSECRET...]"
ORDINARY = HOSTILE / "secrets_ordinary.txt"  # a document of ordinary notes, kept whole
# Real conversation notes (not in the repository), next to the checkout when present.
LOCOMO = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo-dev"


def positives() -> list[tuple[str, str, list[str]]]:
    """(family, line, secrets) of both corpora; `\\n` in a line is a newline."""
    out: list[tuple[str, str, list[str]]] = []
    family = "finding"
    for path in (FINDINGS, FAMILIES):
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.startswith("## "):
                family = raw[3:].split(":", 1)[0]
            elif raw.startswith("+ "):
                line, *secrets = raw[2:].split("\t")
                out.append((family, line.replace("\\n", "\n"), secrets))
    return out


POSITIVES = positives()


@pytest.mark.parametrize(
    ("family", "line", "secrets"),
    POSITIVES,
    ids=[f"{family}-{i}" for i, (family, _, _) in enumerate(POSITIVES)],
)
def test_secret_formats_are_redacted_whole(family: str, line: str, secrets: list[str]) -> None:
    assert secrets and all(s in line for s in secrets), "a corpus line holds what it hides"
    out = redact(line)
    for secret in secrets:
        assert secret not in out, out
    assert MARK in out
    assert out.count("\n") == line.count("\n"), "line structure is kept"
    assert redact(out) == out, "idempotent"


def test_every_family_is_represented() -> None:
    counts = Counter(family for family, _, _ in POSITIVES)
    families = ("name", "flag", "url", "prefix", "armour", "entropy", "split")
    assert all(counts[f] >= 10 for f in families), counts


def test_every_prefix_in_the_table_has_a_corpus_line() -> None:
    """The table of prefixes is only as good as its examples: each row redacts one of them."""
    lines = [line for _, line, _ in POSITIVES]
    for prefix, body, _ in TABLE:
        pattern = re.compile(rf"(?<![A-Za-z0-9_-]){prefix}{body}")
        assert any(pattern.search(line) for line in lines), prefix


@pytest.mark.parametrize(
    "line", [raw[2:] for raw in FINDINGS.read_text().splitlines() if raw[:2] == "- "]
)
def test_ordinary_lines_stay_intact(line: str) -> None:
    assert redact(line) == line


def test_ordinary_notes_come_back_unchanged() -> None:
    """Prose about passwords and tokens, hashes, UUIDs, base64 images, paths, URLs with
    ordinary query strings, tables, code: as a whole document and line by line."""
    text = ORDINARY.read_text(encoding="utf-8")
    assert len(text.splitlines()) >= 150
    changed = [
        (a, b) for a, b in zip(text.splitlines(), redact(text).splitlines(), strict=True) if a != b
    ]
    assert changed == []
    assert [line for line in text.splitlines() if redact(line) != line] == []


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo dev notes are not next to this checkout")
def test_locomo_notes_lose_nothing() -> None:
    changed = []
    for path in sorted(LOCOMO.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for before, after in zip(text.splitlines(), redact(text).splitlines(), strict=True):
            if before != after:
                changed.append((path.name, before, after))
    assert changed == []
