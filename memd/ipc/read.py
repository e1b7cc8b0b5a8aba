"""The reading methods: ``search``, ``get``, ``context`` (the session-start context) and
``flush_plan``. Each checks its parameters and its caller's scope, reads, and shapes the reply."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from memd.flush import flush_plan
from memd.freshness import check as check_freshness
from memd.ipc.context import MAX_WAIT_MS, Context, may_see_sessions
from memd.markdown.context import DEFAULT_CONTEXT_CHARS, session_context
from memd.markdown.identity import Longterm
from memd.markdown.read import MemoryPath
from memd.params import bool_param, float_param, int_param, only, str_param
from memd.scopes import Caller, allowed_sources
from memd_client.errors import BadRequest, PathRefused
from memd_client.types import ContextResult, FlushPlan, GetResult, SearchHit, SearchResult

__all__ = ["Read"]

MAX_QUERY_CHARS = 4096
MAX_CONTEXT_CHARS = 200_000
# How long the first search of a never-indexed workspace waits for its keyword rows.
FIRST_INDEX_WAIT_MS = 10_000


class Read:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def search(self, params: Mapping[str, Any], caller: Caller) -> SearchResult:
        only(
            params,
            "workspace",
            "query",
            "max_results",
            "min_score",
            "mode",
            "wait_ms",
            "decay",
            "mmr",
            "sources",
        )
        ctx = self.ctx
        started = time.time()  # the reply vouches for the files as they were now
        ws = ctx.workspace(params)
        query = str_param(params, "query")
        assert query is not None
        if len(query) > MAX_QUERY_CHARS:
            raise BadRequest(f"query is longer than {MAX_QUERY_CHARS} characters")
        mode = str_param(params, "mode", required=False)
        if mode is not None and mode not in ("hybrid", "keyword", "vector"):
            raise BadRequest("mode must be hybrid, keyword or vector")
        wait_ms = int_param(params, "wait_ms", 0, MAX_WAIT_MS, 0) or 0
        sources, no_longterm = ctx.sources(ws, caller, params.get("sources"))
        max_results = int_param(params, "max_results", 1, 100) or ctx.config.search.max_results
        if not wait_ms and ws.syncer.status.last_sync is None and ctx.service.never_indexed(ws):
            # A workspace added a moment ago: its keyword rows come from the writer first.
            wait_ms = FIRST_INDEX_WAIT_MS
        asked = mode or ctx.config.search.mode
        embeds = ws.syncer.embedder is not None
        waited = (
            ctx.wait_fresh(ws, wait_ms, vectors=asked != "keyword" and embeds) if wait_ms else 0
        )
        # Checked before the search reads: what is indexed now is in the snapshot it reads.
        claim = check_freshness(
            ws, ctx.writer, ctx.watchers, since=started, waited_ms=waited, synced=bool(wait_ms)
        )
        results: list[SearchHit] = []
        outcome = None
        if sources:
            outcome = ctx.service.search(
                ws,
                query,
                index_first=False,
                # MEMORY.md hits are dropped below for callers that may not see them: ask for
                # a few more so the reply still has max_results when it can.
                max_results=min(100, max_results + (5 if no_longterm else 0)),
                min_score=float_param(params, "min_score", 0.0, 1.0),
                mode=mode,
                decay=bool_param(params, "decay"),
                mmr=bool_param(params, "mmr"),
                sources=tuple(sources),
                today=ctx.clock.today().isoformat(),  # what "yesterday" in the query means
            )
            # Long-term memory by what each file is, not its name: a hard link or a bind mount
            # of MEMORY.md is MEMORY.md.
            longterm = Longterm(ws.root) if no_longterm else None
            results = [
                hit
                for hit in outcome.hits
                if not (longterm is not None and longterm.holds(hit["path"]))
            ][:max_results]
        if ctx.recorder is not None and ctx.config.dreaming.record_recalls:
            recalled = [r for r in results if r["source"] == "memory"]  # the recorder copies
            # off the reply path
            ctx.recorder.submit(ws.root, query, recalled, folder=ws.dream_place.folder)
        return {
            "results": results,
            "freshness": claim.reply(  # type: ignore[typeddict-item]
                mode=outcome.mode if outcome else "keyword", searched=True
            ),
            "provider": outcome.provider if outcome else "none",
            "model": outcome.model if outcome else "",
            "mode": outcome.mode if outcome else (mode or "hybrid"),
            "note": outcome.note if outcome else "no source this caller may search",
            "sources": sources,
        }

    def get(self, params: Mapping[str, Any], caller: Caller) -> GetResult:
        only(params, "workspace", "path", "from", "lines")
        ctx = self.ctx
        ws = ctx.workspace(params)
        path = params.get("path")
        if not isinstance(path, str):
            raise BadRequest("path must be a string")
        allowed = allowed_sources(caller, ctx.config.scopes)

        def check(target: MemoryPath | str) -> None:
            """The one access decision of ``get``, on the resolved target."""
            if isinstance(target, str):  # a session transcript
                if "sessions" not in allowed or not may_see_sessions(ws, caller):
                    raise PathRefused(
                        "path refused: session transcripts are visible to their own agent only"
                    )
            elif target.longterm and "longterm" not in allowed:
                raise PathRefused("path refused: long-term memory is not available in this chat")
            elif "memory" not in allowed:
                raise PathRefused("path refused: memory is not available in this chat")

        result = ctx.service.get(
            ws,
            path,
            int_param(params, "from", 1, 10**9, 1) or 1,
            int_param(params, "lines", 1, 10_000),
            check=check,
        )
        return {
            "path": result.path,
            "text": result.text,
            "from": result.from_line,
            "lines": result.lines,
            "truncated": result.truncated,
            "next_from": result.next_from,
            "missing": result.missing,
            "freshness": ctx.freshness(ws),
        }

    def context(self, params: Mapping[str, Any], caller: Caller) -> ContextResult:
        """The session-start context: MEMORY.md, today's and yesterday's logs, under a budget."""
        only(params, "workspace", "max_chars")
        ctx = self.ctx
        ws = ctx.workspace(params)
        max_chars = int_param(params, "max_chars", 1, MAX_CONTEXT_CHARS) or DEFAULT_CONTEXT_CHARS
        allowed = allowed_sources(caller, ctx.config.scopes)
        longterm = "longterm" in allowed
        day = ctx.clock.today()

        def check(target: MemoryPath) -> None:
            # A daily log that is a link to MEMORY.md is long-term memory too.
            if target.longterm and not longterm:
                raise PathRefused("long-term memory is not available in this chat")

        sections = (
            session_context(
                ws.root,
                day=day,
                max_chars=max_chars,
                longterm=longterm,
                check=check,
                extra_paths=ws.extra_paths,
            )
            if "memory" in allowed
            else []
        )
        return {
            "text": "\n\n".join(f"## {s.title}: {s.citation}\n{s.text}" for s in sections),
            "sections": [
                {
                    "path": s.path,
                    "title": s.title,
                    "start_line": s.start_line,
                    "end_line": s.end_line,
                    "total_lines": s.total_lines,
                    "truncated": s.truncated,
                    "citation": s.citation,
                    "text": s.text,
                }
                for s in sections
            ],
            "date": day.isoformat(),
            "max_chars": max_chars,
            "longterm": longterm,
            "freshness": ctx.freshness(ws),
        }

    def flush_plan(self, params: Mapping[str, Any], caller: Caller) -> FlushPlan:
        """When and how an agent host flushes a session to memory before compaction."""
        only(params, "workspace")
        self.ctx.workspace(params)
        clock = self.ctx.clock
        return flush_plan(clock.local(), timezone=clock.timezone)  # type: ignore[return-value]
