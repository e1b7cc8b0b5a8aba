"""The short-term recall store (``short-term-recall.json`` in the workspace's dreaming folder,
memd/dreams/place.py): which daily-log snippets searches surfaced, how often and on which
days, under OpenClaw's lock and caps.

What is counted into it lives here; the file itself (lock, reading, atomic replace) in
memd/dreams/recall_file.py, and one entry's form in memd/dreams/recall_entry.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from memd.clock import Clock
from memd.dreams.claims import CACHED_LINES, recalled_claims
from memd.dreams.privacy import from_transcript
from memd.dreams.recall_entry import (
    MAX_QUERY_HASHES,
    MAX_RECALL_DAYS,
    RecallEntry,
    entry_key,
    is_int,
    is_num,
    iso_time,
    recent_distinct,
)
from memd.dreams.recall_file import OwnWrite, RecallFile, entry_line
from memd.dreams.recall_text import (
    DAY,
    collapse,
    concept_tags,
    is_promotable,
    is_short_term,
    query_hash,
)

__all__ = ["RecallStore", "Signal"]

# What one counted result is: a search's ("recall"), a daily note read by dreaming ("daily"),
# or another day's note of the same claim, found by dreaming ("grounded").
Signal = Literal["recall", "daily", "grounded"]


# The notes the recorder read last, kept while their size, mtime and inode stay the same, up
# to NOTES_BYTES of them: a busy daemon's searches recall the same notes again and again, and
# reading them was most of the recorder's time (memd/dreams/claims.py keeps their cuts).
NOTES_BYTES = 2 * 2**20

# The counts status gives of each store, with the signature (inode, size, mtime) of the file
# they were counted from. Status is polled, and parsing a store of 10,000 entries (8.7 MB) takes
# a tenth of a second of the daemon's GIL at every call; unchanged, the file is not read again.
_counted: dict[Path, tuple[tuple[int, int, int], dict[str, int]]] = {}


@functools.lru_cache(maxsize=1024)
def _snippet_facts(path: str, snippet: str) -> tuple[bool, str, tuple[str, ...]]:
    """(promotable, collapsed text, concept tags) of a result's snippet. The same chunks come
    back search after search, and these regex passes were most of the recorder's time."""
    if not is_promotable(snippet):
        return False, "", ()
    collapsed = collapse(snippet)
    return True, collapsed, tuple(concept_tags(path, collapsed))


class RecallStore(RecallFile):
    """The recall store of the workspace at ``root``: what searches and dreaming count into
    its file (:class:`RecallFile`); every write happens under ``locked()``."""

    def __init__(
        self, root: Path, *, folder: Path | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(root, folder=folder, clock=clock)
        self._notes: OrderedDict[Path, tuple[tuple[int, int, int], list[str]]] = OrderedDict()
        self._notes_bytes = 0

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
                own = OwnWrite(None, self.load(), {})
            entries, lines = own.entries, own.lines
            touched = 0
            files: dict[str, list[str] | None] = {}

            def lines_of(path: str) -> list[str] | None:
                if path not in files:
                    files[path] = self._file_lines(path)
                return files[path]

            for query, results, when in searches:
                # Between searches, let a waiting search have the GIL at once: this runs a
                # batch of a second's searches, and would otherwise hold the interpreter
                # for the switch interval (5 ms) at a time while replies wait.
                time.sleep(0)
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
                        lines[key] = entry_line(key, entry)
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
        if not is_int(start) or not is_int(end) or not 1 <= start <= end:
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
        score = min(1.0, max(0.0, float(score))) if is_num(score) else 0.0
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
        entry.query_hashes = recent_distinct(entry.query_hashes, qh, MAX_QUERY_HASHES)
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
            st = os.stat(target)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            known = self._notes.get(target)
            if known is not None and known[0] == key:
                self._notes.move_to_end(target)
                return known[1]
            lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        if len(lines) <= CACHED_LINES:
            old = self._notes.pop(target, None)
            self._notes_bytes += st.st_size - (old[0][1] if old else 0)
            self._notes[target] = (key, lines)
            while self._notes_bytes > NOTES_BYTES:
                _, ((_, size, _), _) = self._notes.popitem(last=False)
                self._notes_bytes -= size
        return lines

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
                    if is_int(update.get(name)):
                        fields[name] = update[name]
                if isinstance(update.get("snippet"), str) and update["snippet"].strip():
                    fields["snippet"] = collapse(update["snippet"])
                entries[key] = dataclasses.replace(entry, **fields)
                changed += 1
            if changed:
                self.save(entries)
            return changed

    def counts(self) -> dict[str, int]:
        """Entries in the store: all, promoted, with concept tags, recalled on 2+ days; read
        again only when the file has changed since the last count."""
        signature = self._signature()  # before reading: a write meanwhile means a new count
        last = _counted.get(self.path)
        if signature is not None and last is not None and last[0] == signature:
            return dict(last[1])
        entries = list(self.load().values())
        counts = {
            "entries": len(entries),
            "promoted": sum(e.promoted_at is not None for e in entries),
            "concept_tagged": sum(bool(e.concept_tags) for e in entries),
            "spaced": sum(len(e.recall_days) >= 2 for e in entries),
        }
        if signature is not None:
            _counted[self.path] = (signature, counts)
        return dict(counts)

    def _day(self, moment: dt.datetime) -> str:
        """The YYYY-MM-DD day bucket of ``moment`` in the user's time zone (machine local if unset)."""
        return self.clock.day(moment).isoformat()
