"""What a sync did (SyncReport) and one file about to be indexed (IndexEntry)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["IndexEntry", "SyncReport"]


@dataclass
class SyncReport:
    """What one sync did."""

    scanned: int = 0
    indexed: int = 0
    unchanged: int = 0
    removed: int = 0
    chunks_written: int = 0
    embedded: int = 0
    cache_hits: int = 0
    pending_files: int = 0
    rebuilt: bool = False
    reason: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


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
