"""Sync: bring a workspace index in line with the Markdown on disk, file by file.

Each changed file is replaced in one transaction (chunks, FTS rows, the vectors already in the
cache, its file row), so keyword search sees it at once; the missing vectors are embedded next
and added per file. A file whose vectors could not be made stays ``pending``: never reported
clean. A different model or chunking rebuilds into a temporary database that is swapped in only
when complete, while searches keep reading the old one.

Over 400 lines: the incremental sync and the rebuild share every per-file step (read, hash,
redact, chunk, embed, write); the transcripts' part is memd/index/transcripts.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import apsw
import numpy as np

from memd.changes import Changes
from memd.config import IndexConfig, SessionsConfig
from memd.embed.base import (
    BadVectors,
    BatchQueue,
    Embedder,
    Vectors,
    check_vectors,
    document_jobs,
)
from memd.index.cache import EmbeddingCache
from memd.index.chunk import LINES_VERSION, Chunk, chunk_resumable, fit_to_model, vector_lines
from memd.index.db import atomic, translate_errors
from memd.index.identity import KEYWORD_ONLY_MODEL, Identity
from memd.index.index import Index
from memd.index.report import Activity, IndexEntry, SyncReport
from memd.index.store import FileRow, NewChunk, Resume, Store, VectorStore
from memd.index.tail import changed_chunks, digests, indexed_part, resume_at
from memd.index.transcripts import Transcripts
from memd.markdown.discover import SourceFile, discover, memory_file, read_regular
from memd.redact import reads_whole_text, redact
from memd.sessions.transcript import list_transcripts, map_lines, render
from memd_client.errors import MemdError

__all__ = ["Progress", "SyncReport", "Syncer"]

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
K = TypeVar("K")
# A file modified this recently may change again within the same timestamp tick ("racy git"):
# compare its hash even when size and mtime match the index.
RACY_NS = 2_000_000_000


TOKEN_COUNTS_KEPT = 200_000  # about 10 MB of digests and counts
# Files are found whatever their size: one over index.max_file_bytes is indexed in part
# (memd/index/tail.py), never dropped from the index.
UNCAPPED = sys.maxsize
# New text a rebuild embeds between two calls of its progress callback (which may stop it).
REBUILD_STEP_CHARS = 16 * 1024
# Files one step stores from the cache after a wave of requests (a transaction each): a wave
# brings the texts of a hundred files, and an append should not wait for all of them.
WAVE_STORES = 16
# How long the writer leaves an index alone while its wave is in flight, at most: the wave
# wakes it when it is back.
WAVE_REST_S = 5.0


def decode_memory(data: bytes) -> str:
    """A memory file's text: UTF-8, or UTF-16 when it starts with a byte-order mark (an editor's
    "Unicode" save); read as UTF-8 such a file matched no keyword and no redaction pattern."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", "replace")
    return data.decode("utf-8", "replace")


class Syncer:
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
        self.rest_until = 0.0  # time.monotonic() before which only a batch or wave brings vectors
        self._background: _Wave | None = None  # the writer's wave of requests in flight
        # Called when a wave sent in the background is back (the writer sets it).
        self.wake: Callable[[], None] = lambda: None
        self.extra_paths = extra_paths
        self.transcripts = (
            Transcripts(sessions_dir, sessions or SessionsConfig(), redact_text=config.redact)
            if sessions_dir is not None
            else None
        )
        # True when the embedder is None because a provider is unavailable (not by choice):
        # then an index with vectors is kept as it is instead of being rebuilt keyword-only.
        self.protect = protect
        self.last_error: str | None = None
        self.last_sync: float | None = None  # wall-clock time of the last completed sync
        # After an embedding failure, pending files wait (30 s doubling to 1 h) before the next
        # attempt, so a provider outage does not stall every sync on retries.
        self.embed_failures = 0
        self._token_counts: dict[bytes, int] = {}
        self._token_owner: Embedder | None = None
        # Set by an explicit reindex: the next full reconcile compares every file's content.
        self.look_next = False
        # Files the last full reconcile found and could not index, with why: every reply's
        # freshness counts them, so nothing unsearchable is reported fresh.
        self.skipped: list[tuple[str, str]] = []
        # Files over index.max_file_bytes, indexed only in part, and their sizes.
        self.partial: dict[str, int] = {}
        self.tails = 0  # files indexed again from their resume point only (they grew)
        self.retry_at = 0.0  # time.monotonic() of the next allowed attempt
        # Held by every write to the live index; a rebuild holds it only to publish.
        self.lock = threading.RLock()
        self.rebuilding = False
        # What the live index's writer and a rebuild are doing now, for status (None: idle).
        self.activity: Activity | None = None
        self.filling = False  # the first sync of an empty index is running
        self.backlog: Activity | None = None
        self.rebuild_activity: Activity | None = None

    @property
    def sessions_dir(self) -> Path | None:
        return self.transcripts.directory if self.transcripts is not None else None

    def sessions_due(self) -> bool:
        """Whether some transcript should be reindexed now (checked cheaply every few seconds)."""
        return self.transcripts is not None and self.transcripts.due(self.index)

    # -- identity -------------------------------------------------------------------------------

    def expected_identity(self) -> Identity:
        e = self.embedder
        tokens, overlap = self.config.chunk_tokens, self.config.chunk_overlap
        if e is None:
            return Identity(
                "none", KEYWORD_ONLY_MODEL, "", 0, "none", tokens, overlap, 0, self.config.redact
            )
        store: VectorStore = "vec0" if self.index.vec.available else "plain"
        return Identity(
            e.provider,
            e.model,
            e.settings_key,
            e.dims,
            store,
            tokens,
            overlap,
            e.max_tokens,
            self.config.redact,
            lines=LINES_VERSION if self.line_vectors else 0,
        )

    @property
    def line_vectors(self) -> bool:
        """Whether chunks get a vector per line besides their own (``index.line_vectors``)."""
        return self.config.line_vectors

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

    # -- sync -----------------------------------------------------------------------------------

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
        rebuild_now = force or (state == "mismatched" and allow_rebuild and not self.rebuilding)
        if rebuild_now and not force and self.backing_off():
            return SyncReport(reason=reason, errors=[("", f"rebuild waits: {self.last_error}")])
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
            act = self.activity = Activity("index")
            # An index filled for the first time: searches wait for the whole first pass
            # rather than answer from its first few files.
            self.filling = not writer.has_files()
            try:
                self._reconcile_some(
                    writer, report, _tracked(act, progress), paths if state != "missing" else None
                )
                if self.filling:
                    self._maybe_batch(writer)
                if embed:
                    self._embed_pending(writer, report, progress, act=act)
            finally:
                self.activity = None
                self.filling = False
            report.pending_files = writer.counts(vectors=False)["pending_files"]
            self.index.tend()
        report.seconds = time.monotonic() - started
        if not report.errors:
            self.last_sync = time.time()
        return report

    def embed_pending(
        self,
        max_files: int | None = None,
        *,
        max_chars: int | None = None,
        background: bool = False,
    ) -> SyncReport:
        """Embed the chunks still lacking vectors in the live index (at most ``max_files``).

        With ``max_chars`` (and an embedding cache) a call embeds about that much new text and
        returns: a file's vectors are stored once all its texts are in the cache, so a long
        file is embedded over several calls and its writer is free between them. With
        ``background`` (the writer), a wave of requests to a remote provider runs on a thread
        of its own: the call stores what the cache holds and returns, and ``wake`` is called
        when the wave is back.
        """
        report = SyncReport()
        with self.lock, translate_errors("embed"):
            writer = self.index.writer()
            # The backlog is worked off a few files per call, between the writer's other jobs:
            # one activity spans the calls until nothing is pending.
            act = self.backlog if self.backlog is not None else Activity("embed")
            self.backlog = act
            self._embed_pending(
                writer,
                report,
                None,
                max_files=max_files,
                max_chars=max_chars,
                act=act,
                background=background,
            )
            report.pending_files = writer.pending_count()
            self.index.tend_sketch()
            if not report.pending_files or report.errors:
                self.backlog = None
        return report

    def has_pending(self) -> bool:
        with self.index.reader() as store:
            return store.has_pending()

    def rebuild(
        self, *, progress: Progress | None = None, reason: str | None = "forced"
    ) -> SyncReport:
        """Build a complete new index in a temporary file and swap it in; the old one serves
        searches meanwhile and stays untouched if anything fails."""
        started = time.monotonic()
        report = SyncReport(rebuilt=True, reason=reason)
        with self.lock:
            if self.rebuilding:
                report.errors.append(("", "a rebuild is already running"))
                return report
            self.rebuilding = True
        act = self.rebuild_activity = Activity("rebuild")
        try:
            self._rebuild(report, _tracked(act, progress), act)
        finally:
            self.rebuilding = False
            self.rebuild_activity = None
        report.seconds = time.monotonic() - started
        return report

    def _rebuild(self, report: SyncReport, progress: Progress | None, act: Activity) -> None:
        temp = self.index.temp_path()
        expected = self.expected_identity()
        conn: apsw.Connection | None = None
        try:
            with translate_errors("rebuild"):
                conn = self.index.open_temp(temp)
                store = Store(conn, expected.vector_store, expected.dims)
                with atomic(conn):
                    store.set_identity(expected.to_dict())
                    store.ensure_vector_table()
                self._reconcile(store, report, progress, fresh=True)
                self._maybe_batch(store)
                self._embed_rebuilt(store, report, progress, act)
                counts = store.counts()
                if counts["pending_files"]:
                    raise _RebuildAborted(
                        f"{counts['pending_files']} file(s) could not be embedded: {self.last_error}"
                    )
                if expected.semantic and counts["vectors"] != counts["chunks"]:
                    raise _RebuildAborted(
                        f"vector rows ({counts['vectors']}) differ from chunk rows ({counts['chunks']})"
                    )
                # Files changed while it was built: the new file catches up, vectors too, and
                # again under the lock (keyword rows: what changed in between is embedded by
                # the writer) before a search can read it: no reply finds it behind the index
                # it replaces.
                self._reconcile(store, SyncReport(), progress, fresh=False)
                self._embed_rebuilt(store, SyncReport(), progress, act)
                with self.lock:
                    self._reconcile(store, SyncReport(), None, fresh=False)
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    conn.close()
                    conn = None
                    self.index.swap_in(temp)
                self.last_sync = time.time()
        except BaseException as exc:
            if conn is not None:
                conn.close()
            self.index.remove_temp_files()
            if isinstance(exc, _RebuildAborted):
                report.errors.append(("", f"rebuild abandoned, old index kept: {exc}"))
                self.last_error = str(exc)
                logger.warning("rebuild of %s abandoned, old index kept: %s", self.root, exc)
            else:
                raise

    def _embed_rebuilt(
        self, store: Store, report: SyncReport, progress: Progress | None, act: Activity
    ) -> None:
        """Embed what the new index lacks, REBUILD_STEP_CHARS of new text at a time: between
        two steps ``progress`` is called, and may stop the rebuild (memd stopping) at once
        rather than after a whole file of thousands of lines."""
        while True:
            embedded, errors = report.embedded, len(report.errors)
            pending = store.pending_count()
            self._embed_pending(store, report, progress, max_chars=REBUILD_STEP_CHARS, act=act)
            if len(report.errors) > errors or not store.has_pending():
                return  # a failure (the file stays pending), or done
            if report.embedded > embedded or store.pending_count() < pending:
                continue  # texts embedded, or files stored from the cache
            if not self._wait_for_batch(progress):
                return  # nothing left to embed

    def estimate(self) -> dict[str, object]:
        """What a rebuild would send to the embedder, without sending or writing anything: the
        files and chunks it would index, the distinct texts (chunks, and lines when they get
        vectors), those the embedding cache lacks, their tokens and requests, and whether
        they would go through the Batch API."""
        e = self.embedder
        cap = self.config.max_file_bytes
        tokens, overlap = self.config.chunk_tokens, self.config.chunk_overlap
        texts: dict[str, str] = {}
        files = chunks = 0

        def add(text: str) -> None:
            nonlocal chunks
            found, _ = chunk_resumable(text, tokens, overlap)
            if e is not None and e.own_threads:  # counting is free for a remote provider
                found = fit_to_model(found, e.count_tokens, e.max_tokens)
            chunks += len(found)
            texts.update(self._texts_of((None, c.hash, c.text) for c in found))

        for f in discover(self.root, self.extra_paths, UNCAPPED, diary=self.config.diary).files:
            with contextlib.suppress(OSError):
                data = read_regular(f.abs, cap + 1)
                if data is not None:
                    text = decode_memory(indexed_part(data, cap))
                    add(redact(text) if self.config.redact else text)
                    files += 1
        if self.transcripts is not None:
            for t in list_transcripts(self.transcripts.directory)[0]:
                with contextlib.suppress(OSError):
                    rendered = render(
                        t.abs.read_bytes(), redact=redact if self.config.redact else None
                    )
                    if rendered.unreadable is None:
                        add(rendered.text)
                        files += 1
        out: dict[str, object] = {
            "files": files,
            "chunks": chunks,
            "texts": len(texts) if e is not None else 0,
            "line_vectors": self.line_vectors if e is not None else False,
            "cached": 0,
            "send_texts": 0,
            "send_tokens": 0,
            "requests": 0,
            "batch": False,
        }
        if e is None:
            return out
        known = self.cache.known(e.settings_key, texts, e.dims) if self.cache else set()
        send = [t for h, t in texts.items() if h not in known]
        send_tokens = sum(e.count_tokens_many(send))
        batch = self.batches is not None and bool(send) and self.batches.worth_it(send_tokens)
        out.update(
            cached=len(texts) - len(send),
            send_texts=len(send),
            send_tokens=send_tokens,
            requests=e.plan_requests(send) if not batch else 0,
            batch=batch,
        )
        return out

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
        return time.monotonic() < self.rest_until

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

    def _texts_of(self, chunks: Iterable[tuple[object, str, str]]) -> dict[str, str]:
        """hash -> text of ``chunks`` (key, hash, text) and of their lines, when lines get
        vectors of their own."""
        texts: dict[str, str] = {}
        for _, h, text in chunks:
            texts.setdefault(h, text)
            if self.line_vectors:
                for line, lh in vector_lines(text):
                    texts.setdefault(lh, line)
        return texts

    # -- the two phases -------------------------------------------------------------------------

    def _reconcile(
        self,
        store: Store,
        report: SyncReport,
        progress: Progress | None,
        *,
        fresh: bool,
        look: bool = False,
    ) -> None:
        found = discover(self.root, self.extra_paths, UNCAPPED, diary=self.config.diary)
        report.skipped = list(found.skipped)
        self.skipped = list(found.skipped)
        cap = self.config.max_file_bytes
        self.partial = {f.rel: f.size for f in found.files if f.size > cap}
        stored = {} if fresh else store.files()
        report.scanned = len(found.files)
        now_ns = time.time_ns()
        identity = Index.stored_identity(store.conn)
        model = identity.model if identity else KEYWORD_ONLY_MODEL
        same_vectors = self._same_vectors(store)
        for n, f in enumerate(found.files, 1):
            if progress:
                progress("scan", n, len(found.files))
            self._sync_one(
                store, f, stored.get(f.rel), report, model, same_vectors, now_ns, look=look
            )
        # An explicit reindex (``look``) brings every transcript up to date, grown below the
        # delta or not: afterwards the index equals a fresh rebuild of the same files.
        self._reconcile_transcripts(store, report, stored, fresh or look, model, same_vectors)
        if found.complete:
            present = {f.rel for f in found.files}
            gone = [p for p, r in stored.items() if p not in present and r.source == "memory"]
            for path in gone:
                store.remove(path)
                report.removed += 1

    def _sync_one(
        self,
        store: Store,
        f: SourceFile,
        row: FileRow | None,
        report: SyncReport,
        model: str,
        same_vectors: bool,
        now_ns: int,
        *,
        look: bool = False,
    ) -> None:
        """Index ``f`` unless its size, mtime (or, when racy, content hash) match ``row``.

        ``look``: a file event or an explicit reindex named it, so its content hash decides
        (``cp -p`` and ``touch -r`` rewrite a file and keep its size and mtime).
        """
        racy = now_ns - f.mtime_ns < RACY_NS
        same_stat = row is not None and row.same_stat(f.size, f.mtime_ns)
        if same_stat and not racy and not look:
            report.unchanged += 1
            return
        cap = self.config.max_file_bytes
        try:
            data = read_regular(f.abs, cap + 1)
        except OSError as exc:
            report.errors.append((f.rel, f"cannot read: {exc.strerror or exc}"))
            return
        if data is None:
            return  # gone since the walk (or now a folder, link or FIFO); the next sync drops it
        if len(data) > cap:
            self.partial[f.rel] = max(f.size, len(data))
        else:
            self.partial.pop(f.rel, None)
        raw = indexed_part(data, cap)
        point = store.resume_point(f.rel) if row is not None else None
        # Of what is indexed (all, or the head), and of what was indexed before, if it grew.
        file_hash, before = digests(raw, point)
        if row and row.hash == file_hash:
            if not row.same_stat(f.size, f.mtime_ns):
                with atomic(store.conn):
                    store.touch_file(f.rel, f.mtime_ns, f.size)
            report.unchanged += 1
            return
        entry = IndexEntry(
            f.rel,
            "memory",
            f.kind,
            f.day.isoformat() if f.day else None,
            f.mtime_ns,
            f.size,
            file_hash,
        )
        grew = point if row is not None and before == row.hash else None
        if grew is not None and self._extend(store, entry, raw, grew, model, report, same_vectors):
            return
        text = decode_memory(raw)
        # A file whose redaction reads the whole text (a private key) is indexed whole again
        # when it grows: nothing says where it may be chunked again from.
        whole = self.config.redact and reads_whole_text(text)
        if self.config.redact:
            text = redact(text)  # the index holds redacted text; the file is untouched
        self._index_file(
            store, entry, text, model, report, same_vectors, raw=None if whole else raw
        )

    def _extend(
        self,
        store: Store,
        entry: IndexEntry,
        raw: bytes,
        point: Resume,
        model: str,
        report: SyncReport,
        same_vectors: bool,
    ) -> bool:
        """Index a file whose first ``point.length`` bytes are what was indexed before from
        ``point`` only (memd/index/tail.py); False when it cannot be (the text from there on
        has a private key, or its rows are not as expected)."""
        old, new = (
            decode_memory(raw[point.offset : point.length]),
            decode_memory(raw[point.offset :]),
        )
        if self.config.redact:
            if reads_whole_text(new):  # the text before the resume point had none of it
                return False
            old, new = redact(old), redact(new)
        tokens, overlap = self.config.chunk_tokens, self.config.chunk_overlap
        before, _ = chunk_resumable(old, tokens, overlap, first_line=point.line)
        after, restarts = chunk_resumable(new, tokens, overlap, first_line=point.line)
        if self.embedder is not None:
            self._count_all([c.text for c in (*before, *after)])
        before, after = self._fit(before), self._fit(after)
        resume = resume_at(raw, restarts, point) or Resume(point.line, point.offset, len(raw))
        removed, added = changed_chunks(before, after)
        rows = self._rows(store, entry, added, same_vectors, report, fresh=True)
        with atomic(store.conn):
            pending = store.extend_file(
                path=entry.rel,
                file_hash=entry.file_hash,
                mtime_ns=entry.mtime_ns,
                size=entry.size,
                model=model,
                remove=removed,
                add=rows,
                resume=resume,
            )
            if pending is None:
                return False
            store.bump_generation()
        self.tails += 1
        report.indexed += 1
        report.chunks_written += len(rows)
        return True

    def _reconcile_paths(self, store: Store, report: SyncReport, paths: frozenset[str]) -> bool:
        """Sync only ``paths`` (from the watcher or an append); False when a full
        reconcile is needed instead. A workspace of thousands of files is not walked for one
        changed daily log."""
        looked = [
            (rel, memory_file(self.root, rel, UNCAPPED, diary=self.config.diary)) for rel in paths
        ]
        if any(status == "rescan" for _, (status, _) in looked):
            return False
        identity = Index.stored_identity(store.conn)
        model = identity.model if identity else KEYWORD_ONLY_MODEL
        same_vectors = self._same_vectors(store)
        now_ns = time.time_ns()
        for rel, (_, f) in sorted(looked, key=lambda x: x[0]):
            row = store.file(rel)
            if f is None:
                self.partial.pop(rel, None)
                if row is not None and row.source == "memory":
                    store.remove(rel)
                    report.removed += 1
                continue
            report.scanned += 1
            self._sync_one(store, f, row, report, model, same_vectors, now_ns, look=True)
        return True

    def _count_tokens(self, text: str) -> int:
        """The model's token count of ``text``, remembered by digest: re-chunking a grown daily
        log asks again for every chunk it had, and each ask is a round trip to the model."""
        assert self.embedder is not None
        key = _digest(text)
        count = self._token_memo().get(key)
        if count is None:
            count = self.embedder.count_tokens(text)
            self._remember_count(key, count)
        return count

    def _count_all(self, texts: list[str]) -> None:
        """Ask the model for the token counts of ``texts`` it was not asked before, in one
        round trip: a checkout of 1,000 files asked once per chunk, each ask waiting for the
        query the model was embedding."""
        assert self.embedder is not None
        memo = self._token_memo()
        keys = {_digest(t): t for t in texts}
        new = [k for k in keys if k not in memo]
        if len(new) < 2:
            return  # one text: the single ask is the same round trip
        for key, count in zip(
            new, self.embedder.count_tokens_many([keys[k] for k in new]), strict=True
        ):
            self._remember_count(key, count)

    def _token_memo(self) -> dict[bytes, int]:
        """The remembered token counts, emptied when the embedder changed (another model
        counts differently)."""
        if self._token_owner is not self.embedder:
            self._token_counts.clear()
            self._token_owner = self.embedder
        return self._token_counts

    def _remember_count(self, key: bytes, count: int) -> None:
        if len(self._token_counts) >= TOKEN_COUNTS_KEPT:
            self._token_counts.clear()
        self._token_counts[key] = count

    def _index_file(
        self,
        store: Store,
        entry: IndexEntry,
        text: str,
        model: str,
        report: SyncReport,
        same_vectors: bool,
        *,
        raw: bytes | None = None,
    ) -> None:
        """Index all of ``entry``'s ``text``; with ``raw`` (the bytes it was read from) also
        keep where it may be chunked again from when it grows (memd/index/tail.py)."""
        chunks, restarts = chunk_resumable(
            text, self.config.chunk_tokens, self.config.chunk_overlap
        )
        if self.embedder is not None:
            self._count_all([c.text for c in chunks])
        rows = self._rows(store, entry, self._fit(chunks), same_vectors, report)
        resume = resume_at(raw, restarts) if raw is not None else None
        with atomic(store.conn):
            store.replace_file(
                path=entry.rel,
                source=entry.source,
                kind=entry.kind,
                day=entry.day,
                file_hash=entry.file_hash,
                mtime_ns=entry.mtime_ns,
                size=entry.size,
                model=model,
                chunks=rows,
                resume=resume,
            )
            store.bump_generation()
        report.indexed += 1
        report.chunks_written += len(rows)

    def _fit(self, chunks: list[Chunk]) -> list[Chunk]:
        """``chunks`` split further where the model would take them whole otherwise."""
        e = self.embedder
        return chunks if e is None else fit_to_model(chunks, self._count_tokens, e.max_tokens)

    def _rows(
        self,
        store: Store,
        entry: IndexEntry,
        chunks: list[Chunk],
        same_vectors: bool,
        report: SyncReport,
        *,
        fresh: bool = False,
    ) -> list[NewChunk]:
        """The rows of ``chunks``, with the vectors the cache has for those not stored with
        theirs already (``fresh``: none of them is)."""
        e = self.embedder
        spans = []
        for c in chunks:
            start, end = c.start_line, c.end_line
            if entry.line_map is not None:  # rendered transcript lines -> JSONL line numbers
                start, end = map_lines(entry.line_map, start, end)
            spans.append((start, end))
        vectors: dict[str, tuple[Vectors, Vectors | None]] = {}
        if e is not None and self.cache is not None and same_vectors:
            # Chunks stored unchanged with their vectors keep them (a file edited in one
            # place): only the others are looked up in the cache.
            have = set() if fresh else store.embedded_keys(entry.rel)
            wanted = [
                (c.hash, c.hash, c.text)
                for c, (start, end) in zip(chunks, spans, strict=True)
                if (start, end, c.hash) not in have
            ]
            vectors = self._chunk_vectors(e, wanted, report, embed=False)
        return [
            NewChunk(start, end, c.text, c.hash, *vectors.get(c.hash, (None, None)))
            for c, (start, end) in zip(chunks, spans, strict=True)
        ]

    def backing_off(self) -> bool:
        """True while embedding waits after a failure."""
        return time.monotonic() < self.retry_at

    def reset_backoff(self) -> None:
        self.embed_failures = 0
        self.retry_at = 0.0

    def _failed(self, error: str) -> None:
        self.last_error = error
        self.embed_failures += 1
        self.retry_at = time.monotonic() + min(3600.0, 30.0 * 2 ** (self.embed_failures - 1))

    def _reconcile_transcripts(
        self,
        store: Store,
        report: SyncReport,
        stored: dict[str, FileRow],
        fresh: bool,
        model: str,
        same_vectors: bool,
    ) -> None:
        if self.transcripts is not None:
            self.transcripts.reconcile(
                store,
                report,
                stored,
                fresh=fresh,
                index_file=lambda entry, text: self._index_file(
                    store, entry, text, model, report, same_vectors
                ),
            )

    def _reconcile_some(
        self, store: Store, report: SyncReport, progress: Progress | None, paths: Changes | None
    ) -> None:
        """Reconcile what ``paths`` names: all files (None, or a rescan of everything), only the
        transcripts (a rescan of them alone), or just the listed memory files."""
        if paths and paths == Changes.sessions():
            stored = {p: r for p, r in store.files().items() if r.source == "sessions"}
            model, same_vectors = self._model(store), self._same_vectors(store)
            self._reconcile_transcripts(store, report, stored, False, model, same_vectors)
            return
        if paths and not paths.rescans and self._reconcile_paths(store, report, paths.paths):
            return
        look, self.look_next = self.look_next, False
        self._reconcile(store, report, progress, fresh=False, look=look)

    @staticmethod
    def _model(store: Store) -> str:
        identity = Index.stored_identity(store.conn)
        return identity.model if identity else KEYWORD_ONLY_MODEL

    def _same_vectors(self, store: Store) -> bool:
        """True when ``store`` holds vectors of this syncer's embedder (so they may be added)."""
        identity = Index.stored_identity(store.conn)
        return (
            self.embedder is not None
            and identity is not None
            and store.vector_store != "none"
            and identity.settings_key == self.embedder.settings_key
        )

    def _embed_pending(
        self,
        store: Store,
        report: SyncReport,
        progress: Progress | None,
        *,
        max_files: int | None = None,
        max_chars: int | None = None,
        act: Activity | None = None,
        background: bool = False,
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
            act.embedding(base, files_total, chunks_total)
        # An embedder that takes large requests in parallel (a remote API) gets the missing
        # texts of many files in one call; the files are then stored from the cache.
        waved = bool(e.step_chars and self.cache is not None and paths)
        gathered: set[str] = set()  # files the wave counted the cache hits of
        unusable: _BadTexts | None = None  # texts the wave got bad vectors for
        for n, path in enumerate(paths, 1):
            if progress:
                progress("embed", n, len(paths))
            todo = store.unembedded(path)
            try:
                if waved and n == 1:
                    budget = max(max_chars or 0, e.step_chars)
                    try:
                        if background:
                            gathered = self._wave_behind(e, store, paths, report, budget, held)
                        else:
                            gathered = self._wave(e, store, paths, report, budget, held)
                    except _BadTexts as exc:
                        unusable = exc  # the files without those texts are stored all the same
                hits = SyncReport() if path in gathered else report
                vectors = self._chunk_vectors(e, todo, hits, embed=not waved, max_chars=max_chars)
                if unusable and len(vectors) < len(todo):
                    if not unusable.hashes.isdisjoint(self._texts_of(todo)):
                        raise unusable
            except Exception as exc:  # a provider failure: keep the file pending, say why
                self._failed(f"{type(exc).__name__}: {exc}")
                logger.warning("embedding %s failed: %s", path, self.last_error)
                report.errors.append((path, f"embedding failed: {self.last_error}"))
                with contextlib.suppress(apsw.Error), atomic(store.conn):
                    store.set_file_error(path, self.last_error)
                return  # the provider is down; later files would fail the same way
            if len(vectors) < len(todo):
                if held and not held.isdisjoint(self._texts_of(todo)):
                    self._rest(report, n == len(paths))
                    continue  # a batch brings its vectors; the files after it go on
                if self._wave_running():
                    # The rest comes with the wave in flight: nothing to do until it is back.
                    self.rest_until = time.monotonic() + WAVE_REST_S
                    if not self._wave_running():
                        self.rest_until = 0.0
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
                report.errors.append((path, self.last_error or ""))
                return
            self.reset_backoff()
            if waved and n >= WAVE_STORES:
                return  # the writer's other jobs get their turn; the rest waits in the cache

    def _rest(self, report: SyncReport, last: bool) -> None:
        """After the last pending file, when nothing but batches is left: the writer leaves
        this index alone until the next poll."""
        if last and not report.embedded and self.batches is not None:
            self.rest_until = time.monotonic() + max(1.0, self.batches.next_poll_in())

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
    ) -> set[str]:
        """:meth:`_wave` on a thread of its own, so the writer does not wait for the provider:
        the texts are gathered here (the writer's reads), sent there. A wave still in flight
        is left alone; one that failed raises its error here, for the file after it."""
        wave = self._background
        if wave is not None:
            if wave.is_alive():
                return set()
            self._background = None
            if wave.error is not None:
                raise wave.error
        items, seen = self._gather(e, store, paths, report, budget, held)
        if items:
            self._background = _Wave(self, e, items)
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

    def _chunk_vectors(
        self,
        e: Embedder,
        chunks: list[tuple[K, str, str]],
        report: SyncReport,
        *,
        embed: bool,
        max_chars: int | None = None,
    ) -> dict[K, tuple[Vectors, Vectors | None]]:
        """(vector, line vectors) of the chunks (key, hash, text): from the cache, and with
        ``embed`` the missing texts embedded (each distinct one once) and cached; without it,
        only the chunks whose vector and line vectors are all cached. ``max_chars`` (with a
        cache) stops the embedding after about that much text: the chunks it did not reach are
        left out."""
        per_line = self.line_vectors
        lines = {key: vector_lines(text) if per_line else [] for key, _, text in chunks}
        texts: dict[str, str] = {}
        for key, h, text in chunks:
            texts.setdefault(h, text)
            for line, lh in lines[key]:
                texts.setdefault(lh, line)
        by_hash: dict[str, Vectors] = {}
        if self.cache is not None:
            by_hash = self.cache.get_many(e.settings_key, texts, e.dims)
        report.cache_hits += sum(
            1 for key, h, _ in chunks if h in by_hash and all(lh in by_hash for _, lh in lines[key])
        )
        items = [(h, text) for h, text in texts.items() if h not in by_hash] if embed else []
        if max_chars is not None and self.cache is not None and items:
            items = items[: len(next(document_jobs([t for _, t in items], max_chars)))]
        by_hash.update(self._embed_texts(e, items, report))
        return {
            key: (by_hash[h], _stack([by_hash[lh] for _, lh in lines[key]]))
            for key, h, _ in chunks
            if h in by_hash and all(lh in by_hash for _, lh in lines[key])
        }

    def _embed_texts(
        self, e: Embedder, items: list[tuple[str, str]], report: SyncReport
    ) -> dict[str, Vectors]:
        """Embed ``items`` (hash, text) and cache their vectors; return them by hash."""
        by_hash: dict[str, Vectors] = {}
        for start in range(0, len(items), e.batch_size):
            batch = items[start : start + e.batch_size]
            vectors = e.embed_batch([t for _, t in batch], kind="document")
            # Whatever the provider: a NaN or zero row is a failed embedding, never cached.
            # The good rows of the same batch are kept: they may be other files' texts.
            bad = _bad_rows(vectors, len(batch), e.dims)
            fresh = {h: vectors[i] for i, (h, _) in enumerate(batch) if i not in bad}
            if self.cache is not None:
                self.cache.put_many(e.settings_key, e.provider, e.model, fresh)
            by_hash.update(fresh)
            report.embedded += len(fresh)
            if bad:
                try:
                    check_vectors(vectors, len(batch), e.dims)
                except BadVectors as exc:
                    raise _BadTexts(str(exc), {batch[i][0] for i in bad}) from None
        return by_hash


class _Wave(threading.Thread):
    """One wave of requests sent for the writer (``Syncer._wave_behind``); when it is back,
    the writer is woken (``Syncer.wake``) to store the files it completed."""

    def __init__(self, syncer: Syncer, e: Embedder, items: list[tuple[str, str]]) -> None:
        super().__init__(name="memd-wave", daemon=True)
        self.syncer, self.e, self.items = syncer, e, items
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            self.syncer._embed_texts(self.e, self.items, SyncReport())
        except Exception as exc:  # raised in the writer, at its next step
            self.error = exc
        finally:
            self.syncer.rest_until = 0.0
            self.syncer.wake()


class _BadTexts(BadVectors):
    """Some texts of a batch got vectors no search can use; ``hashes`` names them (the other
    texts of the batch were kept)."""

    def __init__(self, message: str, hashes: set[str]) -> None:
        super().__init__(message)
        self.hashes = hashes


def _bad_rows(vectors: Vectors, rows: int, dims: int) -> set[int]:
    """The rows of ``vectors`` that are not finite or are all zero (all of them when the
    shape is wrong)."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape != (rows, dims):
        return set(range(rows))
    finite = np.isfinite(arr).all(axis=1)
    zero = np.linalg.norm(np.nan_to_num(arr).astype(np.float64), axis=1) < 1e-6
    return {int(i) for i in np.flatnonzero(~finite | zero)}


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _tracked(act: Activity, progress: Progress | None) -> Progress:
    """A progress callback that keeps ``act`` up to date and passes the call on."""

    def track(phase: str, done: int, total: int) -> None:
        if phase == "scan":  # the embedding phase counts chunks too: _embed_pending tracks it
            act.scanned(done, total)
        if progress is not None:
            progress(phase, done, total)

    return track


def _stack(vectors: list[Vectors]) -> Vectors | None:
    return np.stack(vectors).astype(np.float32) if vectors else None


class _RebuildAborted(Exception):
    pass
