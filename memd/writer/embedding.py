"""The writer's embedding steps: between jobs, when no sync is queued, the writer thread embeds
a step of the pending text (EMBED_STEP_CHARS) of one workspace after the other, so a long
embedding backlog never holds up a write that someone waits for; read-your-writes waits for
the vectors step by step, and a workspace a search waits on goes before the others.

Its own module: the work the writer does when no job waits, apart from the jobs themselves.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from memd.embed.base import DOCUMENT_JOB_CHARS
from memd.registry import Workspaces
from memd.workspace import Workspace
from memd.writer.jobs import RECONCILE, Job

__all__ = ["EMBED_STEP_CHARS", "EmbeddingSteps"]

logger = logging.getLogger(__name__)


# New text the writer embeds between two jobs. A file's texts are embedded over as many steps
# as it takes (they wait in the embedding cache), so an append waits for one step, not for a
# whole file (a daily log of 30 chunks is 20 s of a slow CPU).
EMBED_STEP_CHARS = DOCUMENT_JOB_CHARS


class EmbeddingSteps:
    """The embedding steps of the Writer (memd/writer/writer.py), which holds the state below."""

    workspaces: Workspaces
    _queue: queue.PriorityQueue[Job]
    _seq: itertools.count[int]
    _stopping: threading.Event
    _progress: threading.Condition
    _steps: int
    _embed_cursor: int
    _wanted: dict[str, int]  # workspace name -> searches waiting for its vectors

    def wait_embedded(self, ws: Workspace, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no file of ``ws`` lacks vectors; False when some
        still does (the time ran out, or nothing embeds now: no provider, a failure's backoff,
        a rebuild)."""
        deadline = time.monotonic() + timeout
        with self._progress:
            self._wanted[ws.name] = self._wanted.get(ws.name, 0) + 1
        try:
            while True:
                with self._progress:
                    seen = self._steps
                if not ws.syncer.has_pending():
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or not self._may_embed(ws) or self._stopping.is_set():
                    return False
                with self._progress:
                    if self._steps == seen:
                        self._progress.wait(left)
        finally:
            with self._progress:
                self._wanted[ws.name] -= 1
                if not self._wanted[ws.name]:
                    del self._wanted[ws.name]

    def _stepped(self) -> None:
        with self._progress:
            self._steps += 1
            self._progress.notify_all()

    @staticmethod
    def _may_embed(ws: Workspace) -> bool:
        """Whether the live index of ``ws`` has embedding to do now; not while a rebuild embeds
        the same texts (both at once went at a third of the speed; the swap catches up)."""
        s = ws.syncer
        return (
            bool(s.embedder)
            and not s.status.rebuilding
            and not s.backing_off()
            and not s.resting()
            and s.has_pending()
        )

    def _has_embedding_work(self) -> bool:
        return any(self._may_embed(ws) for ws in self.workspaces.all())

    def _embed_one(self) -> None:
        """Embed one step of one workspace, if any: one a search waits on first, else the
        next in turn (round-robin)."""
        workspaces = self.workspaces.all()
        with self._progress:
            wanted = set(self._wanted)
        first = [ws for ws in workspaces if ws.name in wanted and self._may_embed(ws)]
        for i in range(len(workspaces)):
            if first:
                ws = first[0]
            else:
                ws = workspaces[(self._embed_cursor + i) % len(workspaces)]
                if not self._may_embed(ws):
                    continue
                self._embed_cursor = (self._embed_cursor + i + 1) % len(workspaces)
            # An embedder with a step of its own (a remote API: one wave of parallel requests)
            # takes the texts of as many files as the step holds.
            step = ws.syncer.embedder.step_chars if ws.syncer.embedder else 0
            try:
                ws.syncer.embed_pending(
                    max_files=None if step else 1,
                    max_chars=EMBED_STEP_CHARS,
                    wake=self._nudge if step else None,  # its wave, sent in the background, is back
                )
            except Exception as exc:
                logger.warning("embedding in %s failed: %s", ws.name, exc)
            self._stepped()
            return

    def _nudge(self) -> None:
        """Wake the writer (a wave of embedding requests is back): a job that does nothing."""
        if not self._stopping.is_set():
            self._queue.put(Job(RECONCILE, next(self._seq), "skip", Path("/"), Future()))
