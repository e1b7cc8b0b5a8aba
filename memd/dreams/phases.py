"""The phase-signal store (``phase-signals.json`` in the dreaming folder): how often the Light and REM
phases of dreaming met each short-term entry, and when last; and the boost that gives an entry
in the Deep phase's ranking. The shape, the caps and the boost are OpenClaw's.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memd.atomicfile import write_atomic
from memd.dreams.place import DreamPlace
from memd.dreams.recall_entry import iso_time, parse_time
from memd.dreams.recall_file import LOCK_NAME
from memd.dreams.recall_lock import file_lock

__all__ = ["MAX_HITS", "PHASE_SIGNALS", "Phase", "PhaseHits", "PhaseSignals", "phase_boost"]

logger = logging.getLogger(__name__)

PHASE_SIGNALS = "phase-signals.json"
MAX_HITS = 9999
LIGHT_WEIGHT = 0.06
REM_WEIGHT = 0.09
HALF_LIFE_DAYS = 14.0

Phase = Literal["light", "rem"]


@dataclass
class PhaseHits:
    """One entry's phase signals (JSON keys are OpenClaw's camelCase names)."""

    key: str
    light_hits: int = 0
    rem_hits: int = 0
    last_light_at: str | None = None
    last_rem_at: str | None = None

    def hit(self, phase: Phase, stamp: str) -> None:
        """Count one ``phase`` hit at ``stamp`` (capped at MAX_HITS)."""
        if phase == "light":
            self.light_hits, self.last_light_at = min(MAX_HITS, self.light_hits + 1), stamp
        else:
            self.rem_hits, self.last_rem_at = min(MAX_HITS, self.rem_hits + 1), stamp

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "lightHits": self.light_hits,
            "remHits": self.rem_hits,
        }
        if self.last_light_at:
            out["lastLightAt"] = self.last_light_at
        if self.last_rem_at:
            out["lastRemAt"] = self.last_rem_at
        return out

    @classmethod
    def from_json(cls, key: str, raw: Any) -> PhaseHits | None:
        if not isinstance(raw, dict):
            return None

        def hits(name: str) -> int:
            value = raw.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                return 0
            return min(MAX_HITS, max(0, value))

        def stamp(name: str) -> str | None:
            value = raw.get(name)
            return value if isinstance(value, str) and value else None

        return cls(
            key, hits("lightHits"), hits("remHits"), stamp("lastLightAt"), stamp("lastRemAt")
        )


def _days_since(stamp: str | None, now: dt.datetime) -> float | None:
    then = parse_time(stamp)
    return None if then is None else max(0.0, (now - then).total_seconds() / 86_400.0)


def _strength(hits: int) -> float:
    return min(1.0, math.log1p(max(0, hits)) / math.log(7))


def _recency(stamp: str | None, now: dt.datetime) -> float:
    days = _days_since(stamp, now)
    return 0.0 if days is None else math.exp(-math.log(2) / HALF_LIFE_DAYS * days)


def phase_boost(hits: PhaseHits | None, now: dt.datetime) -> float:
    """``clamp(0.06·lightStrength·lightRecency + 0.09·remStrength·remRecency)``, with
    strength ``min(1, ln(1+hits)/ln 7)`` and recency halving every 14 days since the last hit
    (0 when never hit)."""
    if hits is None:
        return 0.0
    light = LIGHT_WEIGHT * _strength(hits.light_hits) * _recency(hits.last_light_at, now)
    rem = REM_WEIGHT * _strength(hits.rem_hits) * _recency(hits.last_rem_at, now)
    return min(1.0, max(0.0, light + rem))


class PhaseSignals:
    """The phase-signal store of the workspace at ``root``; written under the recall store's
    lock, atomically (temp file, fsync, rename)."""

    def __init__(self, root: Path, folder: Path | None = None) -> None:
        self.dir = Path(folder) if folder is not None else DreamPlace.inside(Path(root)).folder
        self.path = self.dir / PHASE_SIGNALS

    def load(self) -> dict[str, PhaseHits]:
        """The entries; an unreadable store counts as empty (it only ever adds a boost)."""
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.warning("phase signals %s unreadable, starting empty: %s", self.path, exc)
            return {}
        entries = raw.get("entries") if isinstance(raw, dict) and raw.get("version") == 1 else None
        if not isinstance(entries, dict):
            return {}
        out = {}
        for key, value in entries.items():
            hits = PhaseHits.from_json(str(key), value)
            if hits is not None:
                out[hits.key] = hits
        return out

    def record(
        self,
        keys: Iterable[str],
        phase: Phase,
        when: dt.datetime,
        *,
        known: Mapping[str, object] | None = None,
    ) -> int:
        """Count one ``phase`` hit for each of ``keys`` at ``when``; entries whose key is not in
        ``known`` (the recall store's keys, when given) are dropped, as OpenClaw drops them.
        Returns how many entries were hit."""
        stamp = iso_time(when)
        wanted = list(dict.fromkeys(keys))
        self.dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.dir / LOCK_NAME):  # the recall store's: one lock for the folder
            entries = self.load()
            for key in wanted:
                entries.setdefault(key, PhaseHits(key)).hit(phase, stamp)
            if known is not None:
                entries = {k: v for k, v in entries.items() if k in known}
            body = {
                "version": 1,
                "updatedAt": stamp,
                "entries": {k: v.to_json() for k, v in sorted(entries.items())},
            }
            write_atomic(self.path, (json.dumps(body, indent=2) + "\n").encode())
        return len(wanted)
