"""The embedding backlog: the vectors the files of an index still lack, embedded a step at a
time between the writer's jobs, in waves of parallel requests sent in the background (a
remote provider), or handed to the provider's Batch API and picked up when it is done.

Its own module: how the missing texts travel to the provider and back, apart from what a
file's rows are (memd/index/files.py) and how one text's vector is made (memd/index/embedding.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import apsw

from memd.embed.base import BatchQueue, Embedder, document_jobs
from memd.index.db import atomic
from memd.index.embedding import BadTexts, ChunkEmbedding
from memd.index.report import Activity, Progress, SyncReport
from memd.index.store import Store
from memd_client.errors import MemdError

__all__ = ["PendingEmbedding"]

logger = logging.getLogger(__name__)


# Files one step stores from the cache after a wave of requests (a transaction each): a wave
# brings the texts of a hundred files, and an append should not wait for all of them.
WAVE_STORES = 16
# How long the writer leaves an index alone while its wave is in flight, at most: the wave
# wakes it when it is back.
WAVE_REST_S = 5.0


class PendingEmbedding(ChunkEmbedding):
    """The backlog steps of a Syncer (memd/index/sync.py), which holds the state below."""

    root: Path
    batches: BatchQueue | None
    _rest_until: float
    _background: _Wave | None

    def _embed_pending(
        self,
        store: Store,
        report: SyncReport,
        progress: Progress | None,
        *,
        max_files: int | None = None,
        max_chars: int | None = None,
        act: Activity | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        e = self.embedder
        if e is None or not self._same_vectors(store) or self.backing_off():
            return
        held: set[str] = set()  # texts a batch is embedding: not sent again
        if self.batches is not None and self.cache is not None and self.batches.waiting():
            self.batches.poll()  # what finished goes into the cache, and is stored below
            held = self.batches.pending()
        paths = store.pending_paths(max_files)
        base = files_total = 0
        if act is not None and paths:
            counts = store.counts(vectors=False)
            base = act.files_done if act.phase == "embed" else 0
            files_total = base + counts["pending_files"]
            chunks_total = act.chunks_done + counts["chunks"] - counts["embedded_chunks"]
            if act.phase != "embed" or chunks_total != act.chunks_total:
                act.texts_left(*self._texts_needed(store))  # a start, or new files pending
            act.embedding(base, files_total, chunks_total)
        # An embedder that takes large requests in parallel (a remote API) gets the missing
        # texts of many files in one call; the files are then stored from the cache.
        waved = bool(e.step_chars and self.cache is not None and paths)
        gathered: set[str] = set()  # files the wave counted the cache hits of
        failed_in_a_row = 0
        unusable: BadTexts | None = None  # texts the wave got bad vectors for
        for n, path in enumerate(paths, 1):
            if progress:
                progress("embed", n, len(paths))
            todo = store.unembedded(path)
            embedded, chars = report.embedded, report.embedded_chars
            try:
                if waved and n == 1:
                    budget = max(max_chars or 0, e.step_chars)
                    try:
                        if wake is not None:
                            gathered = self._wave_behind(
                                e, store, paths, report, budget, held, wake
                            )
                        else:
                            gathered = self._wave(e, store, paths, report, budget, held)
                    except BadTexts as exc:
                        unusable = exc  # the files without those texts are stored all the same
                hits = SyncReport() if path in gathered else report
                vectors = self._chunk_vectors(e, todo, hits, embed=not waved, max_chars=max_chars)
                if act is not None:
                    act.embedded(report.embedded - embedded, report.embedded_chars - chars)
                if unusable and len(vectors) < len(todo):
                    if not unusable.hashes.isdisjoint(self._texts_of(todo)):
                        raise unusable
            except Exception as exc:  # a provider failure: keep the file pending, say why
                self._failed(f"{type(exc).__name__}: {exc}")
                logger.warning("embedding %s failed: %s", path, self.status.last_error)
                report.errors.append((path, f"embedding failed: {self.status.last_error}"))
                with contextlib.suppress(apsw.Error), atomic(store.conn):
                    store.set_file_error(path, self.status.last_error)
                failed_in_a_row += 1
                if isinstance(exc, BadTexts) or (failed_in_a_row == 1 and n < len(paths)):
                    # These texts, or maybe this file: the next file says whether the provider
                    # is down (a model that fails one word fails that file alone).
                    continue
                return  # the provider is down; later files would fail the same way
            if len(vectors) < len(todo):
                if held and not held.isdisjoint(self._texts_of(todo)):
                    self._rest(report, n == len(paths))
                    continue  # a batch brings its vectors; the files after it go on
                if self._wave_running():
                    # The rest comes with the wave in flight: nothing to do until it is back.
                    self._rest_until = time.monotonic() + WAVE_REST_S
                    if not self._wave_running():
                        self._rest_until = 0.0
                return  # the budget ran out: the texts embedded so far wait in the cache
            try:
                with atomic(store.conn):
                    store.add_vectors(path, vectors)
                    store.bump_generation()
                if act is not None:
                    act.chunks_done += len(todo)
                    act.embedding(base + n, files_total)
            except (apsw.FullError, apsw.ReadOnlyError, apsw.IOError) as exc:
                # The disk, not the provider: wait the same way, or the writer would re-embed
                # and fail again at once, in a loop.
                self._failed(f"cannot store vectors: {exc}")
                logger.warning("storing the vectors of %s failed: %s", path, exc)
                report.errors.append((path, self.status.last_error or ""))
                return
            self.reset_backoff()
            failed_in_a_row = 0
            if waved and n >= WAVE_STORES:
                return  # the writer's other jobs get their turn; the rest waits in the cache

    def _rest(self, report: SyncReport, last: bool) -> None:
        """After the last pending file, when nothing but batches is left: the writer leaves
        this index alone until the next poll."""
        if last and not report.embedded and self.batches is not None:
            self._rest_until = time.monotonic() + max(1.0, self.batches.next_poll_in())

    def _wave(
        self,
        e: Embedder,
        store: Store,
        paths: list[str],
        report: SyncReport,
        budget: int,
        held: set[str],
    ) -> set[str]:
        """Embed (into the cache) the missing texts of the first of ``paths``, in order, up to
        about ``budget`` characters of them: one call, which the embedder sends as parallel
        requests; return the paths it looked at. The loop after it stores the files whose
        texts are all there."""
        items, seen = self._gather(e, store, paths, report, budget, held)
        if items:
            self._embed_texts(e, items, report)
        return seen

    def _wave_behind(
        self,
        e: Embedder,
        store: Store,
        paths: list[str],
        report: SyncReport,
        budget: int,
        held: set[str],
        wake: Callable[[], None],
    ) -> set[str]:
        """:meth:`_wave` on a thread of its own, so the writer does not wait for the provider:
        the texts are gathered here (the writer's reads), sent there, and ``wake`` is called
        when they are back. A wave still in flight is left alone; one that failed raises its
        error here, for the file after it."""
        wave = self._background
        if wave is not None:
            if wave.is_alive():
                return set()
            self._background = None
            if wave.error is not None:
                raise wave.error
        items, seen = self._gather(e, store, paths, report, budget, held)
        if items:
            self._background = _Wave(self, e, items, wake)
        return seen

    def _wave_running(self) -> bool:
        wave = self._background
        return wave is not None and wave.is_alive()

    def settle(self, timeout: float | None = None) -> None:
        """Wait for the wave in flight, if any (memd stopping)."""
        wave = self._background
        if wave is not None:
            wave.join(timeout)

    def _gather(
        self,
        e: Embedder,
        store: Store,
        paths: list[str],
        report: SyncReport,
        budget: int,
        held: set[str],
    ) -> tuple[list[tuple[str, str]], set[str]]:
        """(hash, text) of the missing texts of the first of ``paths``, in order, up to about
        ``budget`` characters; and the paths looked at. Texts the cache holds are only looked
        up, not read."""
        assert self.cache is not None
        missing: dict[str, str] = {}
        size = 0
        seen: set[str] = set()
        for path in paths:
            seen.add(path)
            todo = store.unembedded(path)
            texts = self._texts_of(todo)
            known = self.cache.known(e.settings_key, texts, e.dims)
            report.cache_hits += sum(
                1
                for _, h, text in todo
                if h in known and known.issuperset(self._texts_of([(None, h, text)]))
            )
            for h, text in texts.items():
                if h not in known and h not in held and h not in missing:
                    missing[h] = text
                    size += len(text)
            if size >= budget:
                break
        items = list(missing.items())
        if items:
            items = items[: len(next(document_jobs([t for _, t in items], budget)))]
        return items, seen

    def _wait_for_batch(self, progress: Progress | None) -> bool:
        """Wait until a batch the texts wait for is due to be asked about; False when none is.
        ``progress`` is called twice a second meanwhile (it stops a rebuild when memd stops)."""
        b = self.batches
        if b is None or not b.waiting():
            return False
        deadline = time.monotonic() + b.next_poll_in()
        while True:
            if progress:
                progress("batch", 0, 0)
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(0.5, left))

    def resting(self) -> bool:
        """True while the vectors still missing can only come from a batch not yet due."""
        return time.monotonic() < self._rest_until

    def _maybe_batch(self, store: Store) -> None:
        """Send the missing texts of ``store`` (an index filled for the first time, or a
        rebuild's new file) to the provider's Batch API when they come to at least
        ``embedding.batch_min_tokens``; below that, or if it refuses, they go live."""
        b, e = self.batches, self.embedder
        if b is None or e is None or self.cache is None or not self._same_vectors(store):
            return
        held = b.pending()
        texts = {h: t for h, t in self._missing_texts(store).items() if h not in held}
        tokens = sum(e.count_tokens_many(list(texts.values())))
        if not texts or not b.worth_it(tokens):
            return
        try:
            b.submit(texts)
        except MemdError as exc:
            logger.warning("the Batch API refused the texts of %s (%s): sent live", self.root, exc)

    def _texts_needed(self, store: Store) -> tuple[int, int]:
        """How many texts the pending files of ``store`` still need from the model (those of
        their chunks and lines the embedding cache lacks), and their characters."""
        if self.cache is not None and self.embedder is not None:
            texts = self._missing_texts(store)
        else:
            texts = {}
            for path in store.pending_paths():
                texts.update(self._texts_of(store.unembedded(path)))
        return len(texts), sum(len(t) for t in texts.values())

    def _missing_texts(self, store: Store) -> dict[str, str]:
        """hash -> text of every text (chunk or line) the pending files of ``store`` still
        need and the embedding cache does not hold."""
        assert self.embedder is not None and self.cache is not None
        texts: dict[str, str] = {}
        for path in store.pending_paths():
            texts.update(self._texts_of(store.unembedded(path)))
        e = self.embedder
        known = self.cache.known(e.settings_key, texts, e.dims)
        return {h: t for h, t in texts.items() if h not in known}


class _Wave(threading.Thread):
    """One wave of requests sent for the writer (``PendingEmbedding._wave_behind``); when it
    is back, the writer is woken (``wake``) to store the files it completed."""

    def __init__(
        self,
        syncer: PendingEmbedding,
        e: Embedder,
        items: list[tuple[str, str]],
        wake: Callable[[], None],
    ) -> None:
        super().__init__(name="memd-wave", daemon=True)
        self.syncer, self.e, self.items, self.wake = syncer, e, items, wake
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            self.syncer._embed_texts(self.e, self.items, SyncReport())
        except Exception as exc:  # raised in the writer, at its next step
            self.error = exc
        finally:
            self.syncer._rest_until = 0.0
            self.wake()
