"""Transcripts in the syncer: when a grown transcript is reindexed, and how it is stored."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from memd.config import IndexConfig, SessionsConfig
from memd.index.db import atomic
from memd.index.index import Index
from memd.index.report import IndexEntry, SyncReport
from memd.index.store import FileRow, Store
from memd.redact import redact
from memd.sessions.transcript import list_transcripts, render

__all__ = ["TranscriptSync"]


class TranscriptSync:
    """The transcript half of Syncer (a mixin: Syncer provides the attributes below)."""

    index: Index
    config: IndexConfig
    sessions_dir: Path | None
    sessions: SessionsConfig

    if TYPE_CHECKING:

        def _index_file(
            self,
            store: Store,
            entry: IndexEntry,
            text: str,
            model: str,
            report: SyncReport,
            same_vectors: bool,
        ) -> None: ...

    def _reconcile_sessions(
        self,
        store: Store,
        report: SyncReport,
        stored: dict[str, FileRow],
        *,
        fresh: bool,
        model: str,
        same_vectors: bool,
    ) -> None:
        """Index transcripts that are new, rewritten, grew past the delta, or went quiet."""
        assert self.sessions_dir is not None
        files, complete = list_transcripts(self.sessions_dir)
        present = set()
        redact_fn = redact if self.config.redact else None
        for t in files:
            rel = f"sessions/{t.name}"
            present.add(rel)
            row = stored.get(rel)
            if row and (row.size, row.mtime_ns) == (t.size, t.mtime_ns):
                report.unchanged += 1
                continue
            if row and not fresh and not self._session_due(t.abs, row.size, t.mtime_ns):
                continue  # grew, but not enough yet: indexed when it passes the delta or rests
            try:
                rendered = render(t.abs.read_bytes(), redact=redact_fn)
            except FileNotFoundError:
                continue
            except OSError as exc:
                report.errors.append((rel, f"cannot read: {exc.strerror or exc}"))
                continue
            if row and row.hash == rendered.hash:
                with atomic(store.conn):
                    store.touch_file(rel, t.mtime_ns, t.size)
                report.unchanged += 1
                continue
            entry = IndexEntry(
                rel,
                "sessions",
                "session",
                None,
                t.mtime_ns,
                t.size,
                rendered.hash,
                rendered.line_map,
            )
            self._index_file(store, entry, rendered.text, model, report, same_vectors)
        if complete:
            gone = [p for p, r in stored.items() if p not in present and r.source == "sessions"]
            for path in gone:
                store.remove(path)
                report.removed += 1

    def _session_due(self, path: Path, indexed_size: int, mtime_ns: int) -> bool:
        limits = self.sessions
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
        if limits.delta_messages <= 0:
            return grown > 0
        with open(path, "rb") as f:
            f.seek(indexed_size)
            return f.read(grown).count(b"\n") >= limits.delta_messages

    def sessions_due(self) -> bool:
        """Whether some transcript should be reindexed now (checked cheaply every few seconds)."""
        if self.sessions_dir is None:
            return False
        files, _ = list_transcripts(self.sessions_dir)
        with self.index.reader() as store:
            rows = {p: r for p, r in store.files().items() if r.source == "sessions"}
        names = {f"sessions/{t.name}" for t in files}
        if set(rows) - names:
            return True  # a transcript was deleted
        for t in files:
            row = rows.get(f"sessions/{t.name}")
            if row is None:
                return True
            if (row.size, row.mtime_ns) != (t.size, t.mtime_ns) and self._session_due(
                t.abs, row.size, t.mtime_ns
            ):
                return True
        return False
