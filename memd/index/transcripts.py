"""A workspace's session transcripts in the index: which are due, and what is stored of them."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from memd.config import SessionsConfig
from memd.index.db import atomic
from memd.index.index import Index
from memd.index.report import IndexEntry, SyncReport
from memd.index.store import FileRow, Store
from memd.redact import redact
from memd.sessions.transcript import list_transcripts, render

__all__ = ["Transcripts"]


class Transcripts:
    """The transcripts directory of one workspace, held by its Syncer.

    A transcript that grows is not reindexed on every message: only when it grew by the
    configured delta, went quiet, or was rewritten (its indexed bytes changed: an edit, a
    rewrite in place). A row's hash is the SHA-256 of the bytes indexed, so a rewrite is told
    from an append by those bytes alone. A file in another format is not indexed and is kept
    in ``unreadable`` (status and every reply's freshness count it), read again only when it
    changes.
    """

    def __init__(self, directory: Path, limits: SessionsConfig, *, redact_text: bool) -> None:
        self.directory = directory
        self.limits = limits
        self.redact_text = redact_text
        # "sessions/<name>" -> (size, mtime_ns, why memd cannot read it)
        self.unreadable: dict[str, tuple[int, int, str]] = {}

    def reconcile(
        self,
        store: Store,
        report: SyncReport,
        stored: dict[str, FileRow],
        *,
        fresh: bool,
        index_file: Callable[[IndexEntry, str], None],
    ) -> None:
        """Index (with ``index_file``) the transcripts that are new, rewritten, grew past the
        delta or went quiet; drop the rows of those that are gone."""
        files, complete = list_transcripts(self.directory)
        present = set()
        redact_fn = redact if self.redact_text else None
        for t in files:
            rel = f"sessions/{t.name}"
            present.add(rel)
            row = stored.get(rel)
            known = self.unreadable.get(rel)
            if known is not None and known[:2] == (t.size, t.mtime_ns):
                report.skipped.append((rel, known[2]))
                continue
            if row and row.same_stat(t.size, t.mtime_ns):
                report.unchanged += 1
                continue
            if row and not fresh and not self._due(t.abs, row.size, t.mtime_ns, row.hash):
                continue  # grew, but not enough yet: indexed when it passes the delta or rests
            try:
                data = t.abs.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                report.errors.append((rel, f"cannot read: {exc.strerror or exc}"))
                continue
            digest = hashlib.sha256(data).hexdigest()
            if row and row.hash == digest:
                with atomic(store.conn):
                    store.touch_file(rel, t.mtime_ns, t.size)
                report.unchanged += 1
                continue
            rendered = render(data, redact=redact_fn)
            why = rendered.unreadable
            if why is not None:
                self.unreadable[rel] = (t.size, t.mtime_ns, why)
                report.skipped.append((rel, why))
                if row is not None:  # rewritten in a format memd does not read
                    store.remove(rel)
                    report.removed += 1
                continue
            self.unreadable.pop(rel, None)
            entry = IndexEntry(
                rel,
                "sessions",
                "session",
                None,
                t.mtime_ns,
                t.size,
                digest,
                rendered.line_map,
            )
            index_file(entry, rendered.text)
        if complete:
            for rel in set(self.unreadable) - present:
                del self.unreadable[rel]
            gone = [p for p, r in stored.items() if p not in present and r.source == "sessions"]
            for path in gone:
                store.remove(path)
                report.removed += 1

    def _due(self, path: Path, indexed_size: int, mtime_ns: int, indexed_hash: str) -> bool:
        limits = self.limits
        try:
            size = path.stat().st_size
        except OSError:
            return True
        if size < indexed_size:
            return True  # truncated or rewritten
        if time.time() - mtime_ns / 1e9 >= limits.idle_seconds:
            return True  # the conversation went quiet: index its tail
        grown = size - indexed_size
        if limits.delta_bytes <= 0 or grown >= limits.delta_bytes:
            return True
        try:
            with open(path, "rb") as f:
                if _prefix_digest(f, indexed_size) != indexed_hash:
                    return True  # what was indexed changed: a rewrite, not an append
                if limits.delta_messages <= 0:
                    return grown > 0
                return f.read(grown).count(b"\n") >= limits.delta_messages
        except OSError:
            return True

    def due(self, index: Index) -> bool:
        """Whether some transcript should be reindexed now (checked cheaply every few seconds)."""
        files, _ = list_transcripts(self.directory)
        with index.reader() as store:
            rows = {p: r for p, r in store.files().items() if r.source == "sessions"}
        names = {f"sessions/{t.name}" for t in files}
        if set(rows) - names:
            return True  # a transcript was deleted
        for t in files:
            rel = f"sessions/{t.name}"
            row = rows.get(rel)
            if row is None:
                known = self.unreadable.get(rel)
                if known is None or known[:2] != (t.size, t.mtime_ns):
                    return True
                continue
            if not row.same_stat(t.size, t.mtime_ns) and self._due(
                t.abs, row.size, t.mtime_ns, row.hash
            ):
                return True
        return False


def _prefix_digest(f: BinaryIO, size: int) -> str:
    """The SHA-256 of the first ``size`` bytes of ``f``, read in blocks; ``f`` is left there."""
    digest = hashlib.sha256()
    left = size
    while left > 0:
        block = f.read(min(left, 1 << 20))
        if not block:
            break
        digest.update(block)
        left -= len(block)
    return digest.hexdigest()
