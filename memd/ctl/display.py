"""Human-readable lines for memctl's output; stdlib only, colour is the caller's ``style``.

The status reply, the largest, has a module of its own (memd.ctl.display_status); the helpers
every formatter shares (age, duration, counts) are here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "age",
    "duration",
    "model_line",
    "reindex_line",
    "search_lines",
    "search_notes",
]

# style(text, colour) -> text; memctl passes click.style, which is dropped when not on a TTY.
Style = Callable[[str, str], str]


def _plain(text: str, colour: str) -> str:
    return text


def duration(seconds: float) -> str:
    """Say a span of time in its two largest units: ``45s``, ``3m 12s``, ``2h 5m``, ``4d 1h``."""
    s = max(0, int(seconds))
    for unit, size, sub, subsize in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if s >= size:
            rest = (s % size) // subsize
            return f"{s // size}{unit}" + (f" {rest}{sub}" if rest else "")
    return f"{s}s"


def age(timestamp: float | None, now: float) -> str:
    """Say how long ago a Unix time was, or ``never``."""
    if not timestamp:
        return "never"
    return f"{duration(now - timestamp)} ago"


def _mb(n: Any) -> str:
    return f"{n / 1e6:.1f} MB" if isinstance(n, int | float) else "?"


_KINDS = {"rebuild": "Rebuilding", "index": "Indexing", "embed": "Embedding"}


def _count(n: Any) -> str:
    return f"{int(n):,}" if isinstance(n, int | float) else "?"


def progress_text(p: Mapping[str, Any]) -> str:
    """What a syncer is doing, in words: ``Rebuilding: embedding 1,200/9,751 chunks (412/3,001
    files) · 38.5 chunks/s · about 3m 40s left``."""
    kind = _KINDS.get(str(p.get("kind")), str(p.get("kind")))
    files = f"{_count(p.get('files_done'))}/{_count(p.get('files_total'))} files"
    if p.get("phase") != "embed":
        return f"{kind}: reading {files}"
    chunks = f"{_count(p.get('chunks_done'))}/{_count(p.get('chunks_total'))} chunks ({files})"
    text = f"{kind}: {chunks}" if p.get("kind") == "embed" else f"{kind}: embedding {chunks}"
    if p.get("chunks_per_s"):
        text += f" · {float(p['chunks_per_s']):.1f} chunks/s"
    if p.get("eta_s") is not None:
        text += f" · about {duration(float(p['eta_s']))} left"
    return text


def progress_fraction(p: Mapping[str, Any]) -> float:
    """How far along, 0 to 1: files while reading, chunks while embedding."""
    done, total = (
        ("chunks_done", "chunks_total")
        if p.get("phase") == "embed"
        else (
            "files_done",
            "files_total",
        )
    )
    d, t = p.get(done) or 0, p.get(total) or 0
    return min(1.0, d / t) if t else 0.0


def progress_bar(p: Mapping[str, Any], width: int = 24) -> str:
    filled = int(width * progress_fraction(p))
    return "[" + "#" * filled + "-" * (width - filled) + "] " + progress_text(p)


def search_notes(result: Mapping[str, Any]) -> Iterator[str]:
    """The caveats of a search (for stderr): the daemon's note, unindexed files, no hits."""
    if result.get("note"):
        yield f"note: {result['note']}"
    fresh = result.get("freshness") or {}
    if fresh and not fresh.get("fresh", True):
        pending = fresh.get("pending_files", 0)
        for problem in fresh.get("problems") or []:
            yield f"note: not fresh: {problem}"
        if pending:
            yield f"note: the index is catching up ({pending} files pending)"
        elif fresh.get("unembedded_files"):
            yield f"note: vectors of {fresh['unembedded_files']} files are still being made"
        elif fresh.get("skipped_files"):
            yield f"note: {fresh['skipped_files']} files are not indexed (memctl status says why)"
    if not result.get("results"):
        yield "No results."


def search_lines(result: Mapping[str, Any], style: Style = _plain) -> Iterator[str]:
    """One line per hit, ``0.873  memory/2026-01-02.md#L3-L9``, then the lines that matched
    the query (up to 3, marked with their line number), or the first 2 when none did."""
    for hit in result.get("results") or []:
        where = f"{hit.get('path')}#L{hit.get('start_line')}-L{hit.get('end_line')}"
        yield f"{float(hit.get('score') or 0):.3f}  {style(where, 'cyan')}"
        first = int(hit.get("snippet_start_line") or hit.get("start_line") or 1)
        numbered = list(enumerate(str(hit.get("snippet") or "").split("\n"), first))
        matched = set(hit.get("match_lines") or [])
        shown = [(n, ln) for n, ln in numbered if n in matched][:3]
        if shown:
            for n, line in shown:
                yield f"  {style(f'{n:>4}', 'yellow')} › {line.strip()[:120]}"
            continue
        for _, line in [(n, ln) for n, ln in numbered if ln.strip()][:2]:
            yield f"    {line.strip()[:120]}"


def estimate_lines(e: Mapping[str, Any]) -> Iterator[str]:
    """What a rebuild would send (``memctl reindex --force --dry-run``)."""
    where = f"{e.get('workspace')}: a rebuild would index {_count(e.get('files'))} files"
    yield f"{where} ({_count(e.get('chunks'))} chunks)"
    if e.get("provider") in (None, "none"):
        yield "  keyword-only: nothing goes to an embedding provider"
        return
    lines = "chunks and their lines" if e.get("line_vectors") else "chunks only"
    yield (
        f"  {_count(e.get('texts'))} distinct texts ({lines}); {_count(e.get('cached'))} "
        "are in the embedding cache"
    )
    send = f"{_count(e.get('send_texts'))} texts, about {_count(e.get('send_tokens'))} tokens"
    if not e.get("send_texts"):
        yield f"  sends nothing to {e.get('provider')} {e.get('model')}"
    elif e.get("batch"):
        yield f"  sends {send} to {e.get('provider')} {e.get('model')} through its Batch API"
    elif e.get("requests"):
        yield f"  sends {send} to {e.get('provider')} {e.get('model')} in {_count(e.get('requests'))} requests"
    else:
        yield f"  embeds {send} with {e.get('provider')} {e.get('model')} on this machine"


def reindex_line(report: Mapping[str, Any]) -> str:
    """Sum up one workspace's reindex report on one line."""
    counts = " · ".join(
        f"{report.get(k, 0)} {k}"
        for k in ("scanned", "indexed", "unchanged", "removed", "embedded")
    )
    line = f"{report.get('workspace')}: {counts} · {report.get('pending_files', 0)} pending"
    line += f" ({float(report.get('seconds') or 0):.2f}s)"
    return line + (" [rebuilt]" if report.get("rebuilt") else "")


def model_line(name: str, size: int, sha256: str | None, partial: bool) -> str:
    """One model file: name, size and the start of its checksum, or that it is unfinished."""
    tail = "partial download" if partial else f"sha256 {sha256[:12]}…" if sha256 else "unverified"
    return f"{name}  {_mb(size)}  {tail}"


def promote_lines(result: Mapping[str, Any]) -> list[str]:
    """Human lines for a promote reply: candidates, what was applied, an explanation."""
    lines = []
    explained = result.get("explain")
    if "explain" in result:
        if explained is None:
            lines.append(f"No entry {result['explain_key']!r} in the recall store.")
        else:
            lines.append(
                f"{explained['key']}: score {explained['score']:.3f}"
                f" ({'passes' if explained.get('passes_thresholds') else 'below'} thresholds)"
            )
            for name, value in explained.get("components", {}).items():
                lines.append(f"  {name:<14} {value:.3f}")
            if explained.get("lasting"):
                lines.append(f"  {explained['lasting']} (passes without recall statistics)")
            if explained.get("held_back"):
                lines.append(f"  held back: {explained['held_back']}")
            lines.append(
                f"  recalls {explained['recall_count']}, queries {explained['unique_queries']},"
                f" days {', '.join(explained.get('recall_days') or [])}"
            )
    candidates = result.get("candidates") or []
    lines.append(f"{len(candidates)} candidate(s) of {result.get('entries', 0)} tracked")
    for c in candidates:
        lines.append(
            f"{c['score']:.3f}  {c['path']}#L{c['start_line']}-L{c['end_line']}"
            f"  recalls={c['recall_count']} queries={c['unique_queries']}"
        )
        lines.append(f"    {str(c.get('snippet', ''))[:100]}")
        lines.append(f"    key {c['key']}  (--explain KEY)")
    applied = result.get("applied") or []
    if applied:
        lines.append(f"Promoted {len(applied)} to MEMORY.md")
    if would := result.get("would_apply"):
        lines.append(f"Would promote {len(would)} to MEMORY.md (--apply writes)")
    if withheld := result.get("withheld_from_transcripts"):
        lines.append(f"{withheld} from session transcripts not shown (--agent-id shows them)")
    for key, reason in result.get("skipped") or []:
        lines.append(f"skipped {key}: {reason}")
    return lines


_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (9, 10)}


def terminal_safe(text: str) -> str:
    """``text`` with control characters (ESC, CSI, OSC, bell, CR ...) shown as ``\\xNN``, so
    a memory file cannot move the cursor, retitle the window or hide lines on a terminal.
    Tab and newline stay."""
    return text.translate(_CONTROLS)
