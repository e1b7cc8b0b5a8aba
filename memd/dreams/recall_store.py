"""The short-term recall store (``short-term-recall.json`` in the workspace's dreaming folder,
memd/dreams/place.py): which daily-log snippets
searches surfaced, how often and on which days, under OpenClaw's lock and caps.

Over 400 lines: one file format and the protocol that keeps it whole under concurrent writers
(lock, merge, previous copy, caps), which only make sense together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

from memd.atomicfile import write_atomic
from memd.clock import Clock
from memd.dreams.claims import recalled_claims
from memd.dreams.place import DreamPlace
from memd.dreams.privacy import from_transcript
from memd.dreams.recall_lock import LOCK_RETRY_S, LOCK_STALE_S, LOCK_TIMEOUT_S, file_lock
from memd.dreams.recall_text import (
    DAY,
    MAX_CONCEPT_TAGS,
    claim_hash,
    collapse,
    concept_tags,
    is_promotable,
    is_short_term,
    query_hash,
)

__all__ = [
    "LOCK_RETRY_S",
    "LOCK_STALE_S",
    "LOCK_TIMEOUT_S",
    "RecallEntry",
    "RecallStore",
    "Signal",
    "claim_hash",
    "concept_tags",
    "entry_key",
    "is_promotable",
    "is_short_term",
    "iso_time",
    "parse_time",
    "query_hash",
]

logger = logging.getLogger(__name__)

# What one counted result is: a search's ("recall"), a daily note read by dreaming ("daily"),
# or another day's note of the same claim, found by dreaming ("grounded").
Signal = Literal["recall", "daily", "grounded"]

TMP_MAX_AGE_S = 3600.0

MAX_QUERY_HASHES = 32
MAX_RECALL_DAYS = 16

STORE_NAME = "short-term-recall.json"
LOCK_NAME = "short-term-promotion.lock"
# OpenClaw's state migration (memory-core's doctor, which runs even when memd holds the memory
# slot) moves this store into its own database and renames the file to this; memd takes the
# entries back once (by content digest, listed in ABSORBED_NAME).
ARCHIVE_NAME = STORE_NAME + ".migrated"
ABSORBED_NAME = "absorbed-archives.json"


def entry_key(path: str, start_line: int, end_line: int) -> str:
    return f"memory:{path}:{start_line}:{end_line}"


def iso_time(moment: dt.datetime) -> str:
    """A JavaScript-style UTC timestamp: ``2026-04-01T12:00:00.000Z``."""
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(stamp: str | None) -> dt.datetime | None:
    """A timestamp of the stores (``iso_time``'s, or any ISO form; UTC when it names no zone),
    or None when there is none or it does not parse."""
    if not stamp:
        return None
    try:
        moment = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _recent_distinct(items: Sequence[str], new: str | None, cap: int) -> list[str]:
    """Distinct items in order, ``new`` moved to the end, keeping the last ``cap``."""
    out: list[str] = []
    for item in [*items, *([new] if new is not None else [])]:
        if item in out:
            out.remove(item)
        out.append(item)
    return out[-cap:]


def _merged(current: RecallEntry, archived: RecallEntry) -> RecallEntry:
    """One entry from two stores that counted different times (an archive, then a new store)."""
    first = min(filter(None, (current.first_recalled_at, archived.first_recalled_at)), default="")
    return dataclasses.replace(
        current,
        recall_count=current.recall_count + archived.recall_count,
        daily_count=current.daily_count + archived.daily_count,
        grounded_count=current.grounded_count + archived.grounded_count,
        total_score=current.total_score + archived.total_score,
        max_score=max(current.max_score, archived.max_score),
        first_recalled_at=first,
        last_recalled_at=max(current.last_recalled_at, archived.last_recalled_at),
        query_hashes=_recent_distinct(
            [*archived.query_hashes, *current.query_hashes], None, MAX_QUERY_HASHES
        ),
        recall_days=sorted({*archived.recall_days, *current.recall_days})[-MAX_RECALL_DAYS:],
        promoted_at=current.promoted_at or archived.promoted_at,
    )


@dataclass
class RecallEntry:
    """One tracked line range of a daily note; JSON keys are OpenClaw's camelCase names."""

    key: str
    path: str
    start_line: int
    end_line: int
    snippet: str
    source: str = "memory"
    recall_count: int = 0
    daily_count: int = 0
    grounded_count: int = 0
    total_score: float = 0.0
    max_score: float = 0.0
    first_recalled_at: str = ""
    last_recalled_at: str = ""
    query_hashes: list[str] = field(default_factory=list)
    recall_days: list[str] = field(default_factory=list)
    concept_tags: list[str] = field(default_factory=list)
    claim_hash: str | None = None
    promoted_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "path": self.path,
            "startLine": self.start_line,
            "endLine": self.end_line,
            "source": self.source,
            "snippet": self.snippet,
            "recallCount": self.recall_count,
            "dailyCount": self.daily_count,
            "groundedCount": self.grounded_count,
            "totalScore": self.total_score,
            "maxScore": self.max_score,
            "firstRecalledAt": self.first_recalled_at,
            "lastRecalledAt": self.last_recalled_at,
            "queryHashes": list(self.query_hashes),
            "recallDays": list(self.recall_days),
            "conceptTags": list(self.concept_tags),
        }
        if self.claim_hash is not None:
            out["claimHash"] = self.claim_hash
        if self.promoted_at is not None:
            out["promotedAt"] = self.promoted_at
        return out

    @classmethod
    def from_json(cls, raw: Any, key: str | None = None) -> RecallEntry | None:
        """Parse and normalise one stored entry; None when it is invalid (the store drops it)."""
        if not isinstance(raw, Mapping):
            return None
        path, snippet, source = raw.get("path"), raw.get("snippet"), raw.get("source", "memory")
        start, end = raw.get("startLine"), raw.get("endLine")
        if not isinstance(path, str) or not is_short_term(path) or source != "memory":
            return None
        if not _is_int(start) or not _is_int(end) or not 1 <= start <= end:
            return None
        if not isinstance(snippet, str) or not is_promotable(snippet):
            return None
        counts = [raw.get(k, 0) for k in ("recallCount", "dailyCount", "groundedCount")]
        scores = [raw.get(k, 0.0) for k in ("totalScore", "maxScore")]
        if not all(_is_int(c) and c >= 0 for c in counts):
            return None
        if not all(_is_num(s) and s >= 0 for s in scores):
            return None
        stored_key = raw.get("key")
        tags = _strs(raw.get("conceptTags"))[:MAX_CONCEPT_TAGS] or concept_tags(path, snippet)
        return cls(
            key=stored_key if isinstance(stored_key, str) and stored_key else key or "",
            path=path,
            start_line=start,
            end_line=end,
            snippet=collapse(snippet),
            recall_count=counts[0],
            daily_count=counts[1],
            grounded_count=counts[2],
            total_score=float(scores[0]),
            max_score=float(scores[1]),
            first_recalled_at=_opt_str(raw.get("firstRecalledAt")) or "",
            last_recalled_at=_opt_str(raw.get("lastRecalledAt")) or "",
            query_hashes=_recent_distinct(_strs(raw.get("queryHashes")), None, MAX_QUERY_HASHES),
            recall_days=sorted(set(filter(DAY.fullmatch, _strs(raw.get("recallDays")))))[
                -MAX_RECALL_DAYS:
            ],
            concept_tags=tags,
            claim_hash=_opt_str(raw.get("claimHash")),
            promoted_at=_opt_str(raw.get("promotedAt")),
        )


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def _strs(v: Any) -> list[str]:
    return [s for s in v if isinstance(s, str)] if isinstance(v, list) else []


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@functools.lru_cache(maxsize=1024)
def _snippet_facts(path: str, snippet: str) -> tuple[bool, str, tuple[str, ...]]:
    """(promotable, collapsed text, concept tags) of a result's snippet. The same chunks come
    back search after search, and these regex passes were most of the recorder's time."""
    if not is_promotable(snippet):
        return False, "", ()
    collapsed = collapse(snippet)
    return True, collapsed, tuple(concept_tags(path, collapsed))


def _entry_line(key: str, entry: RecallEntry) -> str:
    return (
        json.dumps(key, ensure_ascii=False) + ": " + json.dumps(entry.to_json(), ensure_ascii=False)
    )


def _store_text(updated_at: str, lines: Iterable[str]) -> str:
    """The store file, one entry per line (see _entry_line). json.dumps with ``indent`` runs
    the pure-Python encoder, several times slower than the C one a line at a time uses; a
    store of thousands of entries is rewritten often, by a thread sharing the GIL with
    searches."""
    body = ",\n    ".join(lines)
    head = f'{{\n  "version": 1,\n  "updatedAt": {json.dumps(updated_at)},\n  "entries": {{'
    return head + (f"\n    {body}\n  }}\n}}\n" if body else "}\n}\n")


@dataclass
class _Own:
    """What record_many keeps between calls: the entries as in the store file with this stat
    signature (inode, size, mtime_ns), and each entry's serialised line."""

    signature: tuple[int, int, int] | None
    entries: dict[str, RecallEntry]
    lines: dict[str, str]


class RecallStore:
    """The recall store of the workspace at ``root``; every write happens under ``locked()``."""

    def __init__(
        self,
        root: Path,
        *,
        folder: Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.root = Path(root)
        self.dir = Path(folder) if folder is not None else DreamPlace.inside(self.root).folder
        self.path = self.dir / STORE_NAME
        self.prev_path = self.dir / (STORE_NAME + ".prev")
        self.lock_path = self.dir / LOCK_NAME
        self.clock = clock or Clock()
        # The entries as in the store file with this stat signature, as record_many last left
        # them: the recorder updates the store many times a minute and need not re-parse its
        # own writes. Anyone else's write (a new inode, by atomic replace) makes it stale.
        self._own: _Own | None = None

    # -- locking ---------------------------------------------------------------------------------

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the store's lock (re-entrant within a thread); raise Busy after LOCK_TIMEOUT_S."""
        return file_lock(self.lock_path)

    # -- reading and writing ---------------------------------------------------------------------

    def load(self) -> dict[str, RecallEntry]:
        """Read and normalise the store; a corrupt file is quarantined and ``.prev`` used instead."""
        if (self.dir / ARCHIVE_NAME).exists():
            self._absorb_archive()
        data = self._read(self.path)
        if data is not None:
            return data
        if not self.path.exists():
            return {}
        with self.locked():  # quarantine only under the lock, after a second look
            data = self._read(self.path)
            if data is not None or not self.path.exists():
                return data or {}
            bad = self.dir / f"{STORE_NAME}.corrupt-{int(time.time() * 1000)}"
            logger.warning("recall store %s does not parse; moved to %s", self.path, bad.name)
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, bad)
            prev = self._read(self.prev_path)
            if not prev:
                logger.warning("no usable %s: starting an empty recall store", self.prev_path.name)
                return {}
            write_atomic(self.path, self.prev_path.read_bytes())  # restore the last good
            return prev

    def _absorb_archive(self) -> None:
        """Take back the entries of a store OpenClaw archived (see ARCHIVE_NAME), once."""
        archive, ledger = self.dir / ARCHIVE_NAME, self.dir / ABSORBED_NAME
        with self.locked():
            try:
                digest = hashlib.sha256(archive.read_bytes()).hexdigest()
                absorbed = json.loads(ledger.read_bytes()) if ledger.exists() else []
            except (OSError, ValueError) as exc:
                logger.warning("cannot take back %s: %s", archive, exc)
                return
            if not isinstance(absorbed, list) or digest in absorbed:
                return
            archived = self._read(archive)
            current = self._read(self.path)
            if archived is None or (current is None and self.path.exists()):
                return  # an unreadable side: leave both as they are
            merged = dict(current or {})
            for key, entry in archived.items():
                merged[key] = _merged(merged[key], entry) if key in merged else entry
            self.save(merged)
            write_atomic(ledger, (json.dumps([*absorbed, digest]) + "\n").encode())
            logger.info(
                "recall store of %s: took back %d entries from %s (moved there by OpenClaw)",
                self.root,
                len(archived),
                ARCHIVE_NAME,
            )

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self, path: Path) -> dict[str, RecallEntry] | None:
        """The entries of one store file; {} if missing, None if it does not parse."""
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            return {} if path == self.prev_path else None
        except (OSError, ValueError) as exc:
            logger.debug("reading %s failed: %s", path, exc)
            return None
        if not isinstance(raw, dict) or raw.get("version") != 1:
            return None
        entries = raw.get("entries")
        if not isinstance(entries, dict):
            return None
        out: dict[str, RecallEntry] = {}
        for key, value in entries.items():
            entry = RecallEntry.from_json(value, key)
            if entry is not None:
                out[entry.key] = entry
        return out

    def save(self, entries: Mapping[str, RecallEntry]) -> None:
        """Replace the store atomically (temp file, fsync, rename, fsync dir), keeping ``.prev``."""
        self._save((_entry_line(k, e) for k, e in entries.items()), current_parses=False)

    def _save(self, lines: Iterable[str], *, current_parses: bool) -> None:
        self._own = None
        with self.locked():
            text = _store_text(iso_time(self.clock.now()), lines)
            try:
                current = self.path.read_bytes()
                if not current_parses:
                    json.loads(current)
            except (OSError, ValueError):
                current = None  # missing or not good: never copied over the last good .prev
            if current is not None:
                write_atomic(self.prev_path, current)
            write_atomic(self.path, text.encode("utf-8"))

    def cleanup(self, max_age_s: float = TMP_MAX_AGE_S) -> int:
        """Remove temp files older than ``max_age_s`` left by a crashed save; return how many."""
        removed = 0
        now = time.time()
        for tmp in self.dir.glob(f".{STORE_NAME}*.tmp-*") if self.dir.is_dir() else ():
            try:
                if now - tmp.stat().st_mtime > max_age_s:
                    tmp.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    # -- updates ---------------------------------------------------------------------------------

    def record(
        self,
        query: str,
        results: Sequence[Mapping[str, Any]],
        *,
        signal: Signal = "recall",
    ) -> int:
        """Count the short-term, promotable results of one search; return how many entries changed."""
        return self.record_many([(query, results, self.clock.now())], signal=signal)

    def record_many(
        self,
        searches: Sequence[tuple[str, Sequence[Mapping[str, Any]], dt.datetime]],
        *,
        signal: Signal = "recall",
    ) -> int:
        """Record several searches (query, results, when) under one lock, load and save.

        A busy daemon hands its recorder dozens of searches at a time: loading and rewriting
        the whole store once per search would spend its time parsing JSON.
        """
        with self.locked():
            own, self._own = self._own, None
            if own is not None and own.signature != self._signature():
                own = None  # written by someone else since
            if own is None:
                own = _Own(None, self.load(), {})
            entries, lines = own.entries, own.lines
            touched = 0
            files: dict[str, list[str] | None] = {}

            def lines_of(path: str) -> list[str] | None:
                if path not in files:
                    files[path] = self._file_lines(path)
                return files[path]

            for query, results, when in searches:
                stamp, today, qh = iso_time(when), self._day(when), query_hash(query)
                if signal == "recall":  # the claims a hit holds, not the whole chunk
                    results = [
                        claim
                        for r in results
                        for claim in (
                            recalled_claims(query, r, lines_of)
                            if not from_transcript(r.get("path"))
                            else [r]
                        )
                    ]
                for result in results:
                    key = self._apply(entries, result, qh, today, stamp, signal, dedupe=True)
                    if key is not None:
                        lines.pop(key, None)
                        touched += 1
            if touched:
                for key, entry in entries.items():
                    if key not in lines:
                        lines[key] = _entry_line(key, entry)
                self._save((lines[k] for k in entries), current_parses=own.signature is not None)
            own.signature = self._signature()
            if own.signature is not None:
                self._own = own
        return touched

    def _apply(
        self,
        entries: dict[str, RecallEntry],
        result: Mapping[str, Any],
        qh: str,
        today: str,
        stamp: str,
        signal: Signal,
        *,
        dedupe: bool,
    ) -> str | None:
        """Count one result into ``entries``; return the key of the entry it changed. With
        ``dedupe``, a query already counted on ``today`` is not counted again."""
        path, start, end = result.get("path"), result.get("start_line"), result.get("end_line")
        if not isinstance(path, str) or not is_short_term(path):
            return None
        if result.get("source", "memory") != "memory":
            return None
        if not _is_int(start) or not _is_int(end) or not 1 <= start <= end:
            return None
        snippet = result.get("snippet")
        if snippet is None:
            snippet = self._read_lines(path, start, end)
        if not isinstance(snippet, str):
            return None
        promotable, collapsed, tags = _snippet_facts(path, snippet)
        if not promotable:
            return None
        score = result.get("score")
        score = min(1.0, max(0.0, float(score))) if _is_num(score) else 0.0
        key = entry_key(path, start, end)
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = RecallEntry(key, path, start, end, "", first_recalled_at=stamp)
        duplicate = dedupe and qh in entry.query_hashes and today in entry.recall_days
        if not duplicate:
            if signal == "daily":
                entry.daily_count += 1
            elif signal == "grounded":
                entry.grounded_count += 1
            else:
                entry.recall_count += 1
            entry.total_score += score
            entry.max_score = max(entry.max_score, score)
        entry.snippet = collapsed
        entry.last_recalled_at = stamp
        entry.query_hashes = _recent_distinct(entry.query_hashes, qh, MAX_QUERY_HASHES)
        entry.recall_days = sorted({*entry.recall_days, today})[-MAX_RECALL_DAYS:]
        entry.concept_tags = list(tags)
        return key

    def count(
        self,
        entries: dict[str, RecallEntry],
        query: str,
        results: Sequence[Mapping[str, Any]],
        when: dt.datetime,
        *,
        signal: Signal,
        day: str | None = None,
        dedupe: bool = True,
    ) -> list[str]:
        """Count ``results`` into ``entries`` (nothing is saved): what dreaming records, with
        ``day`` (the day of the note a signal came from) as the day bucket instead of today's.
        Returns the keys counted."""
        stamp, qh = iso_time(when), query_hash(query)
        bucket = day if day is not None and DAY.fullmatch(day) else self._day(when)
        keys = []
        for result in results:
            key = self._apply(entries, result, qh, bucket, stamp, signal, dedupe=dedupe)
            if key is not None:
                keys.append(key)
        return keys

    @contextlib.contextmanager
    def editing(self) -> Iterator[dict[str, RecallEntry]]:
        """The entries, under the lock, saved on leaving (unless an exception leaves)."""
        with self.locked():
            entries = self.load()
            yield entries
            self.save(entries)

    def _read_lines(self, path: str, start: int, end: int) -> str | None:
        """The text of lines ``start..end`` of a workspace file, for results given without one."""
        lines = self._file_lines(path)
        return None if lines is None else "\n".join(lines[start - 1 : end])

    def _file_lines(self, path: str) -> list[str] | None:
        """The lines of a workspace file (None: outside the workspace, or unreadable)."""
        if not isinstance(path, str) or not is_short_term(path):
            return None
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root.resolve()):
            return None
        try:
            return target.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None

    def mark_promoted(self, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """Stamp ``promotedAt`` on the given keys, moving relocated ones; return how many changed."""
        with self.locked():
            entries = self.load()
            stamp = iso_time(self.clock.now())
            changed = 0
            for key, update in updates.items():
                entry = entries.get(key)
                if entry is None:
                    continue
                fields: dict[str, Any] = {"promoted_at": stamp}
                for name in ("start_line", "end_line"):
                    if _is_int(update.get(name)):
                        fields[name] = update[name]
                if isinstance(update.get("snippet"), str) and update["snippet"].strip():
                    fields["snippet"] = collapse(update["snippet"])
                entries[key] = dataclasses.replace(entry, **fields)
                changed += 1
            if changed:
                self.save(entries)
            return changed

    def counts(self) -> dict[str, int]:
        """Entries in the store: all, promoted, with concept tags, recalled on 2+ days."""
        entries = list(self.load().values())
        return {
            "entries": len(entries),
            "promoted": sum(e.promoted_at is not None for e in entries),
            "concept_tagged": sum(bool(e.concept_tags) for e in entries),
            "spaced": sum(len(e.recall_days) >= 2 for e in entries),
        }

    def _day(self, moment: dt.datetime) -> str:
        """The YYYY-MM-DD day bucket of ``moment`` in the user's time zone (machine local if unset)."""
        return self.clock.day(moment).isoformat()
