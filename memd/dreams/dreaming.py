"""One promotion run: rank the recall store's entries, and (when asked) write the winners to
MEMORY.md and mark them promoted."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from memd.clock import Clock
from memd.dreams.phases import PhaseSignals
from memd.dreams.place import DreamPlace
from memd.dreams.promote import apply_promotions
from memd.dreams.ranking import Candidate, Thresholds, rank, score_all, score_entry, verdict
from memd.dreams.recall_store import RecallStore

__all__ = ["candidate_dict", "promote", "run_promotion"]

logger = logging.getLogger(__name__)


def candidate_dict(c: Candidate) -> dict[str, Any]:
    e = c.entry
    return {
        "key": e.key,
        "path": e.path,
        "start_line": e.start_line,
        "end_line": e.end_line,
        "snippet": e.snippet,
        "score": round(c.score, 4),
        "components": {k: round(v, 4) for k, v in c.components.items()},
        "recall_count": e.recall_count,
        "signal_count": c.signal_count,
        "unique_queries": c.unique_queries,
        "recall_days": list(e.recall_days),
        "age_days": round(c.age_days, 2),
        "promoted_at": e.promoted_at,
        "lasting": c.lasting,
    }


def promote(
    store: RecallStore,
    candidates: Sequence[Candidate],
    *,
    day: date,
    max_chars: int,
    redact: bool = True,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Write ``candidates`` into MEMORY.md as a section dated ``day`` and mark them promoted
    in ``store``; the reply's ``applied``, ``skipped``, ``already_present`` and
    ``dropped_sections``. A ``dry_run`` writes nothing and names what a run that writes would
    apply as ``would_apply`` (``applied`` stays empty)."""
    outcome = apply_promotions(
        store.root,
        candidates,
        day=day,
        max_chars=max_chars,
        place=DreamPlace(store.root, store.dir),
        redact=redact,
        dry_run=dry_run,
    )
    applied = [
        {"key": a.key, "path": a.path, "start_line": a.start_line, "end_line": a.end_line}
        for a in outcome.applied
    ]
    if dry_run:
        return {
            "applied": [],
            "would_apply": applied,
            "skipped": [list(s) for s in outcome.skipped],
            "already_present": list(outcome.already_present),
            "dropped_sections": 0,
        }
    updates: dict[str, Mapping[str, Any]] = {
        a.key: {"start_line": a.start_line, "end_line": a.end_line, "snippet": a.text}
        for a in outcome.applied
    }
    updates.update({key: {} for key in outcome.already_present})
    if updates:
        store.mark_promoted(updates)
    if outcome.applied:
        logger.info("promoted %d memories into %s", len(outcome.applied), outcome.memory_path)
    return {
        "applied": applied,
        "skipped": [list(s) for s in outcome.skipped],
        "already_present": list(outcome.already_present),
        "dropped_sections": outcome.dropped_sections,
    }


def run_promotion(
    root: Path,
    thresholds: Thresholds,
    *,
    apply: bool = False,
    explain: str | None = None,
    include_promoted: bool = False,
    max_chars: int = 10_000,
    clock: Clock | None = None,
    folder: Path | None = None,
    redact: bool = True,
) -> dict[str, Any]:
    """Rank, and promote (``apply``) or say what a promotion would write, the short-term
    memories of the workspace at ``root`` (dreaming's files in ``folder``)."""
    clock = clock or Clock()
    now = clock.now()
    store = RecallStore(root, folder=folder, clock=clock)
    entries = store.load()
    phases = PhaseSignals(
        root, store.dir
    ).load()  # the Light and REM hits: a boost for the Deep phase
    result: dict[str, Any] = {"entries": len(entries), "thresholds": vars(thresholds)}
    if explain is not None:
        entry = entries.get(explain)
        if entry is None:
            result["explain"] = None
        else:
            scored = {
                c.entry.key: c
                for c in score_all(
                    entries.values(), thresholds, now, include_promoted=True, phases=phases
                )
            }
            c = scored.get(explain) or score_entry(entry, now, phases=phases.get(explain))
            held = verdict(c, thresholds) if explain in scored else "not a promotable daily note"
            result["explain"] = {
                **candidate_dict(c),
                "passes_thresholds": held is None,
                "held_back": held,
            }
    candidates = rank(
        entries.values(), thresholds, now, include_promoted=include_promoted, phases=phases
    )
    result["candidates"] = [candidate_dict(c) for c in candidates]
    result["applied"] = []
    if candidates:
        day = clock.day(now)
        result.update(
            promote(
                store, candidates, day=day, max_chars=max_chars, redact=redact, dry_run=not apply
            )
        )
    return result
