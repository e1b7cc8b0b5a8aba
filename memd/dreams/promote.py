"""Promotion into MEMORY.md: re-read each candidate's lines from its daily note and add them as one
dated, marker-tagged section, without ever losing a line a human wrote (memd/dreams/sharedfile.py).

What is written is the claim as clean Markdown: one bullet of the lines' text, without the
headings, list markers and blank lines around it, and with secrets redacted as the index
redacts them. A dry run (a preview) takes the same path and writes nothing, so it says exactly
what a run that writes would do.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path, PurePosixPath

from memd.dreams.place import DreamPlace
from memd.dreams.ranking import Candidate
from memd.dreams.recall_entry import RecallEntry
from memd.dreams.recall_text import is_promotable
from memd.dreams.sharedfile import append_text, snapshot, snapshot_bytes, swap_in
from memd.redact import redact as redact_secrets
from memd_client.errors import PathRefused

__all__ = ["Applied", "PromotionResult", "apply_promotions", "rehydrate"]

logger = logging.getLogger(__name__)

MEMORY_FILE = "MEMORY.md"
FILE_HEADER = "# Long-Term Memory"
SECTION_TITLE = "Promoted From Short-Term Memory"
CAS_ATTEMPTS = 5

_WS = re.compile(r"\s+")
_BULLET = re.compile(r"^(?:[-*+]|\d+[.)])\s+(?:\[[ xX]\]\s+)?")
_HEADING_LINE = re.compile(r"^\s{0,3}#{1,6}(?:\s|$)")
_MARKER = re.compile(r"<!--\s*(?:memd|openclaw-memory)-promotion:(.+?)\s*-->")
_SECTION = re.compile(r"## Promoted From Short-Term Memory \((\d{4}-\d{2}-\d{2})\)")
_TOP_HEADING = re.compile(r"#{1,2}\s")  # a "# " or "## " line ends a promoted section
_TRAILING_BLANKS = re.compile(r"(?<=\n)(?:[ \t]*\r?\n)+\Z")  # blank lines at the end


@dataclass(frozen=True)
class Applied:
    """One entry written to MEMORY.md, with the lines and text it was rehydrated to."""

    key: str
    path: str
    start_line: int
    end_line: int
    text: str


@dataclass
class PromotionResult:
    """What one ``apply_promotions`` call did."""

    applied: list[Applied] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    dropped_sections: int = 0
    memory_path: str = ""


def _collapse(text: str) -> str:
    """One line; a leading list marker goes (the section writes its own)."""
    return _BULLET.sub("", _WS.sub(" ", text).strip())


def claim_text(text: str) -> str:
    """The claim ``text``'s lines make, as the text of one bullet: headings, blank lines and
    each line's list marker (and checkbox) left out, the rest joined by spaces."""
    kept = [
        _BULLET.sub("", line.strip())
        for line in text.splitlines()
        if line.strip() and not _HEADING_LINE.match(line)
    ]
    return _WS.sub(" ", " ".join(k for k in kept if k)).strip()


def _source_rel(place: DreamPlace, path: str) -> str | None:
    """The file holding ``path``: as given, else ``memory/<basename>``."""
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute():
        try:
            p = PurePosixPath(Path(p).relative_to(place.root).as_posix())
        except ValueError:
            return None
    if ".." in p.parts or not p.name:
        return None
    for rel in dict.fromkeys((p.as_posix(), f"memory/{p.name}")):
        if place.file(rel).is_file():
            return rel
    return None


def _locate(lines: list[str], want: str, start: int, end: int) -> tuple[int, int] | None:
    """Find the 1-based line range now holding ``want`` (whitespace-collapsed)."""
    n = len(lines)
    if 1 <= start <= end <= n and _collapse("\n".join(lines[start - 1 : end])) == want:
        return start, end
    span = max(1, end - start + 1)
    widest = max(span + 3, 8)
    flat = [_collapse(line) for line in lines]
    best: tuple[int, int, int] | None = None
    found: tuple[int, int] | None = None
    for i in range(n):
        text = ""
        for w in range(1, min(widest, n - i) + 1) if flat[i] else ():
            piece = flat[i + w - 1]
            if not piece:  # a window neither starts nor ends on a blank line
                continue
            text = f"{text} {piece}" if text else piece
            if text == want:
                quality = 3
            elif want in text:
                quality = 2
            elif text in want and 2 * len(text) >= len(want):
                # A fragment must still be most of the snippet, or any short line would match.
                quality = 1
            else:
                continue
            rank = (-quality, abs(i + 1 - start), abs(w - span))
            if best is None or rank < best:
                best, found = rank, (i + 1, i + w)
    return found


def _rehydrate(place: DreamPlace, entry: RecallEntry) -> tuple[str, int, int, str] | str:
    rel = _source_rel(place, entry.path)
    if rel is None:
        return f"source file not found: {entry.path}"
    try:
        lines = place.file(rel).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"cannot read {rel}: {exc.strerror or exc}"
    want = _collapse(entry.snippet)
    if not want:
        return "empty snippet"
    span = _locate(lines, want, entry.start_line, entry.end_line)
    if span is None:
        return f"snippet no longer found in {rel}"
    text = "\n".join(lines[span[0] - 1 : span[1]])
    if not is_promotable(text) or not claim_text(text):
        return "rehydrated text is not promotable"
    return rel, span[0], span[1], text


def rehydrate(
    root: Path, entry: RecallEntry, place: DreamPlace | None = None
) -> tuple[int, int, str] | str:
    """Re-read ``entry``'s lines from its source file: ``(start, end, text)`` or why not."""
    found = _rehydrate(place or DreamPlace.inside(root), entry)
    return found if isinstance(found, str) else found[1:]


def _section(
    day: date, items: Sequence[tuple[Candidate, Applied]], nl: str, *, redact: bool
) -> str:
    out = ["", f"## {SECTION_TITLE} ({day.isoformat()})", ""]
    for cand, a in items:
        avg = cand.entry.total_score / max(1, cand.signal_count)
        claim = claim_text(a.text)
        out.append(f"<!-- memd-promotion:{a.key} -->")
        out.append(
            f"- {redact_secrets(claim) if redact else claim} [score={cand.score:.3f} "
            f"recalls={cand.entry.recall_count} avg={avg:.3f} "
            f"source={a.path}:{a.start_line}-{a.end_line}]"
        )
    return nl.join(out) + nl


def _drop_oldest(text: str, room: int) -> tuple[str, int]:
    """Drop the oldest promoted sections until ``text`` fits ``room``; other lines all stay."""
    lines = text.splitlines(keepends=True)
    nl = "\r\n" if "\r\n" in text else "\n"
    regions: dict[int, tuple[str, int]] = {}  # first line -> (date, end)
    for i, line in enumerate(lines):
        if m := _SECTION.fullmatch(line.strip()):
            j = i + 1
            while j < len(lines) and not _TOP_HEADING.match(lines[j]):
                j += 1
            regions[i] = (m[1], j)
    dropped: dict[int, list[str]] = {}
    result = text
    for _day, i in sorted((day, i) for i, (day, _end) in regions.items()):
        if len(result) <= room:
            break
        dropped[i] = _residue(lines[i + 1 : regions[i][1]], nl)
        out: list[str] = []
        k = 0
        while k < len(lines):
            if k in dropped:
                out += dropped[k]
                k = regions[k][1]
            else:
                out.append(lines[k])
                k += 1
        result = _TRAILING_BLANKS.sub("", "".join(out)) if "".join(out).strip() else ""
    if result and not result.endswith("\n"):
        result += nl
    return result, len(dropped)


def _residue(body: list[str], nl: str) -> list[str]:
    """The lines of a promoted section that memd did not write (a human's additions)."""
    keep: list[str] = []
    after_marker = False
    for line in body:
        s = line.strip()
        if after_marker and s.startswith("- "):
            after_marker = False
            continue
        after_marker = bool(_MARKER.fullmatch(s))
        if not after_marker:
            keep.append(line)
    while keep and not keep[0].strip():
        keep.pop(0)
    while keep and not keep[-1].strip():
        keep.pop()
    if keep and not keep[-1].endswith("\n"):
        keep[-1] += nl
    return keep + [nl] if keep else []


def apply_promotions(
    root: Path,
    candidates: Sequence[Candidate],
    *,
    day: date,
    max_chars: int = 10_000,
    place: DreamPlace | None = None,
    redact: bool = True,
    dry_run: bool = False,
) -> PromotionResult:
    """Append the candidates not yet in ``root/MEMORY.md`` as one section dated ``day``
    (``dry_run``: say what would be appended, and write nothing)."""
    place = place or DreamPlace.inside(root)
    path = root / MEMORY_FILE
    if path.is_symlink():
        raise PathRefused(f"{path} is a symlink; memd does not write through it")
    result = PromotionResult(memory_path=str(path))
    present = set(_MARKER.findall(snapshot_bytes(path).decode("utf-8", "surrogateescape")))
    ready: list[tuple[Candidate, Applied]] = []
    seen: set[str] = set()
    for cand in candidates:
        key = cand.entry.key
        if key in seen:
            continue
        seen.add(key)
        if key in present:
            result.already_present.append(key)
            continue
        found = _rehydrate(place, cand.entry)
        if isinstance(found, str):
            logger.info("not promoting %s: %s", key, found)
            result.skipped.append((key, found))
            continue
        ready.append((cand, Applied(key, *found)))
    if ready and dry_run:
        result.applied.extend(a for _c, a in ready)
    elif ready:
        _write(path, ready, day, max_chars, result, redact=redact)
    return result


def _write(
    path: Path,
    ready: list[tuple[Candidate, Applied]],
    day: date,
    max_chars: int,
    result: PromotionResult,
    *,
    redact: bool,
) -> None:
    for attempt in range(CAS_ATTEMPTS + 1):
        if attempt == CAS_ATTEMPTS:
            logger.warning("%s kept changing; appending without trimming to its budget", path)
        base = snapshot(path)
        try:
            text = base.text
            present = set(_MARKER.findall(text))
            todo = [(c, a) for c, a in ready if a.key not in present]
            nl = "\r\n" if "\r\n" in text else "\n"
            section = _section(day, todo, nl, redact=redact)
            sep = "" if text.endswith("\n") else nl
            budget = 0 if attempt == CAS_ATTEMPTS else max_chars
            if todo and text and budget > 0 and len(text + sep + section) > budget:
                trimmed, dropped = _drop_oldest(text, budget - len(section))
                if dropped:
                    if not swap_in(path, base, (trimmed or FILE_HEADER + nl) + section):
                        logger.debug("%s changed while promoting; starting over", path)
                        continue
                    result.dropped_sections = dropped
                    _record(result, ready, todo)
                    return
            if todo:
                append_text(path, section, header=FILE_HEADER + nl, nl=nl)
            _record(result, ready, todo)
            return
        finally:
            if base.fd is not None:
                os.close(base.fd)


def _record(
    result: PromotionResult,
    ready: list[tuple[Candidate, Applied]],
    todo: list[tuple[Candidate, Applied]],
) -> None:
    written = {a.key for _c, a in todo}
    for _c, a in ready:
        if a.key in written:
            result.applied.append(a)
        else:  # appeared in MEMORY.md while this run was rehydrating
            result.already_present.append(a.key)
