"""The redaction corpora (tests/hostile/secrets*.txt): real secret formats, grouped by family, go;
ordinary notes, prose, Markdown and code stay as they are, byte for byte."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

import memd_client
from memd.config import Config
from memd.redact import MARK, redact
from memd.redact.prefixes import TABLE

from .daemon_fixture import running_daemon

HOSTILE = Path(__file__).with_name("hostile")
FINDINGS = HOSTILE / "secrets.txt"  # one line per earlier finding: "+ LINE\tSECRET", "- LINE"
FAMILIES = HOSTILE / "secrets_families.txt"  # "## family: ..." then "+ LINE\tSECRET[\tSECRET...]"
ORDINARY = HOSTILE / "secrets_ordinary.txt"  # a document of ordinary notes, kept whole
# Real conversation notes (not in the repository), next to the checkout when present.
LOCOMO = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo-dev"


def _unescape(line: str) -> str:
    """`\\n` is a newline and `\\\\` a backslash (JSON's own `\\n` is written `\\\\n`)."""
    return re.sub(r"\\([\\n])", lambda m: "\n" if m.group(1) == "n" else "\\", line)


def positives() -> list[tuple[str, str, list[str]]]:
    """(family, line, secrets) of both corpora, unescaped."""
    out: list[tuple[str, str, list[str]]] = []
    family = "finding"
    for path in (FINDINGS, FAMILIES):
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.startswith("## "):
                family = raw[3:].split(":", 1)[0]
            elif raw.startswith("+ "):
                line, *secrets = raw[2:].split("\t")
                out.append((family, _unescape(line), secrets))
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
    families = ("name", "flag", "url", "prefix", "armour", "entropy", "split", "language")
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


def _traces(secret: str, line: str) -> list[bytes]:
    """What of `secret` an index could hold: itself, and its longest word as FTS5 keeps it.
    A secret of a few characters is looked for with what stands before it (its line's text,
    or the mark of a redacted neighbour): alone, vector bytes hold "&3" or "123" by chance."""
    word = max(re.findall(r"[A-Za-z0-9]+", secret), key=len)
    if len(secret) >= 8:
        return [secret.encode(), *([word.lower().encode()] if len(word) >= 8 else [])]
    before = line[: line.index(secret)][-8:]
    return [(before + secret).encode(), (MARK + secret).encode()]


def test_no_corpus_secret_reaches_the_index_snippets_or_a_transcript_get(tmp_path: Path) -> None:
    """Through a real daemon: every corpus line as a memory file's paragraph and as a transcript
    message (whose text is one line per message once rendered: it is redacted before that)."""
    root, sessions = tmp_path / "agent", tmp_path / "sessions"
    (root / "memory").mkdir(parents=True)
    sessions.mkdir()
    lines = [line for _, line, _ in POSITIVES]
    (root / "memory" / "2026-01-05.md").write_text("\n\n".join(lines) + "\n")
    records = [{"type": "message", "message": {"role": "user", "content": x}} for x in lines]
    (sessions / "abc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with running_daemon(Config.load()) as daemon:
        with memd_client.connect(daemon.socket_path, identity={"agent_id": "alice"}) as c:
            c.workspace_add(root, name="agent", sessions_dir=sessions, agent_id="alice")
            c.reindex("agent")
            pages, start = [], 1
            while start:  # `get` returns the JSONL lines themselves, a page at a time
                page = c.get("agent", "sessions/abc.jsonl", from_line=start, lines=len(lines))
                pages.append(page["text"])
                start = page["next_from"]
            got = "\n".join(pages)
            snippets = [
                hit["snippet"]
                for query in ("password", "token", "key", "secret", "private", "sig", "auth")
                for hit in c.search("agent", query, mode="keyword", max_results=50)["results"]
            ]
    assert len(got.splitlines()) == len(lines) and snippets
    index = b"".join(p.read_bytes() for p in Path(os.environ["MEMD_HOME"]).rglob("*.sqlite*"))
    leaks = []
    for line, secrets in ((line, secrets) for _, line, secrets in POSITIVES):
        for secret in secrets:
            if secret in got or any(secret in s for s in snippets):
                leaks.append(("shown", secret, line[:60]))
            if any(trace in index for trace in _traces(secret, line)):
                leaks.append(("indexed", secret, line[:60]))
    assert leaks == []
