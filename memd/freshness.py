"""Freshness: how far a workspace's index is behind its files, as every reply carries it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from memd.index.store import Store
from memd.indexer import Indexer
from memd.registry import Workspace
from memd.watch import RESCAN_ALL, RESCANS, Watchers

__all__ = ["freshness", "workspace_problems"]


def freshness(
    ws: Workspace,
    indexer: Indexer,
    watchers: Watchers,
    *,
    waited_ms: int = 0,
    walked_stale: int = 0,
    synced: bool = False,
) -> dict[str, Any]:
    """How far the index of ``ws`` is behind its files, as every reply carries it.

    ``walked_stale``: files a walk of the workspace found changed (status walks it), which
    count as pending even before the watcher reports them. ``synced``: the caller waited for a
    sync, so a count kept from before it must not be repeated.
    """
    watcher = watchers.state(ws.root)
    watched = set(watcher.get("pending_keys") or ())
    queued = indexer.dirty_keys(ws)
    keys = {k for k in watched | queued if k not in RESCANS}
    with ws.index.reader() as store:
        generation = store.generation()
        unembedded = store.pending_count()
        # A changed path may already be indexed (an append, a sync someone waited for,
        # a reconcile that ran first): count only files whose size or mtime differ.
        stale = _stale_count(ws, store, keys, recount=synced)
    pending = max(stale, walked_stale)
    if queued & RESCANS:
        pending += 1  # a rescan is queued: something may have changed
    last_event = watcher.get("last_event_at")
    if RESCAN_ALL in watched and not (last_event and indexer.synced_since(ws, last_event)):
        pending += 1
    problems = workspace_problems(ws, watcher.get("state"))
    skipped = len(ws.syncer.skipped)
    return {
        "generation": generation,
        "pending_files": pending,
        "unembedded_files": unembedded,
        "skipped_files": skipped,
        "rebuilding": ws.syncer.rebuilding,
        "watcher": watcher.get("state"),
        "last_sync": ws.syncer.last_sync,
        "waited_ms": waited_ms,
        "problems": problems,
        "fresh": pending == 0 and skipped == 0 and not problems,
    }


# During a checkout of 1,000 files every reply checked each pending path (a row read and a
# stat: 32 ms a reply), and at 25 requests a second the replies queued behind that work for
# seconds. The rows are now read in one statement (5 ms for 1,000 paths), and with more pending
# paths than RECOUNT_ABOVE a count is kept for RECOUNT_AFTER_S (the watcher itself waits 1.5 s
# before it reports an edit), except for a reply to someone who waited for a sync.
RECOUNT_ABOVE = 64
RECOUNT_AFTER_S = 1.0
_counts: dict[Path, tuple[float, int]] = {}  # root -> (when, count)
_recounting: set[Path] = set()  # roots whose count one reply is taking now
_counts_lock = threading.Lock()


def _stale_count(ws: Workspace, store: Store, keys: set[str], *, recount: bool) -> int:
    """How many of ``keys`` differ from their rows; above RECOUNT_ABOVE a count up to a second
    old is given unless ``recount``. One reply at a time takes a new count: the others give the
    last one meanwhile (64 replies that found it old all counted, each slower for the others)."""
    many, now = len(keys) > RECOUNT_ABOVE, time.monotonic()
    claimed = many and not recount
    if claimed:
        with _counts_lock:
            kept = _counts.get(ws.root)
            if kept is not None and (now - kept[0] < RECOUNT_AFTER_S or ws.root in _recounting):
                return kept[1]
            _recounting.add(ws.root)
    count: int | None = None
    try:
        count = count_stale(store, ws.root, keys)
        return count
    finally:
        if many:
            with _counts_lock:  # the new count lands as the claim ends: no second recount
                if claimed:
                    _recounting.discard(ws.root)
                if count is not None:
                    _counts[ws.root] = (now, count)


def workspace_problems(ws: Workspace, watcher_state: object) -> list[str]:
    """Why a workspace's index cannot be trusted to follow its files, if it cannot."""
    problems = []
    if not ws.root.is_dir():
        problems.append(f"the workspace directory {ws.root} is gone (deleted, moved or unmounted)")
    elif watcher_state == "failed":
        problems.append("the file watcher failed: edits are found only by the periodic reconcile")
    return problems


def count_stale(store: Store, root: Path, keys: set[str]) -> int:
    """How many of ``keys`` are not indexed as they are on disk (size and mtime)."""
    if not keys:
        return 0  # most replies: nothing pending, no statement
    rows = store.file_stats(keys)
    stale = 0
    for rel in keys:
        try:
            st = os.stat(root / rel)
        except OSError:
            stale += rel in rows  # gone from disk: fresh if gone from the index too
            continue
        stale += rows.get(rel) != (st.st_size, st.st_mtime_ns)
    return stale
