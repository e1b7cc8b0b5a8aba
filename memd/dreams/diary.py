"""DREAMS.md: the dream diary, one dated entry per dreaming run, appended.

Each entry is a ``## Dreams of YYYY-MM-DD HH:MM`` heading, a marker with the digest of what
memd wrote, and the run in plain words: what Light staged, the themes and candidate truths REM
found (with confidence and sources), what Deep promoted and why, and what it held back. The
file stays under a size budget by dropping its oldest entries, and only entries still exactly
as memd wrote them (the digest matches): a line a human added or changed is never dropped.

The diary is for people to read. It is not indexed unless ``[dreaming] index_diary`` says so
(its entries quote the notes they come from, and outranked them in search); agents that may
read long-term memory may ``get`` it, none may write it (memd/flush.py). It never quotes a
line taken from a session transcript unless that line was promoted into MEMORY.md
(memd/dreams/privacy.py), and its lines are redacted as the index redacts text.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.dreams.privacy import only_from_transcripts
from memd.dreams.sharedfile import append_text, snapshot, swap_in

__all__ = ["DIARY_FILE", "DiaryWrite", "diary_lines", "write_entry"]

logger = logging.getLogger(__name__)

DIARY_FILE = "DREAMS.md"
HEADER = "# Dream Diary"
ATTEMPTS = 5
_ENTRY = re.compile(r"^## Dreams of \d{4}-\d{2}-\d{2}")
_MARK = re.compile(r"^<!-- memd-dream sha256=([0-9a-f]{16}) -->$")


@dataclass
class DiaryWrite:
    path: str
    dropped_entries: int = 0


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def render(title: str, body_lines: Sequence[str]) -> str:
    """One diary entry (heading, digest marker, body), surrounded by blank lines."""
    body = "\n".join(body_lines).rstrip("\n") + "\n"
    return f"\n## Dreams of {title}\n<!-- memd-dream sha256={_digest(body)} -->\n{body}"


def _entries(lines: list[str]) -> list[tuple[int, int, bool]]:
    """(first line, end, intact) of each diary entry; intact = its digest still matches."""
    starts = [i for i, line in enumerate(lines) if _ENTRY.match(line)]
    out = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        mark = _MARK.match(lines[start + 1].rstrip("\r\n")) if start + 1 < end else None
        body = "".join(lines[start + 2 : end]).replace("\r\n", "\n").rstrip("\n") + "\n"
        # the blank line before the next entry belongs to the separator, not to the body
        out.append((start, end, mark is not None and mark[1] == _digest(body)))
    return out


def _trim(text: str, room: int) -> tuple[str, int]:
    """Drop the oldest intact entries until ``text`` fits ``room``; returns (text, dropped)."""
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    dropped = 0
    size = len(text)
    for start, end, intact in _entries(lines):
        if size <= room:
            break
        if intact:
            drop.update(range(start, end))
            size -= sum(len(lines[i]) for i in range(start, end))
            dropped += 1
    return "".join(line for i, line in enumerate(lines) if i not in drop), dropped


def write_entry(root: Path, title: str, body_lines: Sequence[str], *, max_chars: int) -> DiaryWrite:
    """Append one entry to ``root/DREAMS.md``, then keep the file under ``max_chars`` (0: no
    budget) by dropping the oldest entries memd wrote and nobody changed."""
    path = root / DIARY_FILE
    # a symlinked DREAMS.md is refused (PathRefused) by append_text's no-follow open
    append_text(path, render(title, body_lines), header=HEADER + "\n")
    result = DiaryWrite(str(path))
    if max_chars <= 0:
        return result
    for _ in range(ATTEMPTS):
        base = snapshot(path)
        try:
            text = base.text
            if len(text) <= max_chars:
                return result
            trimmed, dropped = _trim(text, max_chars)
            if not dropped:
                logger.info("%s is over its budget but holds no entry memd may drop", path)
                return result
            if swap_in(path, base, trimmed):
                result.dropped_entries = dropped
                return result
        finally:
            if base.fd is not None:
                os.close(base.fd)
    logger.warning("%s kept changing; left over its budget this time", path)
    return result


STAGED_SHOWN = 10


def _sources(item: Mapping[str, Any]) -> str:
    days = item.get("days") or []
    written = f" · written on {', '.join(days)}" if len(days) > 1 else ""
    return ", ".join(item["evidence"]) + written


def _private(items: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(the items the diary may quote, the line saying how many it may not)."""
    shown = [i for i in items if not only_from_transcripts(i)]
    hidden = len(items) - len(shown)
    note = (
        [
            f"- {hidden} from session transcripts, not shown here "
            "(a transcript is for its own agent only)."
        ]
        if hidden
        else []
    )
    return shown, note


def diary_lines(run: Mapping[str, Any]) -> list[str]:
    """A dreaming run (memd/dreams/dream.py) in plain words, for the diary; for a preview (not
    ``applied``), what a run that writes would do."""
    out: list[str] = []
    if (light := run.get("light")) is not None:
        staged = light["staged"]
        merged = light["merged"]
        out += [
            "### Light Sleep",
            f"Read {len(light['notes_read'])} daily notes"
            + (
                f" and {light['messages_read']} transcript messages"
                if light.get("messages_read")
                else ""
            )
            + f" ({light['snippets']} snippets). "
            f"Staged {len(staged)} of {light['considered']} recent memories"
            + (f"; {merged} merged as the same claim." if merged else "."),
        ]
        shown, note = _private(staged)
        out += [f"- {g['snippet']} ({_sources(g)})" for g in shown[:STAGED_SHOWN]]
        if len(shown) > STAGED_SHOWN:
            out.append(f"- … and {len(shown) - STAGED_SHOWN} more.")
        out += note
        out.append("")
    if (rem := run.get("rem")) is not None:
        out += ["### REM Sleep", f"Reflected on {rem['considered']} memories of the last week."]
        out.append("Themes:" if rem["themes"] else "Themes: none kept coming back.")
        themes, note = _private(rem["themes"])
        out += [
            f"- `{t['tag']}` in {t['count']} memories (strength {t['strength']:.2f}): "
            + ", ".join(t["evidence"])
            for t in themes
        ] + note
        out.append("Candidate truths:" if rem["truths"] else "Candidate truths: none yet.")
        truths, note = _private(rem["truths"])
        out += [
            f"- {t['snippet']} [confidence {t['confidence']:.2f} · {_sources(t)}]" for t in truths
        ] + note
        if rem["lasting"]:
            out.append("Lasting facts (kept whatever the statistics say):")
            lasting, note = _private(rem["lasting"])
            out += [f"- {t['snippet']} [{t['reason']} · {_sources(t)}]" for t in lasting] + note
        if rem["grounded"]:
            out.append(f"Grounded {rem['grounded']} claims in the days they were written on.")
        out.append("")
    if (deep := run.get("deep")) is not None:
        out.append("### Deep Sleep")
        writes = run.get("applied", True)
        applied = {a["key"] for a in deep.get("applied" if writes else "would_apply", [])}
        promoted = [c for c in deep["candidates"] if c["key"] in applied]
        if promoted:
            out.append("Promoted into MEMORY.md:" if writes else "Would promote into MEMORY.md:")
            out += [f"- {c['snippet']} ({c['why']})" for c in promoted]
        else:
            out.append("Promoted nothing." if writes else "Would promote nothing.")
        if deep["held_back"]:
            out.append("Held back:")
            held, note = _private(deep["held_back"])
            out += [f"- {h['snippet']} ({h['reason']})" for h in held] + note
        out.append("")
    return out
