"""The Light phase of dreaming: read the recent daily notes into the recall store as "daily"
signals, then stage the recent short-term memories, near-duplicates merged.

As OpenClaw does it: daily notes of the last 14 days (``memory/YYYY-MM-DD*.md``, newest
first) are cut into snippets (memd/dreams/daily.py) and each is counted once per dreaming day
with the query ``__dreaming_daily__:<day of the note>`` and the note's day as its day bucket;
a note unchanged since it was read today is not read again (``daily-ingestion.json`` keeps
each note's size and modification time). At most ``max(20, 4 × limit)`` snippets per run,
shared among the notes. Staging takes the entries seen in the last two days that Light has
not staged since they were last seen, newest first, merges the ones that say the same thing
(memd/dreams/similar.py) and records a Light hit for each of the first ``limit``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic
from memd.dreams.daily import DAILY_SCORE, daily_snippets
from memd.dreams.phases import PhaseHits
from memd.dreams.place import DreamPlace
from memd.dreams.recall_entry import RecallEntry, parse_time
from memd.dreams.recall_store import RecallStore
from memd.dreams.similar import Group, Meaning, dedupe

__all__ = [
    "DAILY_LOOKBACK_DAYS",
    "INGESTION_STATE",
    "LightSettings",
    "NoteBatch",
    "collect_daily",
    "ingest_daily",
    "stage",
    "within_lookback",
]

logger = logging.getLogger(__name__)

INGESTION_STATE = "daily-ingestion.json"
DAILY_LOOKBACK_DAYS = 14
DAILY_QUERY = "__dreaming_daily__:{day}"
_NOTE = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:-[^/]+)?\.md$", re.IGNORECASE)


@dataclass(frozen=True)
class LightSettings:
    """OpenClaw's Light defaults."""

    lookback_days: int = 2
    limit: int = 100
    dedupe_similarity: float = 0.9


@dataclass
class NoteBatch:
    """The snippets of one daily note, as results to count."""

    path: str
    day: str
    results: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Collected:
    batches: list[NoteBatch]
    state: dict[str, dict[str, Any]]
    changed: bool


def within_lookback(day: str, now: dt.datetime, days: int) -> bool:
    """Whether ``day`` (YYYY-MM-DD) ends no earlier than ``days`` days before ``now``."""
    try:
        end = dt.datetime.fromisoformat(f"{day}T23:59:59.999+00:00")
    except ValueError:
        return False
    return end >= now - dt.timedelta(days=max(0, days))


def entry_within(entry: RecallEntry, now: dt.datetime, days: int) -> bool:
    """OpenClaw's lookback of an entry: a recall day inside it, or (for an entry some search
    or grounding counted) a last sighting inside it."""
    if any(within_lookback(d, now, days) for d in entry.recall_days):
        return True
    if entry.daily_count > 0 and entry.recall_count == 0 and entry.grounded_count == 0:
        return False
    last = parse_time(entry.last_recalled_at)
    return last is not None and last >= now - dt.timedelta(days=max(0, days))


def _state_path(folder: Path) -> Path:
    return folder / INGESTION_STATE


def _load_state(folder: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads(_state_path(folder).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # costs one extra reading of the notes, nothing more
        logger.warning("daily ingestion state unreadable, reading every note again: %s", exc)
        return {}
    files = raw.get("files") if isinstance(raw, dict) else None
    return (
        {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}
    )


def _notes(root: Path, now: dt.datetime, days: int) -> list[tuple[str, str]]:
    """(file name, day) of the daily notes directly in ``memory/`` within the lookback, newest
    day first (the plain ``YYYY-MM-DD.md`` before its variants)."""
    try:
        names = os.listdir(root / "memory")
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        m = _NOTE.match(name)
        if m and within_lookback(m[1], now, days):
            out.append((name, m[1]))
    out.sort(key=lambda item: (item[1], item[0].lower() == f"{item[1]}.md", item[0]), reverse=True)
    return out


def collect_daily(
    root: Path,
    now: dt.datetime,
    *,
    today: str,
    limit: int,
    lookback_days: int = DAILY_LOOKBACK_DAYS,
    folder: Path | None = None,
) -> Collected:
    """The snippets of the daily notes due for reading on dreaming day ``today`` (what was
    read before is kept in ``folder``, the dreaming folder: memd/dreams/place.py)."""
    previous = _load_state(folder or DreamPlace.inside(root).folder)
    notes = _notes(root, now, lookback_days)
    current = {f"memory/{name}" for name, _ in notes}
    state = {k: v for k, v in previous.items() if k in current}
    changed = len(state) != len(previous)
    total_cap = max(20, limit * 4)
    per_file = max(6, math.ceil(total_cap / max(1, len(notes))))
    total = 0
    batches = []
    for name, day in notes:
        rel = f"memory/{name}"
        try:
            st = os.lstat(root / rel)
        except FileNotFoundError:
            state.pop(rel, None)
            continue
        if not stat.S_ISREG(st.st_mode):  # a symlink is never followed out of the workspace
            state.pop(rel, None)
            continue
        fingerprint = {"mtimeMs": st.st_mtime_ns // 1_000_000, "size": st.st_size}
        before = previous.get(rel) or {}
        unchanged = all(before.get(k) == v for k, v in fingerprint.items())
        if unchanged and before.get("lastDreamingDayIngested") == today:
            continue
        changed = True
        state[rel] = fingerprint
        try:
            text = (root / rel).read_bytes().decode("utf-8", "replace")
        except OSError as exc:
            logger.warning("dreaming could not read %s: %s", rel, exc)
            continue
        snippets = daily_snippets(text.splitlines(), limit=min(per_file, total_cap - total))
        if not snippets:
            continue
        batch = NoteBatch(rel, day)
        for s in snippets:
            batch.results.append(
                {
                    "path": rel,
                    "start_line": s.start_line,
                    "end_line": s.end_line,
                    "snippet": s.snippet,
                    "score": DAILY_SCORE,
                }
            )
        batches.append(batch)
        total += len(snippets)
        state[rel] = {**fingerprint, "lastDreamingDayIngested": today}
        if total >= total_cap:
            break
    return Collected(batches, state, changed)


def ingest_daily(
    store: RecallStore,
    entries: dict[str, RecallEntry],
    collected: Collected,
    when: dt.datetime,
) -> int:
    """Count the collected snippets into ``entries`` (the caller saves); return how many."""
    counted = 0
    for batch in collected.batches:
        counted += len(
            store.count(
                entries,
                DAILY_QUERY.format(day=batch.day),
                batch.results,
                when,
                signal="daily",
                day=batch.day,
                dedupe=False,
            )
        )
    return counted


def save_state(root: Path, collected: Collected, folder: Path | None = None) -> None:
    if collected.changed:
        body = {"version": 1, "files": dict(sorted(collected.state.items()))}
        path = _state_path(folder or DreamPlace.inside(root).folder)
        write_atomic(path, (json.dumps(body, indent=2) + "\n").encode())


def _fresh(entry: RecallEntry, hits: PhaseHits | None) -> bool:
    """Not staged by Light since it was last seen (OpenClaw's filterFreshLightDreamingEntries)."""
    if hits is None or hits.light_hits <= 0 or not hits.last_light_at:
        return True
    return entry.last_recalled_at > hits.last_light_at


def stage(
    entries: Mapping[str, RecallEntry],
    phases: Mapping[str, PhaseHits],
    now: dt.datetime,
    settings: LightSettings,
    *,
    meaning: Meaning | None = None,
) -> tuple[list[Group], int]:
    """(the groups Light stages, at most ``limit``; how many entries it considered)."""
    recent = [
        e
        for e in entries.values()
        if e.promoted_at is None
        and entry_within(e, now, settings.lookback_days)
        and _fresh(e, phases.get(e.key))
    ]
    recent.sort(key=lambda e: (e.last_recalled_at, e.recall_count, e.path, e.key), reverse=True)
    # What MEMORY.md already holds leads its own group, so other notes of it are not staged.
    promoted = [e for e in entries.values() if e.promoted_at is not None]
    groups = dedupe([*promoted, *recent], settings.dedupe_similarity, meaning=meaning)
    groups = [g for g in groups if g.entry.promoted_at is None]
    return groups[: max(0, settings.limit)], len(recent)


def sources_of(place: DreamPlace, entries: Sequence[RecallEntry]) -> dict[str, str]:
    """Each entry's lines as they are in its note now (for comparing by meaning)."""
    files: dict[str, list[str] | None] = {}
    out = {}
    for e in entries:
        if e.path not in files:
            try:
                target = place.file(e.path)
                files[e.path] = (
                    None
                    if target.is_symlink()
                    else target.read_bytes().decode("utf-8", "replace").splitlines()
                )
            except OSError:
                files[e.path] = None
        lines = files[e.path]
        if lines is not None and e.end_line <= len(lines):
            text = "\n".join(lines[e.start_line - 1 : e.end_line]).strip()
            if text:
                out[e.key] = text
    return out
