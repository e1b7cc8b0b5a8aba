"""Rebuilding: a complete new index built into a temporary database while searches keep
reading the old one, caught up with the files that changed meanwhile and swapped in only
when complete; and the estimate of what a rebuild would send to the embedder.

Its own module: the whole-index build (a different model or chunking, or one asked for),
apart from the incremental sync of the live index (memd/index/sync.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import apsw

from memd.index.chunk import LINES_VERSION, chunk_resumable, fit_to_model
from memd.index.db import atomic, translate_errors
from memd.index.files import UNCAPPED, FileIndexing, decode_memory
from memd.index.identity import KEYWORD_ONLY_MODEL, Identity
from memd.index.report import Activity, Progress, SyncReport, tracked
from memd.index.store import Store, VectorStore
from memd.index.tail import indexed_part
from memd.markdown.discover import discover, read_regular
from memd.redact import redact
from memd.sessions.transcript import list_transcripts, render

__all__ = ["Rebuilding"]

logger = logging.getLogger(__name__)


# New text a rebuild embeds between two calls of its progress callback (which may stop it).
REBUILD_STEP_CHARS = 16 * 1024


class Rebuilding(FileIndexing):
    """The rebuild of a Syncer (memd/index/sync.py), which holds the state below."""

    lock: threading.RLock

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

    def rebuild(
        self, *, progress: Progress | None = None, reason: str | None = "forced"
    ) -> SyncReport:
        """Build a complete new index in a temporary file and swap it in; the old one serves
        searches meanwhile and stays untouched if anything fails."""
        started = time.monotonic()
        report = SyncReport(rebuilt=True, reason=reason)
        with self.lock:
            if self.status.rebuilding:
                report.errors.append(("", "a rebuild is already running"))
                return report
            self.status.rebuilding = True
        act = self.status.rebuild_activity = Activity("rebuild")
        try:
            self._rebuild(report, tracked(act, progress), act)
        finally:
            self.status.rebuilding = False
            self.status.rebuild_activity = None
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
                        f"{counts['pending_files']} file(s) could not be embedded: {self.status.last_error}"
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
                self.status.last_sync = time.time()
        except BaseException as exc:
            if conn is not None:
                conn.close()
            self.index.remove_temp_files()
            if isinstance(exc, _RebuildAborted):
                report.errors.append(("", f"rebuild abandoned, old index kept: {exc}"))
                self.status.last_error = str(exc)
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


class _RebuildAborted(Exception):
    pass
