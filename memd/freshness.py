"""Freshness: how far a workspace's index is behind its files, as every reply carries it.

``fresh: true`` is a claim checked at the reply, not assumed: every file's text on disk when the
reply started is in the index the reply read (its keyword rows; its vectors too for a search
that used them). Something has to vouch for the files nobody reported yet:

- the change probe (memd/watch/probe.py), read by the reply itself, names every edit made since
  it was armed, and a walk of the whole workspace that started after that covers the rest;
- or a walk that started after the reply did (a search that waited with ``wait_ms``; ``status``
  walks the workspace itself).

Each changed path the probe, the watcher or the writer knows counts as pending until its size
and mtime are those of its row, and a path the writer is indexing right now counts until its
rows are committed. Without a probe (polling, a system without inotify) a reply that did not
wait says why it is not fresh.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.changes import Changes
from memd.index.db import snapshot
from memd.index.store import Store
from memd.markdown.discover import memory_file
from memd.watch import Watchers
from memd.workspace import Workspace
from memd.writer.writer import Writer

__all__ = ["Claim", "check", "count_stale", "freshness", "stale_keys", "workspace_problems"]


@dataclass
class Claim:
    """What a reply can say of one workspace's index; ``reply`` turns it into the wire map."""

    generation: int
    pending: int
    unembedded: int
    skipped: int
    rebuilding: bool
    watcher: Any
    last_sync: float | None
    waited_ms: int
    problems: list[str]
    vectors_current: Callable[[], bool]  # the index's vectors are the active embedder's
    embeds: bool  # there is an embedder: a search that is not "keyword" uses vectors

    def reply(self, *, mode: str = "hybrid", searched: bool = False) -> dict[str, Any]:
        """The freshness map of a reply; ``mode``: the search mode the reply used (or would
        use): unless it is "keyword", the vectors must be there too. ``searched``: a search
        used that mode, which it does only with vectors of the active embedder."""
        vectors = self.embeds and mode != "keyword"
        fresh = self.pending == 0 and self.skipped == 0 and not self.problems
        if vectors:
            fresh = fresh and self.unembedded == 0 and (searched or self.vectors_current())
        return {
            "generation": self.generation,
            "pending_files": self.pending,
            "unembedded_files": self.unembedded,
            "skipped_files": self.skipped,
            "rebuilding": self.rebuilding,
            "watcher": self.watcher,
            "last_sync": self.last_sync,
            "waited_ms": self.waited_ms,
            "problems": self.problems,
            "fresh": fresh,
        }


def freshness(
    ws: Workspace,
    writer: Writer,
    watchers: Watchers,
    *,
    since: float | None = None,
    waited_ms: int = 0,
    walked_stale: int | None = None,
    synced: bool = False,
    mode: str = "hybrid",
) -> dict[str, Any]:
    """The freshness map of a reply about ``ws`` in search ``mode`` (see :func:`check`)."""
    claim = check(
        ws,
        writer,
        watchers,
        since=since,
        waited_ms=waited_ms,
        walked_stale=walked_stale,
        synced=synced,
    )
    return claim.reply(mode=mode)


def check(
    ws: Workspace,
    writer: Writer,
    watchers: Watchers,
    *,
    since: float | None = None,
    waited_ms: int = 0,
    walked_stale: int | None = None,
    synced: bool = False,
) -> Claim:
    """How far the index of ``ws`` is behind its files now.

    ``since``: when the reply started (wall clock; default now). ``walked_stale``: the files a
    walk of the workspace, begun after ``since``, found to differ from the index (status walks
    it): they count as pending, and the walk vouches for the rest. ``synced``: the caller waited
    for a sync, so a count kept from before it must not be repeated.
    """
    since = time.time() if since is None else since
    # The probe first: what it read is handed on to the watcher, and every path is stat'ed
    # after the read that reported it.
    probe = watchers.probe(ws.root)
    watcher = watchers.state(ws.root)
    watched: Changes = watcher.get("pending_keys") or Changes()
    queued, running = writer.pending_keys(ws)
    probed = set(probe.keys) if probe is not None else set()
    keys = {*watched.paths, *queued.paths, *probed} - running.paths

    def rescanned(when: float) -> bool:
        return writer.rescanned_since(ws, when)

    with ws.index.reader() as store, snapshot(store.conn):  # one moment: generation and counts
        generation = store.generation()
        unembedded = store.pending_count()
        # A changed path may already be indexed (an append, a sync someone waited for,
        # a reconcile that ran first): count only files whose size or mtime differ.
        stale, found = _stale_count(ws, store, keys, recount=synced)
    if found is not None and probed:
        watchers.settle(ws.root, (probed & keys) - found)
    # Being indexed now: the rows are not committed yet.
    pending = stale + len(running.paths)
    if walked_stale is not None:
        pending = max(pending, walked_stale)
    if (queued | running).rescans:
        pending += 1  # a rescan is queued or runs: something may have changed
    # A walk of every file, begun after the reply started, vouches for what nobody reported.
    walked = walked_stale is not None or rescanned(since)
    if watched.rescan_all and not walked and not rescanned(watcher.get("rescan_at") or since):
        pending += 1  # the watcher asks for a rescan (a folder changed, events were lost)
    problems = workspace_problems(ws, watcher.get("state"))
    unread = writer.walk_errors(ws)
    problems += [f"{rel or 'the index'}: {why}" for rel, why in unread[:5]]
    if len(unread) > 5:
        problems.append(f"... and {len(unread) - 5} more files the last walk could not index")
    if probe is not None:
        if not walked and not rescanned(probe.rescan_after):
            pending += 1  # edits from before the probe could see them: a rescan comes
    elif not walked and not problems:
        problems.append(_unvouched(watcher))
    skipped = len(ws.syncer.status.skipped) + _unreadable(ws)
    return Claim(
        generation=generation,
        pending=pending,
        unembedded=unembedded,
        skipped=skipped,
        rebuilding=ws.syncer.status.rebuilding,
        watcher=watcher.get("state"),
        last_sync=ws.syncer.status.last_sync,
        waited_ms=waited_ms,
        problems=problems,
        vectors_current=lambda: _vectors_current(ws),
        embeds=ws.syncer.embedder is not None,
    )


def _unvouched(watcher: dict[str, Any]) -> str:
    """Why nothing vouches for the edits of the last moments (no change probe)."""
    if watcher.get("state") == "polling":
        how = "edits are found by polling"
    elif watcher.get("probe_error"):
        how = str(watcher["probe_error"])
    else:
        how = "no change probe on this system"
    return f"{how}: only a reply that waited for a rescan (wait_ms) can say it is fresh"


def _vectors_current(ws: Workspace) -> bool:
    """Whether the index holds vectors of the active embedder (not while another model's are
    being rebuilt, nor kept from a provider that is unavailable)."""
    try:
        return ws.syncer.state()[0] == "valid"
    except Exception:  # an index that cannot be read is no index of vectors
        return False


def _unreadable(ws: Workspace) -> int:
    transcripts = ws.syncer.transcripts
    return len(transcripts.unreadable) if transcripts is not None else 0


# During a checkout of 1,000 files every reply checked each pending path (a row read and a
# stat: 32 ms a reply), and at 25 requests a second the replies queued behind that work for
# seconds. The rows are now read in one statement (5 ms for 1,000 paths), and with more pending
# paths than RECOUNT_ABOVE a count is kept for RECOUNT_AFTER_S (the watcher itself waits 1.5 s
# before it reports an edit), except for a reply to someone who waited for a sync. Only a count
# above zero is kept: it says "not fresh", which stays true of an older count; zero is counted
# anew, or a burst that came after it would be called fresh.
RECOUNT_ABOVE = 64
RECOUNT_AFTER_S = 1.0
_counts: dict[Path, tuple[float, int]] = {}  # root -> (when, count)
_recounting: set[Path] = set()  # roots whose count one reply is taking now
_counts_lock = threading.Lock()


def _stale_count(
    ws: Workspace, store: Store, keys: set[str], *, recount: bool
) -> tuple[int, set[str] | None]:
    """How many of ``keys`` differ from their rows, and which (None when a kept count was
    given). Above RECOUNT_ABOVE a count up to a second old is given unless ``recount`` or it
    was zero. One reply at a time takes a new count: the others give the last one meanwhile
    (64 replies that found it old all counted, each slower for the others)."""
    many, now = len(keys) > RECOUNT_ABOVE, time.monotonic()
    claimed = many and not recount
    if claimed:
        with _counts_lock:
            kept = _counts.get(ws.root)
            if (
                kept is not None
                and kept[1] > 0
                and (now - kept[0] < RECOUNT_AFTER_S or ws.root in _recounting)
            ):
                return kept[1], None
            _recounting.add(ws.root)
    found: set[str] | None = None
    try:
        found = stale_keys(store, ws.root, keys, skipped={p for p, _ in ws.syncer.status.skipped})
        return len(found), found
    finally:
        if many:
            with _counts_lock:  # the new count lands as the claim ends: no second recount
                if claimed:
                    _recounting.discard(ws.root)
                if found is not None:
                    _counts[ws.root] = (now, len(found))


def workspace_problems(ws: Workspace, watcher_state: object) -> list[str]:
    """Why a workspace's index cannot be trusted to follow its files, if it cannot."""
    problems = []
    moved = ws.root_problem()
    if moved is not None:
        problems.append(moved)
    elif watcher_state == "failed":
        problems.append("the file watcher failed: edits are found only by the periodic reconcile")
    cap = ws.syncer.config.max_file_bytes
    for rel, size in sorted(ws.syncer.status.partial.items()):
        problems.append(
            f"{rel} is {size:,} bytes, over index.max_file_bytes ({cap:,}): only its first "
            f"{cap:,} bytes are indexed, its newest text is not searchable"
        )
    return problems


def stale_keys(
    store: Store, root: Path, keys: set[str], *, skipped: set[str] | frozenset[str] = frozenset()
) -> set[str]:
    """Those of ``keys`` that are not indexed as they are on disk (size and mtime). A path with
    no row is stale only if it is a memory file that is indexed at all (not ignored, not a
    symlink, not ``skipped``: those are counted as skipped)."""
    if not keys:
        return set()  # most replies: nothing pending, no statement
    rows = store.file_stats(keys)
    stale = set()
    for rel in keys:
        try:
            st = os.stat(root / rel)
        except OSError:
            if rel in rows:  # gone from disk: fresh if gone from the index too
                stale.add(rel)
            continue
        row = rows.get(rel)
        if row is None:
            if rel in skipped or memory_file(root, rel)[0] == "gone":
                continue
            stale.add(rel)
        elif row != (st.st_size, st.st_mtime_ns):
            stale.add(rel)
    return stale


def count_stale(store: Store, root: Path, keys: set[str]) -> int:
    """How many of ``keys`` are not indexed as they are on disk (size and mtime)."""
    return len(stale_keys(store, root, keys))
