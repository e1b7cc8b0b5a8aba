"""The file-by-file phase of a sync: walk the workspace (or look at the named paths), and for
each file that changed read, hash, redact and chunk it and replace its rows in one
transaction, with the vectors the cache already has; a grown file is indexed again from its
resume point only (memd/index/tail.py), transcripts by memd/index/transcripts.py.

Its own module: what a file's rows are, apart from embedding what they lack
(memd/index/backlog.py) and from the sync and rebuild that run this phase (memd/index/sync.py,
memd/index/rebuild.py).
"""

from __future__ import annotations

import sys
import time

from memd.changes import Changes
from memd.embed.base import Vectors
from memd.index.backlog import PendingEmbedding
from memd.index.chunk import Chunk, chunk_resumable, fit_to_model
from memd.index.db import atomic
from memd.index.identity import KEYWORD_ONLY_MODEL
from memd.index.index import Index
from memd.index.report import IndexEntry, Progress, SyncReport
from memd.index.store import FileRow, NewChunk, Resume, Store
from memd.index.tail import changed_chunks, digests, indexed_part, resume_at
from memd.index.transcripts import Transcripts
from memd.markdown.discover import SourceFile, discover, memory_file, read_regular
from memd.redact import reads_whole_text, redact
from memd.sessions.transcript import map_lines

__all__ = ["UNCAPPED", "FileIndexing", "decode_memory"]


# A file modified this recently may change again within the same timestamp tick ("racy git"):
# compare its hash even when size and mtime match the index.
RACY_NS = 2_000_000_000
# Files are found whatever their size: one over index.max_file_bytes is indexed in part
# (memd/index/tail.py), never dropped from the index.
UNCAPPED = sys.maxsize


def decode_memory(data: bytes) -> str:
    """A memory file's text: UTF-8, or UTF-16 when it starts with a byte-order mark (an editor's
    "Unicode" save); read as UTF-8 such a file matched no keyword and no redaction pattern."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", "replace")
    return data.decode("utf-8", "replace")


class FileIndexing(PendingEmbedding):
    """The per-file steps of a Syncer (memd/index/sync.py), which holds the state below."""

    extra_paths: tuple[str, ...]
    transcripts: Transcripts | None
    _look_next: bool

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
        look, self._look_next = self._look_next, False
        self._reconcile(store, report, progress, fresh=False, look=look)

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
        self.status.skipped = list(found.skipped)
        cap = self.config.max_file_bytes
        self.status.partial = {f.rel: f.size for f in found.files if f.size > cap}
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
            self.status.partial[f.rel] = max(f.size, len(data))
        else:
            self.status.partial.pop(f.rel, None)
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
        self.status.tails += 1
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
                self.status.partial.pop(rel, None)
                if row is not None and row.source == "memory":
                    store.remove(rel)
                    report.removed += 1
                continue
            report.scanned += 1
            self._sync_one(store, f, row, report, model, same_vectors, now_ns, look=True)
        return True

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

    @staticmethod
    def _model(store: Store) -> str:
        identity = Index.stored_identity(store.conn)
        return identity.model if identity else KEYWORD_ONLY_MODEL
