"""The dreaming methods: ``record_recall``, ``promote`` and ``dream``. A run that writes is
submitted to the writer, which makes what it wrote searchable before the reply; a preview runs
here and writes nothing. What came from a transcript is shown only to a caller that may see it
(memd/dreams/privacy.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, cast

from memd.dreams.dream import PHASES, DreamOptions, run_dream, written_by
from memd.dreams.dreaming import run_promotion
from memd.dreams.privacy import without_transcripts
from memd.dreams.ranking import MANUAL, Thresholds
from memd.dreams.recall_store import RecallStore
from memd.dreams.similar import meaning_threshold
from memd.index.cache import cached_vectors
from memd.ipc.context import Context, may_see_sessions
from memd.params import bool_param, float_param, int_param, only, str_param
from memd.scopes import Caller
from memd.workspace import Workspace
from memd_client.errors import BadRequest, PathRefused, Timeout
from memd_client.types import DreamResult, PromoteResult, RecordRecallResult

__all__ = ["Dreams"]

RUN_WAIT_SECONDS = 60.0


class Dreams:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def record_recall(self, params: Mapping[str, Any], caller: Caller) -> RecordRecallResult:
        only(params, "workspace", "query", "results")
        ctx = self.ctx
        ws = ctx.workspace(params)
        query = str_param(params, "query")
        results = params.get("results")
        if not isinstance(results, list) or len(results) > 100:
            raise BadRequest("results must be a list of at most 100 items")
        clean = []
        for item in results:
            if not isinstance(item, dict):
                raise BadRequest("each result must be a map with path, start_line, end_line")
            path = str_param(item, "path")
            start = int_param(item, "start_line", 1, 10**9)
            end = int_param(item, "end_line", 1, 10**9)
            if start is None or end is None or end < start:
                raise BadRequest("each result needs start_line <= end_line")
            score = float_param(item, "score", 0.0, 1.0)
            clean.append({"path": path, "start_line": start, "end_line": end, "score": score})
        folder = ws.dream_place.folder
        if ctx.recorder is not None:
            store = ctx.recorder.store(ws.root, folder)  # the recorder's: no parse per call
        else:
            store = RecallStore(ws.root, folder=folder, clock=ctx.clock)
        with _refused_write("record recalls"):
            return {"recorded": store.record(query or "", clean)}

    def promote(self, params: Mapping[str, Any], caller: Caller) -> PromoteResult:
        only(
            params,
            "workspace",
            "apply",
            "explain",
            "include_promoted",
            "limit",
            "min_score",
            "min_recall_count",
            "min_unique_queries",
        )
        ctx = self.ctx
        ws = ctx.workspace(params)
        thresholds = _thresholds(params)
        if ctx.recorder is not None:
            ctx.recorder.wait_idle()
        promotion = functools.partial(
            run_promotion,
            ws.root,
            thresholds,
            explain=str_param(params, "explain", required=False),
            include_promoted=bool(bool_param(params, "include_promoted")),
            max_chars=ctx.config.dreaming.memory_max_chars,
            clock=ctx.clock,
            folder=ws.dream_place.folder,
            redact=ctx.config.index.redact,
        )
        with _refused_write("promote"):
            if bool_param(params, "apply"):
                # MEMORY.md is written by the writer, and searchable before the reply.
                future = ctx.writer.submit(
                    ws,
                    functools.partial(promotion, apply=True),
                    indexes=lambda r: {"MEMORY.md"} if r["applied"] else set(),
                )
                result = _waited(future, "promote", "MEMORY.md")
            else:  # a preview only reads
                result = promotion()
        result = self._shown_to(ws, caller, result)
        result["workspace"] = ws.name
        return cast(PromoteResult, result)

    def dream(self, params: Mapping[str, Any], caller: Caller) -> DreamResult:
        """Run dreaming's phases (all three unless ``phase`` names one); ``apply`` writes the
        recall store, MEMORY.md and DREAMS.md, and replies once they are searchable."""
        only(params, "workspace", "phase", "apply")
        ctx = self.ctx
        ws = ctx.workspace(params)
        phase = str_param(params, "phase", required=False) or "all"
        if phase not in ("all", *PHASES):
            raise BadRequest(f"phase must be light, rem, deep or all, not {phase!r}")
        phases = PHASES if phase == "all" else (phase,)
        if ctx.recorder is not None:
            ctx.recorder.wait_idle()
        with _refused_write("dream"):
            if bool_param(params, "apply"):
                result = _waited(self.start(ws, phases), "dream", "DREAMS.md")
            else:  # a preview computes the run on copies and writes nothing
                result = self._run(ws, phases, apply=False)()
        result = self._shown_to(ws, caller, result)
        result["workspace"] = ws.name
        return cast(DreamResult, result)

    def start(self, ws: Workspace, phases: Sequence[str] = PHASES) -> Future[dict[str, Any]]:
        """Submit a dreaming run that writes (the schedule's, or ``dream`` with ``apply``)."""
        return self.ctx.writer.submit(ws, self._run(ws, phases, apply=True), indexes=written_by)

    def _run(
        self, ws: Workspace, phases: Sequence[str], *, apply: bool
    ) -> Callable[[], dict[str, Any]]:
        """The dreaming run, ready to call: dreams.dream.run_dream with what it needs from the
        configuration, the embedder and the workspace, taken now."""
        config = self.ctx.config
        embedder = self.ctx.service.embedder
        threshold = meaning_threshold(embedder.model) if embedder is not None else None
        options = DreamOptions(
            phases=phases,
            apply=apply,
            memory_max_chars=config.dreaming.memory_max_chars,
            diary_max_chars=config.dreaming.diary_max_chars,
            redact=config.index.redact,
        )
        vectors = (
            cached_vectors(embedder, self.ctx.service.cache) if embedder and threshold else None
        )
        return functools.partial(
            run_dream,
            ws.root,
            options,
            vectors=vectors,
            meaning_threshold=threshold,
            transcripts=ws.dream_transcripts(redact=config.index.redact),
            clock=self.ctx.clock,
            folder=ws.dream_place.folder,
        )

    @staticmethod
    def _shown_to(ws: Workspace, caller: Caller, result: dict[str, Any]) -> dict[str, Any]:
        """A dreaming reply as ``caller`` may see it: what came from the workspace's
        transcripts only for a caller that may see them (memd/dreams/privacy.py)."""
        if may_see_sessions(ws, caller):
            return result
        shown, left_out = without_transcripts(result)
        shown["withheld_from_transcripts"] = left_out
        return dict(shown)


def _thresholds(params: Mapping[str, Any]) -> Thresholds:
    overrides: dict[str, Any] = {}
    if (v := int_param(params, "limit", 1, 1000)) is not None:
        overrides["limit"] = v
    if (f := float_param(params, "min_score", 0.0, 1.0)) is not None:
        overrides["min_score"] = f
    if (v := int_param(params, "min_recall_count", 0, 10_000)) is not None:
        overrides["min_recall_count"] = v
    if (v := int_param(params, "min_unique_queries", 0, 10_000)) is not None:
        overrides["min_unique_queries"] = v
    return dataclasses.replace(MANUAL, **overrides) if overrides else MANUAL


def _waited(future: Future[dict[str, Any]], what: str, file: str) -> dict[str, Any]:
    try:
        return future.result(timeout=RUN_WAIT_SECONDS)
    except FutureTimeout:
        raise Timeout(
            f"{what}: the writer did not finish within {RUN_WAIT_SECONDS:g} s; the run goes "
            f"on and {file} will show it"
        ) from None


@contextlib.contextmanager
def _refused_write(what: str) -> Iterator[None]:
    """A write into the workspace the OS refuses (read-only, disk full) is a typed error."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise PathRefused(f"cannot {what}: {exc.strerror or exc}{where}") from None
