"""The redaction corpus (tests/hostile/secrets.txt): real secret formats go, prose stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from memd.redact import MARK, redact

CORPUS = Path(__file__).with_name("hostile") / "secrets.txt"


def entries(kind: str) -> list[tuple[str, str]]:
    out = []
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if raw.startswith(kind + " "):
            line, _, secret = raw[2:].partition("\t")
            out.append((line.replace("\\n", "\n"), secret))
    return out


@pytest.mark.parametrize(("line", "secret"), entries("+"))
def test_secret_formats_are_redacted_whole(line: str, secret: str) -> None:
    out = redact(line)
    assert secret not in out, out
    assert MARK in out
    assert out.count("\n") == line.count("\n"), "line structure is kept"
    assert redact(out) == out, "idempotent"


@pytest.mark.parametrize("line", [line for line, _ in entries("-")])
def test_ordinary_lines_stay_intact(line: str) -> None:
    assert redact(line) == line


def test_the_corpus_is_large_enough_to_mean_something() -> None:
    assert len(entries("+")) >= 30 and len(entries("-")) >= 15
