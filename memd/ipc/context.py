"""What the protocol's methods share: the parts of the daemon they call, and the checks and
answers every family makes (which workspace a request names, what a caller may read, how fresh
a reply is).

The methods themselves (memd/ipc/read.py, write.py, dreams.py, workspaces.py, status.py) only
parse a request, read or submit work, and shape the reply; they never see a socket or msgpack.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.clock import Clock
from memd.dreams.recorder import RecallRecorder
from memd.dreams.schedule import Schedule
from memd.embed.autopull import ModelPull
from memd.freshness import check as check_freshness
from memd.once import AppendKeys
from memd.params import str_param
from memd.scopes import Caller, allowed_sources
from memd.service import MemoryService
from memd.watch import Watchers
from memd.workspace import Workspace
from memd.writer.jobs import URGENT
from memd.writer.writer import Writer
from memd_client.errors import BadRequest, MemdError
from memd_client.types import Freshness

__all__ = ["Context", "may_see_sessions"]

MAX_WAIT_MS = 60_000


def may_see_sessions(ws: Workspace, caller: Caller) -> bool:
    """Transcripts (and text taken from them) go to their own agent only; never to a caller
    that says nothing about itself."""
    return bool(caller.agent_id) and caller.agent_id == ws.agent_id


@dataclass
class Context:
    """The daemon's parts as the methods see them; thread-safe as the parts are."""

    service: MemoryService
    writer: Writer
    watchers: Watchers
    clock: Clock  # the user's time zone: a reload that changes it replaces the Clock
    registry_file: Path
    recorder: RecallRecorder | None = None
    schedule: Schedule | None = None
    append_keys: AppendKeys | None = None
    socket_path: str = ""
    started: dict[str, Any] = field(default_factory=dict)  # how memd was started
    model_pull: ModelPull | None = None  # the model fetched in the background, if any
    connections: int = 0
    started_at: float = field(default_factory=time.time)

    @property
    def config(self) -> Any:  # memd.config.Config (read at each call: a reload replaces it)
        return self.service.config

    def workspace(self, params: Mapping[str, Any]) -> Workspace:
        ref = str_param(params, "workspace")
        assert ref is not None
        return self.service.registry.get(ref)

    def targets(self, params: Mapping[str, Any]) -> list[Workspace]:
        """The workspace a request names, or every workspace when it names none."""
        if params.get("workspace") is None:
            return self.service.registry.all()
        return [self.workspace(params)]

    def freshness(
        self,
        ws: Workspace,
        *,
        since: float | None = None,
        walked_stale: int | None = None,
        mode: str | None = None,
    ) -> Freshness:
        """The freshness of a reply about ``ws`` that started at ``since`` (default now), in
        ``mode`` (default: the configured search mode, whose vectors must be there too)."""
        claim = check_freshness(
            ws, self.writer, self.watchers, since=since, walked_stale=walked_stale
        )
        return claim.reply(mode=mode or self.config.search.mode)  # type: ignore[return-value]

    def wait_fresh(self, ws: Workspace, wait_ms: int, *, vectors: bool) -> int:
        """Sync ``ws`` now (a walk of the whole workspace) and wait up to ``wait_ms`` for it,
        and with ``vectors`` for the vectors of what it indexed; return the time waited."""
        start = time.monotonic()
        future = self.writer.request_sync(ws, priority=URGENT)
        try:
            future.result(timeout=wait_ms / 1000)
            if vectors:
                left = wait_ms / 1000 - (time.monotonic() - start)
                self.writer.wait_embedded(ws, max(0.0, left))
        except (FutureTimeout, MemdError):
            pass  # the reply's freshness says what is still pending
        return int((time.monotonic() - start) * 1000)

    def sources(self, ws: Workspace, caller: Caller, requested: Any) -> tuple[list[str], bool]:
        """(the index sources this caller may search here, whether MEMORY.md is excluded)."""
        if requested is None or requested == "all" or requested == ["all"]:
            wanted = {"memory", "sessions"}
        elif isinstance(requested, str) and requested in ("memory", "sessions"):
            wanted = {requested}
        elif (
            isinstance(requested, list)
            and requested
            and all(s in ("memory", "sessions", "all") for s in requested)
        ):
            wanted = {"memory", "sessions"} if "all" in requested else set(requested)
        else:
            raise BadRequest("sources must be 'memory', 'sessions', 'all' or a list of them")
        allowed = allowed_sources(caller, self.config.scopes)
        sources: list[str] = [s for s in ("memory", "sessions") if s in wanted and s in allowed]
        if "sessions" in sources and not may_see_sessions(ws, caller):
            sources.remove("sessions")
        return sources, "longterm" not in allowed
