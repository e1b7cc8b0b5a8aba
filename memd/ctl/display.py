"""Human-readable lines for memctl's output; stdlib only, colour is the caller's ``style``.

Over 400 lines: one small formatter per kind of reply; splitting them by command would only
scatter the shared helpers (age, duration, plural).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "age",
    "duration",
    "model_line",
    "model_pull_text",
    "reindex_line",
    "search_lines",
    "search_notes",
    "started_text",
    "status_lines",
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


def _daemon_line(d: Mapping[str, Any]) -> str:
    parts = [f"memd {d.get('version', '?')}", f"pid {d.get('pid', '?')}"]
    if d.get("uptime_s") is not None:
        parts.append(f"up {duration(d['uptime_s'])}")
    if d.get("rss_bytes") is not None:
        rss = f"{_mb(d['rss_bytes'])} RSS"
        if d.get("sqlite_memory_bytes") is not None:
            rss += f" ({_mb(d['sqlite_memory_bytes'])} in SQLite)"
        parts.append(rss)
    if d.get("cpu_percent") is not None:
        parts.append(f"{d['cpu_percent']:.1f}% CPU")
    for key in ("threads", "connections"):
        if d.get(key) is not None:
            parts.append(f"{d[key]} {key if d[key] != 1 else key[:-1]}")
    readers = d.get("readers") or {}
    if readers.get("error"):
        parts.append(f"reader processes off: {readers['error']}")
    elif readers.get("running"):
        parts.append(
            f"{readers['running']} reader process{'es' if readers['running'] != 1 else ''}"
        )
    return " · ".join(parts)


def _provider_lines(p: Mapping[str, Any]) -> Iterator[str]:
    active = p.get("active") or "none"
    line = f"  Provider: {active} {p.get('model') or ''}".rstrip()
    if p.get("dims"):
        line += f", {p['dims']} dims"
    if p.get("requested") and p.get("requested") != active:
        line += f" (requested {p['requested']})"
    if p.get("line_vectors") is False and active != "none":
        line += ", chunk vectors only"
    yield line
    worker = p.get("worker")
    if worker:
        yield "    " + _worker_line(worker)
    for skipped in p.get("skipped") or []:
        yield f"    skipped {skipped.get('provider')}: {skipped.get('reason')}"
    if p.get("last_error"):
        yield f"    last error: {p['last_error']}"


def _sent(counts: Mapping[str, Any]) -> str:
    return " · ".join(
        f"{_count(counts.get(k, 0))} {k if counts.get(k) != 1 else k[:-1]}"
        for k in ("texts", "tokens", "requests")
    )


def cost_lines(p: Mapping[str, Any]) -> Iterator[str]:
    """How a remote provider is asked, what was sent to it (today, in total), and the batches
    memd waits for: the ``embedding`` part of a status reply, two spaces in."""
    r = p.get("requests")
    if r:
        line = (
            f"  requests: up to {r.get('concurrency')} at a time, "
            f"{_count(r.get('inputs_per_request'))} texts or "
            f"{_count(r.get('tokens_per_request'))} tokens each"
        )
        if r.get("held_s"):
            line += f"; rate-limited for {r['held_s']} s more"
        yield line
    for provider, u in (p.get("usage") or {}).items():
        today, total = u.get("today") or {}, u.get("total") or {}
        yield f"  sent to {provider} today: {_sent(today)}; in total: {_sent(total)}"
    batches = p.get("batches") or {}
    for job in batches.get("jobs") or []:
        yield (
            f"  batch {job.get('id')}: {job.get('status')}, {_count(job.get('completed'))}"
            f"/{_count(job.get('requests'))} requests done, {_count(job.get('texts'))} texts · "
            f"{_count(job.get('tokens'))} tokens, submitted {duration(job.get('age_s') or 0)} ago"
        )
    last = batches.get("last")
    if last and not batches.get("jobs"):
        line = f"  last batch {last.get('id')}: {last.get('status')}, "
        line += f"{_count(last.get('vectors'))} vectors kept"
        if last.get("error"):
            line += f" ({last['error']})"
        yield line


def _worker_line(w: Mapping[str, Any]) -> str:
    """The local model's worker process: state, pid, load mode and why, restarts, last exit."""
    state = w.get("state") or "?"
    line = f"model worker: {state}"
    if w.get("pid"):
        line += f", pid {w['pid']}"
    settings = w.get("settings") or ""
    if w.get("mode") not in (None, "default"):
        why = f", after {w['reason']}" if w.get("reason") else ""
        line += f" ({settings}{why})"
    if w.get("restarts"):
        line += f", {w['restarts']} restart{'s' if w['restarts'] != 1 else ''}"
        if w.get("last_exit"):
            line += f" (last: {w['last_exit']})"
    if w.get("error"):
        line += f" — {w['error']}"
    return line


def _vector_line(v: Mapping[str, Any]) -> str:
    kind = v.get("kind") or "none"
    line = f"  Vector store: {'in-memory sketch' if kind == 'plain' else kind}"
    version = v.get("sqlite_vec_version") if v.get("sqlite_vec") else None
    if version:
        line += f" {version}" if kind.startswith("sqlite-vec") else f" (sqlite-vec {version})"
    if v.get("reason") and kind == "plain":
        # why sqlite-vec is not used: the sketch itself is on
        line += f" — sqlite-vec {v['reason']}"
    elif v.get("reason"):
        line += f" — {v['reason']}"
    return line


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


def _workspace_lines(
    ws: Mapping[str, Any], now: float, style: Style, *, provider: bool = True
) -> Iterator[str]:
    yield style(str(ws.get("workspace", "?")), "cyan") + f" ({ws.get('root', '?')})"
    indexed = f"  Indexed: {ws.get('files_indexed', '?')}/{ws.get('files_on_disk', '?')} files"
    transcripts = ws.get("transcripts") or {}
    if transcripts.get("on_disk"):  # counted among the files, on disk as in the index
        indexed += f" ({transcripts.get('indexed', 0)}/{transcripts['on_disk']} transcripts)"
    yield f"{indexed} · {ws.get('chunks', '?')} chunks · {ws.get('files_pending', '?')} pending"
    progress = ws.get("progress")
    if progress:
        yield "  " + style(progress_text(progress), "yellow")
    unembedded = (ws.get("chunks") or 0) - (ws.get("vectors") or 0)
    semantic = (ws.get("provider") or {}).get("active") not in (None, "none")
    if semantic and unembedded > 0 and not progress:
        yield f"  Unembedded: {unembedded:,} chunks (keyword search finds them; vectors follow)"
    yield "  Dirty: " + (style("yes", "yellow") if ws.get("dirty") else "no")
    for problem in (ws.get("freshness") or {}).get("problems") or []:
        yield "  " + style(f"Problem: {problem}", "yellow")
    skipped = ws.get("files_skipped") or []
    for item in skipped[:10]:
        yield f"  Skipped: {item.get('path')} ({item.get('reason')})"
    if len(skipped) > 10:
        yield f"  Skipped: … and {len(skipped) - 10} more (memctl status --json lists them)"
    if provider:
        yield from _provider_lines(ws.get("provider") or {})
    yield _vector_line(ws.get("vector_store") or {})
    identity = ws.get("identity") or {}
    if identity.get("reason"):
        yield f"  Index: {identity.get('state')} ({identity['reason']})"
    watcher = ws.get("watcher") or {}
    if watcher:
        line = f"  Watcher: {watcher.get('state', '?')}"
        if watcher.get("backend"):
            line += f" ({watcher['backend']})"
        if watcher.get("reason"):
            line += f" — {watcher['reason']}"
        yield line
    yield f"  Last sync: {age(ws.get('last_sync'), now)}"
    if ws.get("cache_entries") is not None:
        yield f"  Cache: {ws['cache_entries']} embeddings"
    yield from _dreaming_lines(ws.get("dreaming") or {})


def _tally(phase: str, r: Mapping[str, Any]) -> str:
    if phase == "light":
        return f"{r.get('staged', 0)} staged from {r.get('notes_read', 0)} notes"
    if phase == "rem":
        return (
            f"{r.get('truths', 0)} truths, {r.get('lasting', 0)} lasting, "
            f"{r.get('themes', 0)} themes"
        )
    return f"{r.get('promoted', 0)} promoted, {r.get('held_back', 0)} held back"


def _dreaming_lines(d: Mapping[str, Any]) -> Iterator[str]:
    """The recall store and the last run of each dreaming phase."""
    counts = d.get("recall_store") or {}
    if counts.get("error"):
        yield f"  Recall store: unreadable ({counts['error']})"
    elif counts:
        yield (
            f"  Recall store: {counts.get('entries', 0)} entries · {counts.get('promoted', 0)}"
            f" promoted · {counts.get('spaced', 0)} seen on 2+ days"
        )
    runs = d.get("last_runs") or {}
    for phase in ("light", "rem", "deep"):
        if run := runs.get(phase):
            yield f"  Dreaming {phase}: {run.get('at', '?')} · {_tally(phase, run)}"
    if d.get("enabled"):
        yield f"  Next dreaming: {d.get('next_run') or '?'}"


def model_pull_text(pull: Mapping[str, Any], now: float | None = None) -> str | None:
    """The model memd fetches in the background (``[embedding] auto_pull``), as one line."""
    name = str(pull.get("uri") or "").rstrip("/").rsplit("/", 1)[-1] or "the model"
    state, done, total = pull.get("state"), pull.get("done") or 0, pull.get("total")
    if state == "downloading":
        got = f"{_mb(done)} of {_mb(total)}, {done / total:.0%}" if total else _mb(done)
        return f"Model: downloading {name} ({got}); keyword search meanwhile"
    if state == "loading":
        return f"Model: {name} downloaded, loading it; keyword search meanwhile"
    if state == "failed":
        again = pull.get("next_try")
        when = f"; trying again in {duration(again - now)}" if again and now else ""
        return f"Model: could not download {name}: {pull.get('error')}{when}"
    if state == "done":
        return f"Model: {name} downloaded and in service"
    return None


def started_text(started: Mapping[str, Any]) -> str:
    """How memd was started: ``by systemd socket activation (stops after 15m idle)``,
    ``on demand by memctl (pid 4242)``, ``by the service manager (launchd)``, ``by hand``."""
    how, by = started.get("how"), started.get("by")
    if how == "socket activation":
        text = f"by {by} socket activation"
        if started.get("idle_exit_s"):
            text += (
                f" (stops after {duration(started['idle_exit_s'])} idle; starts again on demand)"
            )
        return text
    if how == "on demand":
        return f"on demand by {by}"
    if how == "service":
        return f"by the service manager ({by})"
    return "by hand (memd run)"


def status_lines(status: Mapping[str, Any], now: float, style: Style = _plain) -> Iterator[str]:
    """Describe the daemon, then each workspace in a block of indented lines."""
    daemon = status.get("daemon") or {}
    if daemon:
        yield _daemon_line(daemon)
        if daemon.get("socket"):
            yield f"Socket: {daemon['socket']}"
        if daemon.get("started"):
            yield f"Started: {started_text(daemon['started'])}"
        if daemon.get("model_pull"):
            line = model_pull_text(daemon["model_pull"], now)
            if line:
                failed = daemon["model_pull"].get("state") == "failed"
                yield style(line, "red" if failed else "yellow")
        for path in daemon.get("missing_workspaces") or []:
            yield style(f"Missing: {path}", "yellow") + " (kept; opened when it appears)"
    costs = list(cost_lines(status.get("embedding") or {}))
    if costs:
        yield "Embedding API:"
        yield from costs
    workspaces = status.get("workspaces") or []
    if not workspaces:
        yield "No workspaces registered; add one with `memctl workspace add PATH`."
    # One embedder serves every workspace: its lines (skipped providers, the worker) once.
    providers = [ws.get("provider") or {} for ws in workspaces]
    shared = len(workspaces) > 1 and all(p == providers[0] for p in providers)
    if shared:
        yield from (line[2:] for line in _provider_lines(providers[0]))
    for ws in workspaces:
        yield ""
        yield from _workspace_lines(ws, now, style, provider=not shared)


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
