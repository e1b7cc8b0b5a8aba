"""Sync: bring a workspace index in line with the Markdown on disk, file by file.

Each changed file is replaced in one transaction (chunks, FTS rows, the vectors already in the
cache, its file row), so keyword search sees it at once; the missing vectors are embedded next
and added per file. A file whose vectors could not be made stays ``pending``: never reported
clean. A different model or chunking rebuilds into a temporary database that is swapped in only
when complete, while searches keep reading the old one.

The Syncer is built in layers, a module each: the vectors of chunks (memd/index/embedding.py),
the embedding backlog (memd/index/backlog.py), the per-file phase (memd/index/files.py) and
the rebuild (memd/index/rebuild.py); this module holds its state and its entry points. What
callers read of it is ``status`` (memd/index/report.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from memd.changes import Changes
from memd.config import IndexConfig, SessionsConfig
from memd.embed.base import BatchQueue, Embedder
from memd.index.cache import EmbeddingCache
from memd.index.db import atomic, translate_errors
from memd.index.index import Index
from memd.index.rebuild import Rebuilding
from memd.index.report import Activity, Progress, SyncReport, SyncStatus, tracked
from memd.index.transcripts import Transcripts

__all__ = ["Syncer"]


class Syncer(Rebuilding):
    """Indexes one workspace with one embedder (or none). Not thread-safe: one writer only."""

    def __init__(
        self,
        index: Index,
        root: Path,
        *,
        config: IndexConfig,
        embedder: Embedder | None = None,
        cache: EmbeddingCache | None = None,
        extra_paths: tuple[str, ...] = (),
        protect: bool = False,
        sessions_dir: Path | None = None,
        sessions: SessionsConfig | None = None,
        batches: BatchQueue | None = None,
    ) -> None:
        self.index = index
        self.root = root
        self.config = config
        self.embedder = embedder
        self.cache = cache
        # The provider's Batch API, for a first index or a rebuild large enough (memd/embed/batch.py).
        self.batches = batches
        self._rest_until = 0.0  # time.monotonic() before which only a batch or wave brings vectors
        self._background = None  # the writer's wave of requests in flight
        self.extra_paths = extra_paths
        self.transcripts = (
            Transcripts(sessions_dir, sessions or SessionsConfig(), redact_text=config.redact)
            if sessions_dir is not None
            else None
        )
        # True when the embedder is None because a provider is unavailable (not by choice):
        # then an index with vectors is kept as it is instead of being rebuilt keyword-only.
        self.protect = protect
        # What callers read of this syncer (status, freshness, the writer); only it writes there.
        self.status = SyncStatus()
        # After an embedding failure, pending files wait (30 s doubling to 1 h) before the next
        # attempt, so a provider outage does not stall every sync on retries.
        self._embed_failures = 0
        self._token_counts: dict[bytes, int] = {}
        self._token_owner: Embedder | None = None
        # Set by an explicit reindex: the next full reconcile compares every file's content.
        self._look_next = False
        self._retry_at = 0.0  # time.monotonic() of the next allowed attempt
        # Held by every write to the live index; a rebuild holds it only to publish.
        self.lock = threading.RLock()

    def use_embedder(self, embedder: Embedder | None, *, protect: bool) -> None:
        """Embed with ``embedder`` from now on; ``protect``: it is None because the provider is
        unavailable, so an index with vectors is kept as it is."""
        self.embedder, self.protect = embedder, protect

    def compare_contents_next(self) -> None:
        """Make the next full reconcile compare every file's content, not its size and mtime
        (an explicit reindex)."""
        self._look_next = True

    @property
    def sessions_dir(self) -> Path | None:
        return self.transcripts.directory if self.transcripts is not None else None

    def sessions_due(self) -> bool:
        """Whether some transcript should be reindexed now (checked cheaply every few seconds)."""
        return self.transcripts is not None and self.transcripts.due(self.index)

    def state(self) -> tuple[str, str | None]:
        """("valid" | "missing" | "protected" | "mismatched", the differing field)."""
        with self.index.reader() as store:
            stored = Index.stored_identity(store.conn)
        expected = self.expected_identity()
        reason = expected.mismatch(stored)
        if reason is None:
            return "valid", None
        if reason == "missing":
            return "missing", reason
        if self.protect and stored is not None and stored.semantic and not expected.semantic:
            return "protected", reason
        return "mismatched", reason

    def sync(
        self,
        *,
        force: bool = False,
        embed: bool = True,
        allow_rebuild: bool = True,
        paths: Changes | None = None,
        progress: Progress | None = None,
    ) -> SyncReport:
        """Reconcile the index with the files; rebuild when forced or when the identity changed.

        With ``embed=False`` only the keyword rows are written (files with missing vectors stay
        pending), which is how a first search on a new workspace gets its answer quickly. With
        ``allow_rebuild=False`` (the daemon, which rebuilds on a thread of its own) a changed
        identity only brings the keyword rows of the live index up to date.
        """
        started = time.monotonic()
        state, reason = self.state()
        if force:
            self.reset_backoff()
        rebuild_now = force or (
            state == "mismatched" and allow_rebuild and not self.status.rebuilding
        )
        if rebuild_now and not force and self.backing_off():
            return SyncReport(
                reason=reason, errors=[("", f"rebuild waits: {self.status.last_error}")]
            )
        if rebuild_now:
            return self.rebuild(progress=progress, reason="forced" if force else reason)
        report = SyncReport(reason=reason)
        with self.lock, translate_errors("sync"):
            writer = self.index.writer()
            if state == "missing":
                if writer.counts(vectors=False)["files"]:
                    if allow_rebuild:
                        return self.rebuild(progress=progress, reason="identity missing")
                else:
                    with atomic(writer.conn):
                        writer.set_identity(self.expected_identity().to_dict())
                        writer = self.index.writer()  # a store that knows the vector table
                        writer.ensure_vector_table()
            act = self.status.activity = Activity("index")
            # An index filled for the first time: searches wait for the whole first pass
            # rather than answer from its first few files.
            self.status.filling = not writer.has_files()
            try:
                self._reconcile_some(
                    writer, report, tracked(act, progress), paths if state != "missing" else None
                )
                if self.status.filling:
                    self._maybe_batch(writer)
                if embed:
                    self._embed_pending(writer, report, progress, act=act)
            finally:
                self.status.activity = None
                self.status.filling = False
            report.pending_files = writer.counts(vectors=False)["pending_files"]
            self.index.tend()
        report.seconds = time.monotonic() - started
        if not report.errors:
            self.status.last_sync = time.time()
        return report

    def embed_pending(
        self,
        max_files: int | None = None,
        *,
        max_chars: int | None = None,
        wake: Callable[[], None] | None = None,
    ) -> SyncReport:
        """Embed the chunks still lacking vectors in the live index (at most ``max_files``).

        With ``max_chars`` (and an embedding cache) a call embeds about that much new text and
        returns: a file's vectors are stored once all its texts are in the cache, so a long
        file is embedded over several calls and its writer is free between them. With ``wake``
        (the writer), a wave of requests to a remote provider runs on a thread of its own: the
        call stores what the cache holds and returns, and ``wake`` is called when the wave is
        back.
        """
        report = SyncReport()
        with self.lock, translate_errors("embed"):
            writer = self.index.writer()
            # The backlog is worked off a few files per call, between the writer's other jobs:
            # one activity spans the calls until nothing is pending.
            act = self.status.backlog if self.status.backlog is not None else Activity("embed")
            self.status.backlog = act
            self._embed_pending(
                writer,
                report,
                None,
                max_files=max_files,
                max_chars=max_chars,
                act=act,
                wake=wake,
            )
            report.pending_files = writer.pending_count()
            self.index.tend_sketch()
            if not report.pending_files or report.errors:
                self.status.backlog = None
        return report

    def has_pending(self) -> bool:
        with self.index.reader() as store:
            return store.has_pending()
