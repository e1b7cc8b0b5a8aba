"""One dreaming run over a workspace: Light, then REM, then Deep, then a diary entry.

Light reads the recent daily notes into the recall store and stages recent memories
(memd/dreams/light.py); REM finds themes, candidate truths and lasting facts, and grounds a
truth written on several days (memd/dreams/rem.py); Deep ranks every entry with the phase
boosts and promotes into MEMORY.md what passes (memd/dreams/ranking.py, promote.py), holding
back a candidate that says what a better one (or MEMORY.md) already says. DREAMS.md gets one
entry per run (memd/dreams/diary.py); ``dream-runs.json`` in the dreaming folder
(memd/dreams/place.py) keeps when each phase last ran and what it found, for status.

Without ``apply`` nothing is written: the run is computed on copies and reported.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic
from memd.clock import Clock
from memd.dreams.diary import diary_lines, write_entry
from memd.dreams.dreaming import candidate_dict, promote
from memd.dreams.light import (
    DAILY_LOOKBACK_DAYS,
    LightSettings,
    collect_daily,
    entry_within,
    ingest_daily,
    save_state,
    sources_of,
    stage,
)
from memd.dreams.phases import Phase, PhaseHits, PhaseSignals
from memd.dreams.place import DreamPlace
from memd.dreams.privacy import redacted
from memd.dreams.ranking import SCHEDULED, Candidate, Thresholds, score_all, verdict
from memd.dreams.recall_entry import RecallEntry, iso_time
from memd.dreams.recall_store import RecallStore
from memd.dreams.rem import RemSettings, Truth, ground, reflect
from memd.dreams.similar import Group, Meaning, VectorSource, text_similarity
from memd.dreams.transcripts import (
    SESSIONS_QUERY,
    TranscriptSource,
    collect_sessions,
    save_sessions_state,
    write_corpus,
)
from memd.redact import redact as redact_secrets

__all__ = ["PHASES", "RUNS_FILE", "DreamOptions", "last_runs", "run_dream", "written_by"]

logger = logging.getLogger(__name__)

PHASES = ("light", "rem", "deep")
RUNS_FILE = "dream-runs.json"
DUPLICATE_SIMILARITY = 0.88  # REM's truth threshold: Deep never promotes one claim twice
HELD_BACK_SHOWN = 5


@dataclass(frozen=True)
class DreamOptions:
    phases: Sequence[str] = PHASES
    apply: bool = False
    thresholds: Thresholds = SCHEDULED
    light: LightSettings = field(default_factory=LightSettings)
    rem: RemSettings = field(default_factory=RemSettings)
    memory_max_chars: int = 10_000
    diary_max_chars: int = 20_000
    redact: bool = True  # [index] redact: secrets out of what dreaming writes and shows


def _group_dict(g: Group) -> dict[str, Any]:
    e = g.entry
    return {
        "key": e.key,
        "snippet": e.snippet,
        "path": e.path,
        "start_line": e.start_line,
        "end_line": e.end_line,
        "average": round(g.average, 4),
        "days": g.days,
        "evidence": g.evidence(),
        "merged": len(g.members) - 1,
        "merged_by_meaning": g.by_meaning,
    }


def _truth_dict(t: Truth) -> dict[str, Any]:
    return {**_group_dict(t.group), "confidence": round(t.confidence, 4), "reason": t.reason}


def _window(entries: Mapping[str, RecallEntry], now: dt.datetime) -> list[RecallEntry]:
    return [e for e in entries.values() if entry_within(e, now, DAILY_LOOKBACK_DAYS)]


def _hit(phases: dict[str, PhaseHits], keys: Sequence[str], phase: Phase, stamp: str) -> None:
    """What PhaseSignals.record writes, on the in-memory copy (so Deep sees this run's hits)."""
    for key in keys:
        phases.setdefault(key, PhaseHits(key)).hit(phase, stamp)


def _why(c: Candidate) -> str:
    if c.lasting is not None:
        return c.lasting
    days = len(c.entry.recall_days)
    return (
        f"score {c.score:.3f} from {c.signal_count} signals, {c.unique_queries} distinct "
        f"queries or days, seen on {days} day{'s' if days != 1 else ''}"
    )


def _deep(
    entries: Mapping[str, RecallEntry],
    phases: Mapping[str, PhaseHits],
    now: dt.datetime,
    thresholds: Thresholds,
    watch: set[str],
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """(the candidates to promote, what is held back and why: the best few that fail and
    every one REM surfaced)."""
    # One claim is promoted once: an entry that says what MEMORY.md (or a better candidate of
    # this run) already says, or that covers lines of the same note as one of them (a search
    # recalled the chunk, Light read the line), is neither promoted nor listed as held back.
    said = [e for e in entries.values() if e.promoted_at is not None]

    def said_already(c: Candidate) -> bool:
        e = c.entry
        return any(
            (s.path == e.path and s.start_line <= e.end_line and e.start_line <= s.end_line)
            or text_similarity(s.snippet, e.snippet) >= DUPLICATE_SIMILARITY
            for s in said
            if s is not e
        )

    scored = [
        (c, verdict(c, thresholds))
        for c in score_all(entries.values(), thresholds, now, phases=phases)
    ]
    chosen: list[Candidate] = []
    for c, reason in scored:
        if reason is None and len(chosen) < thresholds.limit and not said_already(c):
            chosen.append(c)
            said.append(c.entry)
    held: list[dict[str, Any]] = []
    for c, reason in scored:
        # The cheap test first: past the few shown, only watched keys are compared with what
        # is said (each comparison reads two snippets' words; a store holds thousands).
        if c in chosen or not (len(held) < HELD_BACK_SHOWN or c.entry.key in watch):
            continue
        if not said_already(c):
            held.append(
                {
                    "key": c.entry.key,
                    "path": c.entry.path,
                    "snippet": c.entry.snippet,
                    "score": round(c.score, 4),
                    "reason": reason or f"over this run's limit of {thresholds.limit}",
                }
            )
    return chosen, held


def run_dream(
    root: Path,
    options: DreamOptions,
    *,
    vectors: VectorSource | None = None,
    meaning_threshold: float | None = None,
    transcripts: TranscriptSource | None = None,
    clock: Clock | None = None,
    folder: Path | None = None,
) -> dict[str, Any]:
    """Run the chosen phases over the workspace at ``root``, keeping dreaming's own files in
    ``folder`` (default: the workspace's ``memory/.dreams``); see the module docstring."""
    place = DreamPlace(root, folder) if folder is not None else DreamPlace.inside(root)
    clock = clock or Clock()
    now = clock.now()
    tz = clock.zone  # a transcript's message falls on the user's day, as the daily logs do
    local = clock.local(now)
    today = local.date().isoformat()
    stamp = iso_time(now)
    apply = options.apply
    store = RecallStore(root, folder=place.folder, clock=clock)
    signals = PhaseSignals(root, place.folder)
    meaning = (
        Meaning(vectors, meaning_threshold)
        if vectors is not None and meaning_threshold is not None
        else None
    )
    result: dict[str, Any] = {"at": stamp, "applied": apply, "phases": list(options.phases)}
    if meaning is not None:  # the model calls happen before the lock, not while searches wait
        meaning.load(sources_of(place, _window(store.load(), now)).values())
    # A preview only reads (every store file is replaced whole): it takes no lock, so it
    # creates nothing, not even the lock file.
    with store.locked() if apply else contextlib.nullcontext():
        entries = store.load()
        phases = signals.load()
        collected = None
        sessions = None
        if "light" in options.phases:
            collected = collect_daily(
                root, now, today=today, limit=options.light.limit, folder=place.folder
            )
            counted = ingest_daily(store, entries, collected, now)
            if transcripts is not None:
                sessions = collect_sessions(
                    root,
                    transcripts,
                    now,
                    tz=tz,
                    lookback_days=options.light.lookback_days,
                    folder=place.folder,
                )
                if apply:  # a preview only counts the messages: the corpus is a file
                    for day, lines in sorted(sessions.by_day.items()):
                        if options.redact:  # the reader redacts too; whatever it is given
                            lines = [redact_secrets(line) for line in lines]
                        results = write_corpus(root, day, lines, place.folder)
                        query = SESSIONS_QUERY.format(day=day)
                        counted += len(store.count(entries, query, results, now, signal="daily"))
        if meaning is not None:
            meaning.texts = sources_of(place, _window(entries, now))
        if collected is not None:
            groups, considered = stage(entries, phases, now, options.light, meaning=meaning)
            keys = [g.entry.key for g in groups]
            if apply:
                store.save(entries)
                save_state(root, collected, place.folder)
                if sessions is not None:
                    save_sessions_state(root, sessions, place.folder)
                signals.record(keys, "light", now, known=entries)
            _hit(phases, keys, "light", stamp)
            result["light"] = {
                "notes_read": [b.path for b in collected.batches],
                "messages_read": sessions.messages if sessions is not None else 0,
                "snippets": counted,
                "considered": considered,
                "merged": sum(len(g.members) - 1 for g in groups),
                "staged": [_group_dict(g) for g in groups],
            }
        watch: set[str] = set()
        if "rem" in options.phases:
            refl = reflect(entries, phases, now, options.rem, meaning=meaning)
            surfaced = [*refl.truths, *refl.lasting]
            grounded = ground(store, entries, surfaced, now)
            keys = [t.key for t in surfaced]
            watch.update(keys)
            if apply:
                if grounded:
                    store.save(entries)
                signals.record(keys, "rem", now, known=entries)
            _hit(phases, keys, "rem", stamp)
            result["rem"] = {
                "considered": refl.entries,
                "themes": [
                    {
                        "tag": t.tag,
                        "strength": round(t.strength, 4),
                        "count": t.count,
                        "evidence": list(t.evidence),
                    }
                    for t in refl.themes
                ],
                "truths": [_truth_dict(t) for t in refl.truths],
                "lasting": [_truth_dict(t) for t in refl.lasting],
                "grounded": grounded,
            }
        if "deep" in options.phases:
            chosen, held = _deep(entries, phases, now, options.thresholds, watch)
            deep: dict[str, Any] = {
                "candidates": [{**candidate_dict(c), "why": _why(c)} for c in chosen],
                "held_back": held,
                "applied": [],
            }
            if chosen:  # a preview takes the same path, writing nothing
                deep.update(
                    promote(
                        store,
                        chosen,
                        day=local.date(),
                        max_chars=options.memory_max_chars,
                        redact=options.redact,
                        dry_run=not apply,
                    )
                )
            result["deep"] = deep
        result["similarity"] = (
            f"words and meaning (cosine >= {meaning.threshold:g})"
            if meaning is not None and meaning.active
            else "words"
        )
        if meaning is not None and meaning.failed:
            result["meaning_failed"] = meaning.failed
        if options.redact:
            result = redacted(result, redact_secrets)
        if apply:
            title = local.strftime("%Y-%m-%d %H:%M") + (
                f" ({clock.timezone})" if clock.timezone else ""
            )
            lines = diary_lines(result)
            if options.redact:  # snippets are; theme names and the rest are words of notes too
                lines = [redact_secrets(line) for line in lines]
            written = write_entry(root, title, lines, max_chars=options.diary_max_chars)
            result["diary"] = {"path": "DREAMS.md", "dropped_entries": written.dropped_entries}
            promoted = result.get("deep")
            result["written"] = [
                "DREAMS.md",
                *(["MEMORY.md"] if promoted and promoted["applied"] else []),
            ]
            _save_runs(store.dir, result)
    return result


def written_by(result: Mapping[str, Any]) -> list[str]:
    """The workspace files a run changed (``written``: DREAMS.md, and MEMORY.md when Deep
    promoted something): what the writer indexes before the run's reply."""
    return list(result.get("written", ()))


def _summary(phase: str, report: Mapping[str, Any]) -> dict[str, Any]:
    if phase == "light":
        return {
            "notes_read": len(report["notes_read"]),
            "snippets": report["snippets"],
            "staged": len(report["staged"]),
        }
    if phase == "rem":
        return {
            "themes": len(report["themes"]),
            "truths": len(report["truths"]),
            "lasting": len(report["lasting"]),
            "grounded": report["grounded"],
        }
    return {"promoted": len(report["applied"]), "held_back": len(report["held_back"])}


def _save_runs(folder: Path, result: Mapping[str, Any]) -> None:
    runs = _runs_in(folder)
    for phase in PHASES:
        if phase in result:
            runs[phase] = {"at": result["at"], **_summary(phase, result[phase])}
    body = {"version": 1, "phases": runs}
    write_atomic(folder / RUNS_FILE, (json.dumps(body, indent=2) + "\n").encode())


def last_runs(root: Path, folder: Path | None = None) -> dict[str, Any]:
    """When each phase last ran (with ``apply``) in the workspace at ``root``, and its tally."""
    return _runs_in(folder if folder is not None else DreamPlace.inside(root).folder)


def _runs_in(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads((folder / RUNS_FILE).read_bytes())
    except (OSError, ValueError):
        return {}
    runs = raw.get("phases") if isinstance(raw, dict) else None
    return {k: v for k, v in runs.items() if k in PHASES} if isinstance(runs, dict) else {}
