"""What the writer's queue holds: its jobs and their priorities, and how a job's future is
handed on (a job that replaced another resolves both).

Its own module: the jobs the writer thread (memd/writer/writer.py) queues and its embedding
steps (memd/writer/embedding.py) queue too.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.index.report import SyncReport

__all__ = ["RECONCILE", "URGENT", "WATCH", "Job", "claim", "refuse_left", "relay"]


URGENT, WATCH, RECONCILE = 0, 1, 2


@dataclass(order=True)
class Job:
    priority: int
    seq: int
    kind: str = field(compare=False)
    root: Path = field(compare=False)
    future: Future[Any] = field(compare=False)
    payload: Any = field(compare=False, default=None)


def claim(future: Future[Any]) -> bool:
    """Mark ``future`` running (a sync that goes on after its first slice already is); False
    when it was cancelled."""
    return future.running() or future.set_running_or_notify_cancel()


def relay(source: Future[SyncReport], *, target: Future[SyncReport]) -> None:
    if target.done() or not claim(target):
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def refuse_left(jobs: queue.Queue[Job], error: Exception) -> None:
    """Answer every job left in ``jobs`` with ``error`` (the writer has stopped). A job that
    another replaced (``skip``) is answered through that one, and one answered already (it was
    replaced, and the job that replaced it has run) keeps its answer."""
    while True:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            return
        if job.kind in ("stop", "skip") or job.future.done():
            continue
        if claim(job.future):
            job.future.set_exception(error)
