"""What a sync did (SyncReport), what one is doing (Activity, and the Progress callbacks that
follow it), what callers read of a syncer (SyncStatus), and one file about to be indexed
(IndexEntry)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Activity", "IndexEntry", "Progress", "SyncReport", "SyncStatus", "tracked"]

Progress = Callable[[str, int, int], None]


@dataclass
class Activity:
    """The pass a syncer is in, for status and progress bars: ``kind`` is "index" (files read
    into keyword rows), "embed" (the embedding backlog of the live index) or "rebuild" (a new
    index built beside the live one); ``phase`` is "scan" or "embed" within it.

    The rate and the ETA count what the model embeds as each text is embedded: the texts
    (``texts_done`` of ``texts_total``, those the embedding cache lacks) and their characters
    (``chars_done`` of ``chars_total``), and the ETA is the characters left at the pace of
    those done. Counted by files stored, a long file held the count still for many steps and
    the ETA climbed until it was stored. Counted by texts, a pass whose cheap texts came first
    promised a quarter of its time: 9,766 chunks whose short lines were embedded first, then
    only their chunks, each 15 times as long, said "about 12 minutes left" for 40 minutes."""

    kind: str
    phase: str = "scan"
    files_done: int = 0
    files_total: int = 0
    chunks_done: int = 0
    chunks_total: int = 0
    texts_done: int = 0
    texts_total: int = 0
    chars_done: int = 0
    chars_total: int = 0
    started: float = field(default_factory=time.monotonic)
    embed_started: float | None = None

    def scanned(self, done: int, total: int) -> None:
        self.phase, self.files_done, self.files_total = "scan", done, total

    def embedding(self, done: int, total: int, chunks_total: int | None = None) -> None:
        if self.phase != "embed" or self.embed_started is None:
            self.embed_started = time.monotonic()
        self.phase, self.files_done, self.files_total = "embed", done, total
        if chunks_total is not None:
            self.chunks_total = chunks_total

    def texts_left(self, left: int, chars: int) -> None:
        """The model has ``left`` texts of ``chars`` characters in all still to embed, from
        now on."""
        self.texts_total = self.texts_done + left
        self.chars_total = self.chars_done + chars

    def embedded(self, texts: int, chars: int) -> None:
        """The model has embedded ``texts`` more texts, of ``chars`` characters."""
        self.texts_done += texts
        self.chars_done += chars

    def to_dict(self) -> dict[str, Any]:
        """The activity as status reports it: counts, chunks and texts per second and an ETA
        (seconds; None until a rate is known)."""
        now = time.monotonic()
        spent = max(now - self.embed_started, 1e-3) if self.embed_started is not None else 0.0
        rate = eta = text_rate = None
        if spent and self.chars_total and self.chars_done:
            # the pace in chunks, from the characters: a long file's chunks count only once
            # all of its texts are in, and a short text costs the model less than a long one
            text_rate = self.texts_done / spent
            char_rate = self.chars_done / spent
            rate = char_rate * max(self.chunks_total, 1) / self.chars_total
            eta = max(self.chars_total - self.chars_done, 0) / char_rate
        elif spent and self.chunks_done:  # nothing for the model: the vectors come from cache
            rate = self.chunks_done / spent
            eta = max(self.chunks_total - self.chunks_done, 0) / rate
        return {
            "kind": self.kind,
            "phase": self.phase,
            "files_done": self.files_done,
            "files_total": self.files_total,
            "chunks_done": self.chunks_done,
            "chunks_total": self.chunks_total,
            "chunks_per_s": round(rate, 2) if rate else None,
            "texts_done": self.texts_done,
            "texts_total": self.texts_total,
            "texts_per_s": round(text_rate, 2) if text_rate else None,
            "chars_done": self.chars_done,
            "chars_total": self.chars_total,
            "eta_s": round(eta, 1) if eta is not None and self.phase == "embed" else None,
            "elapsed_s": round(now - self.started, 1),
        }


@dataclass
class SyncReport:
    """What one sync did."""

    scanned: int = 0
    indexed: int = 0
    unchanged: int = 0
    removed: int = 0
    chunks_written: int = 0
    embedded: int = 0
    embedded_chars: int = 0  # the characters of the texts embedded
    cache_hits: int = 0
    pending_files: int = 0
    rebuilt: bool = False
    reason: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, later: SyncReport) -> None:
        """Fold in the report of a later slice of the same sync."""
        counts = ("scanned", "indexed", "unchanged", "removed", "chunks_written", "embedded")
        for name in (*counts, "embedded_chars", "cache_hits"):
            setattr(self, name, getattr(self, name) + getattr(later, name))
        self.pending_files = later.pending_files
        self.rebuilt = self.rebuilt or later.rebuilt
        self.reason = later.reason or self.reason
        self.skipped += later.skipped
        self.errors += later.errors
        self.seconds += later.seconds


@dataclass(frozen=True)
class IndexEntry:
    """One file to index, whatever its source."""

    rel: str
    source: str
    kind: str
    day: str | None
    mtime_ns: int
    size: int
    file_hash: str
    line_map: list[int] | None = None


@dataclass
class SyncStatus:
    """What status, freshness and the writer read of a syncer (memd/index/sync.py); only the
    syncer writes it."""

    last_sync: float | None = None  # wall-clock time of the last completed sync
    last_error: str | None = None
    # Files the last full reconcile found and could not index, with why: every reply's
    # freshness counts them, so nothing unsearchable is reported fresh.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Files over index.max_file_bytes, indexed only in part, and their sizes.
    partial: dict[str, int] = field(default_factory=dict)
    tails: int = 0  # files indexed again from their resume point only (they grew)
    rebuilding: bool = False
    filling: bool = False  # the first sync of an empty index is running
    # What the live index's writer and a rebuild are doing now, for status (None: idle).
    activity: Activity | None = None
    backlog: Activity | None = None
    rebuild_activity: Activity | None = None

    def current_activity(self) -> Activity | None:
        """The rebuild's activity, else the live index's sync, else its embedding backlog."""
        return self.rebuild_activity or self.activity or self.backlog


def tracked(act: Activity, progress: Progress | None) -> Progress:
    """A progress callback that keeps ``act`` up to date and passes the call on."""

    def track(phase: str, done: int, total: int) -> None:
        if phase == "scan":  # the embedding phase counts chunks too: _embed_pending tracks it
            act.scanned(done, total)
        if progress is not None:
            progress(phase, done, total)

    return track
