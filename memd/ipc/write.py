"""The writing methods: ``append`` (to today's daily log, under an idempotency key that outlives
the daemon) and ``reindex``. The writes themselves are the writer's; these check the request,
submit, wait, and shape the reply."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import date
from typing import Any, cast

from memd.changes import Changes
from memd.flush import SILENT_REPLY, check_flush_target, daily_log, is_silent
from memd.ipc.context import Context
from memd.once import APPEND_KEY_SECONDS, APPEND_KEYS_KEPT, AppendKeys, Once, crash_point
from memd.params import bool_param, only, str_param
from memd.scopes import Caller
from memd.text import first_control
from memd.workspace import Workspace
from memd.writer.jobs import URGENT
from memd_client.errors import BadRequest, MemdError, Timeout
from memd_client.types import AppendResult, ReindexEstimate, ReindexReport, ReindexResult

__all__ = ["Write"]

APPEND_WAIT_SECONDS = 60.0


class Write:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # append's idempotency keys, by (workspace root, key): runs in flight and their
        # results here, and on disk with the writes they guard (a retry after a crash)
        self._once = Once(kept=APPEND_KEYS_KEPT, seconds=APPEND_KEY_SECONDS)
        self._keys = ctx.append_keys or AppendKeys(
            None, kept=APPEND_KEYS_KEPT, seconds=APPEND_KEY_SECONDS
        )

    def append(self, params: Mapping[str, Any], caller: Caller) -> AppendResult:
        only(params, "workspace", "text", "idempotency_key", "path", "flush")
        ctx = self.ctx
        ws = ctx.workspace(params)
        text = str_param(params, "text")
        assert text is not None
        day = ctx.clock.today()
        path = str_param(params, "path", required=False)
        if path is not None:  # the caller says where it means to write: only today's log
            check_flush_target(path, day)
        if bool_param(params, "flush") and is_silent(text):
            # A flush that found nothing worth keeping: nothing is written.
            return {
                "path": daily_log(day),
                "start_line": None,
                "end_line": None,
                "written": False,
                "note": f"{SILENT_REPLY}: nothing to store",
                "freshness": ctx.freshness(ws),
            }
        bad = first_control(text.replace("\r\n", "\n"), allowed="\t\n")
        if bad is not None:
            raise BadRequest(
                f"text holds the control character U+{ord(bad):04X}; only tab and newline are "
                "allowed (escape sequences in memory would reach every terminal that shows it)"
            )
        key = params.get("idempotency_key")
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 128):
            raise BadRequest("idempotency_key must be a string of 1 to 128 characters")
        if key is None:
            return self._append(ws, text, day)
        result, duplicate = self._once.run(
            (ws.root, key),
            text,
            lambda: dict(self._append_keyed(ws, key, text, day)),
            wait=APPEND_WAIT_SECONDS,
        )
        if duplicate or result.get("duplicate"):
            result["duplicate"] = True
            result["freshness"] = ctx.freshness(ws)
        return result  # type: ignore[return-value]

    def _append_keyed(self, ws: Workspace, key: str, text: str, day: date) -> AppendResult:
        """An append under a key that outlives the daemon: the key is on disk before the text
        (memd/once.py, AppendKeys), so a retry after a crash learns whether the text landed
        and writes it only if it did not. MEMD_CRASH_AT stops the daemon between the steps."""
        crash_point("append:received")
        earlier = self._keys.recall(ws.root, key, text)
        if earlier is not None:
            # Written before a crash (or before this process forgot the key): it may not be
            # indexed yet, and the reply promises that it is searchable.
            with contextlib.suppress(FutureTimeout, MemdError):
                future = self.ctx.writer.request_sync(
                    ws, Changes.of([earlier["path"]]), priority=URGENT
                )
                future.result(timeout=APPEND_WAIT_SECONDS)
            landed = {
                **earlier,
                "written": True,
                "note": None,
                "duplicate": True,
                "freshness": self.ctx.freshness(ws),
            }
            return cast(AppendResult, landed)
        self._keys.intend(ws.root, key, text, daily_log(day))
        crash_point("append:intent")
        result = self._append(ws, text, day)
        crash_point("append:written")
        self._keys.done(ws.root, key, dict(result))
        crash_point("append:done")
        return result

    def _append(self, ws: Workspace, text: str, day: date) -> AppendResult:
        ctx = self.ctx
        try:
            appended = ctx.writer.append(ws, text, day=day).result(timeout=APPEND_WAIT_SECONDS)
        except FutureTimeout:
            raise Timeout(
                f"append: the index did not catch up within {APPEND_WAIT_SECONDS:g} s; "
                "the text is on disk"
            ) from None
        limit = ctx.config.index.max_file_bytes
        try:
            size = (ws.root / appended.path).stat().st_size
        except OSError:
            size = 0
        note = None
        if size > limit:
            note = (
                f"{appended.path} is {size} bytes, over index.max_file_bytes ({limit}): only its "
                f"first {limit} bytes are indexed, so this text is on disk but not searchable "
                "until the limit is raised"
            )
        return {
            "path": appended.path,
            "start_line": appended.start_line,
            "end_line": appended.end_line,
            "written": True,
            "note": note,
            "freshness": ctx.freshness(ws),
        }

    def reindex(self, params: Mapping[str, Any], caller: Caller) -> ReindexResult:
        only(params, "workspace", "force", "wait", "dry_run")
        ctx = self.ctx
        targets = ctx.targets(params)
        force = bool(bool_param(params, "force"))
        wait = bool_param(params, "wait")
        if bool_param(params, "dry_run"):
            if not force:
                raise BadRequest("dry_run estimates a rebuild: it goes with force")
            # Nothing is queued or written: what a rebuild would send, counted here.
            return {"estimates": [self._estimate(ws) for ws in targets]}
        futures = [(ws, ctx.writer.reindex(ws, force=force)) for ws in targets]
        if wait is False:
            return {"queued": [ws.name for ws, _ in futures]}
        reports: list[ReindexReport] = []
        for ws, future in futures:
            r = future.result()
            reports.append(
                {
                    "workspace": ws.name,
                    "scanned": r.scanned,
                    "indexed": r.indexed,
                    "unchanged": r.unchanged,
                    "removed": r.removed,
                    "embedded": r.embedded,
                    "pending_files": r.pending_files,
                    "rebuilt": r.rebuilt,
                    "errors": [list(e) for e in r.errors],
                    "seconds": round(r.seconds, 3),
                }
            )
        return {"workspaces": reports}

    def _estimate(self, ws: Workspace) -> ReindexEstimate:
        embedder = self.ctx.service.embedder
        estimate = {
            "workspace": ws.name,
            "provider": embedder.provider if embedder else "none",
            "model": embedder.model if embedder else "fts-only",
            **ws.syncer.estimate(),
        }
        return cast(ReindexEstimate, estimate)
