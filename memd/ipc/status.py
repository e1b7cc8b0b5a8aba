"""``hello`` and ``status``: who answers, and everything a person needs to trust (or distrust)
the daemon and each workspace's index."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, cast

import apsw
import psutil

from memd import __version__
from memd.blas import blas_threads
from memd.changes import Changes
from memd.dreams.dream import last_runs
from memd.dreams.recall_store import RecallStore
from memd.ipc.context import Context
from memd.params import only
from memd.scopes import Caller
from memd_client.protocol import PROTOCOL_VERSION
from memd_client.types import HelloResult, Started, StatusResult

__all__ = ["Status"]


class Status:
    def __init__(self, ctx: Context, methods: list[str]) -> None:
        self.ctx = ctx
        self.methods = sorted(methods)
        self._process = psutil.Process()

    def hello(self, params: Mapping[str, Any], caller: Caller) -> HelloResult:
        only(params, "client", "protocol", "agent_id", "session_key", "chat_type", "channel")
        return {
            "protocol": PROTOCOL_VERSION,
            "server": "memd",
            "version": __version__,
            "pid": os.getpid(),
            "started": cast(Started, self.ctx.started),
            "methods": self.methods,
        }

    def status(self, params: Mapping[str, Any], caller: Caller) -> StatusResult:
        only(params, "workspace")
        ctx = self.ctx
        targets = ctx.targets(params)
        workspaces = []
        for ws in targets:
            started = time.time()
            st = ctx.service.status(ws.name)
            try:
                folder = ws.dream_place.folder
                recalls: dict[str, Any] = RecallStore(
                    ws.root, folder=folder, clock=ctx.clock
                ).counts()
            except Exception as exc:  # a damaged store is reported, not fatal
                recalls = {"error": str(exc)}
            nxt = ctx.schedule.next_run() if ctx.schedule else None
            st["dreaming"] = {
                "recall_store": recalls,
                "last_runs": last_runs(ws.root, ws.dream_place.folder),
                "enabled": ctx.config.dreaming.enabled,
                "next_run": nxt.isoformat() if nxt else None,
            }
            # status walked the workspace itself: that walk vouches for its files
            st["freshness"] = ctx.freshness(ws, since=started, walked_stale=st["files_stale"])
            watcher = ctx.watchers.state(ws.root)
            changes: Changes = watcher.get("pending_keys") or Changes()
            watcher["pending_keys"] = sorted(changes.paths)
            watcher["rescan_pending"] = changes.rescan_all
            st["watcher"] = watcher
            workspaces.append(st)
        # What the remote provider is sent, today and in total, and its batches: daemon-wide.
        return cast(
            StatusResult,
            {
                "daemon": self._daemon(),
                "embedding": ctx.service.provider_costs(),
                "workspaces": workspaces,
            },
        )

    def _daemon(self) -> dict[str, Any]:
        ctx = self.ctx
        service = ctx.service
        with self._process.oneshot():
            return {
                "pid": os.getpid(),
                "version": __version__,
                "started_at": ctx.started_at,
                "uptime_s": round(time.time() - ctx.started_at, 1),
                "rss_bytes": self._process.memory_info().rss,
                "sqlite_memory_bytes": apsw.memory_used(),  # page caches, statements, FTS5
                "cpu_percent": self._process.cpu_percent(interval=None),
                "threads": self._process.num_threads(),
                "blas_threads": blas_threads(),
                "readers": service.readers.health() if service.readers else None,
                "connections": ctx.connections,
                "socket": ctx.socket_path,
                "started": ctx.started,
                "embedder": self._embedder(),
                "model_pull": ctx.model_pull.status() if ctx.model_pull else None,
                "missing_workspaces": sorted(service.registry.missing),
            }

    def _embedder(self) -> dict[str, Any]:
        """What the daemon embeds with (whatever the workspaces), for doctor and status."""
        e = self.ctx.service.embedder
        if e is None:
            return {
                "active": "none",
                "model": "",
                "dims": 0,
                "reason": self.ctx.service.choice.reason,
            }
        return {"active": e.provider, "model": e.model, "dims": e.dims}
