"""``memctl status`` in words: the daemon, the embedding API's costs, and each workspace in a
block of indented lines; stdlib only, colour is the caller's ``style``.

Its own module: the status reply is the largest memctl formats, and only ``memctl status`` (and
the doctor, for how memd was started and its model download) needs it; memd.ctl.display holds
the other replies and the helpers they share.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from memd.ctl.display import Style, _count, _mb, _plain, age, duration, progress_text

__all__ = ["cost_lines", "model_pull_text", "started_text", "status_lines"]


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
    used = w.get("query_threads") or {}
    took = w.get("query_ms") or {}

    def p50(threads: str) -> str:
        times = took.get(threads) or {}
        if (ms := times.get("p50")) is None:
            return ""
        outside = times.get("outside_p50")
        return f"p50 {ms:.1f} ms" + (f" + {outside:.1f} outside" if outside is not None else "")

    if len(used) > 1:  # some queries had fewer threads than others: say how many had each
        line += ", queries by threads " + " · ".join(
            f"{k}: {n}" + (f" ({took_k})" if (took_k := p50(k)) else "") for k, n in used.items()
        )
    elif used and (took_one := p50(next(iter(used)))):
        line += f", queries {took_one}"
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


def _keyword_line(fts: Mapping[str, Any]) -> str | None:
    ranking = fts.get("ranking")
    if ranking == "postings":
        built = fts.get("built_seconds")
        took = f", built in {built} s" if built is not None else ""
        return f"  Keyword ranking: postings in memory ({fts.get('postings_mb')} MB{took})"
    if ranking == "building":
        return "  Keyword ranking: FTS5 while the postings are built"
    if ranking == "fts5" and fts.get("error"):
        return f"  Keyword ranking: FTS5 — {fts['error']}"
    return None


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
    ranking = _keyword_line(ws.get("fts") or {})
    if ranking:
        yield ranking
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
