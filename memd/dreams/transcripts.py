"""Light's second source: the messages of the agent's session transcripts, as OpenClaw reads
them for dreaming.

New user and assistant messages of the last days (the phase's lookback), at most 240 a run
(per transcript ``min(80, max(12, ⌈240 / transcripts⌉))``), each once (a digest of every
message taken is kept per transcript), are appended by day to the session corpus,
``session-corpus/YYYY-MM-DD.txt`` in the dreaming folder, memd's private state (one ``User:
…`` / ``Assistant: …`` line each, redacted as the index redacts them), and counted as daily
signals of those lines with the query ``__dreaming_sessions__:<day>``; entries name such a day
``memory/.dreams/session-corpus/YYYY-MM-DD.txt`` (memd/dreams/place.py). The corpus is not
indexed, and what comes from it is shown only to callers that may see the transcripts (their
own agent): in previews, and never in DREAMS.md; a line of it reaches MEMORY.md only by
promotion, as any daily note does.

The transcripts are read by the caller (memd.sessions renders them) and handed in as plain
``Transcript`` values: dreams and sessions do not import each other.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic
from memd.dreams.daily import DAILY_SCORE
from memd.dreams.light import within_lookback
from memd.dreams.place import CORPUS_PREFIX, DreamPlace
from memd.dreams.recall_text import is_promotable
from memd.dreams.sharedfile import append_text

__all__ = [
    "CORPUS_DIR",
    "SESSIONS_QUERY",
    "Message",
    "SessionsCollected",
    "Transcript",
    "TranscriptSource",
    "collect_sessions",
    "save_sessions_state",
    "write_corpus",
]

logger = logging.getLogger(__name__)

CORPUS_DIR = CORPUS_PREFIX.rstrip("/")
STATE_FILE = "session-ingestion.json"
SESSIONS_QUERY = "__dreaming_sessions__:{day}"
TOTAL_CAP = 240
MAX_LINE_CHARS = 280
MIN_LINE_CHARS = 8
SEEN_PER_TRANSCRIPT = 4096


@dataclass(frozen=True)
class Message:
    """One rendered message: its JSONL line, when it was written (ms, 0 unknown), its text."""

    line: int
    at_ms: int
    text: str


@dataclass(frozen=True)
class Transcript:
    """A live transcript; ``read`` renders its messages (called only when it changed)."""

    name: str
    size: int
    mtime_ns: int
    read: Callable[[], Sequence[Message]]


# Lists the workspace's live transcripts.
TranscriptSource = Callable[[], Sequence[Transcript]]


@dataclass
class SessionsCollected:
    by_day: dict[str, list[str]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    changed: bool = False

    @property
    def messages(self) -> int:
        return sum(len(lines) for lines in self.by_day.values())


def _state_path(folder: Path) -> Path:
    return folder / STATE_FILE


def _load_state(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads(_state_path(folder).read_bytes())
    except FileNotFoundError:
        return {"files": {}, "seen": {}}
    except (OSError, ValueError) as exc:
        logger.warning("session ingestion state unreadable, starting over: %s", exc)
        return {"files": {}, "seen": {}}
    files = raw.get("files") if isinstance(raw, dict) else None
    seen = raw.get("seen") if isinstance(raw, dict) else None
    return {
        "files": files if isinstance(files, dict) else {},
        "seen": seen if isinstance(seen, dict) else {},
    }


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1].rstrip() + "…"


def collect_sessions(
    root: Path,
    source: TranscriptSource,
    now: dt.datetime,
    *,
    tz: dt.tzinfo | None,
    lookback_days: int,
    folder: Path | None = None,
) -> SessionsCollected:
    """The new messages of the transcripts, by the day they were written."""
    state = _load_state(folder or DreamPlace.inside(root).folder)
    files: dict[str, Any] = dict(state["files"])
    seen: dict[str, list[str]] = {
        k: list(v) for k, v in state["seen"].items() if isinstance(v, list)
    }
    out = SessionsCollected()
    transcripts = list(source())
    names = {t.name for t in transcripts}
    out.changed = any(name not in names for name in (*files, *seen))
    files = {k: v for k, v in files.items() if k in names}
    seen = {k: v for k, v in seen.items() if k in names}
    per_file = min(80, max(12, math.ceil(TOTAL_CAP / max(1, len(transcripts)))))
    remaining = TOTAL_CAP
    for t in sorted(transcripts, key=lambda t: t.name):
        if remaining <= 0:
            break
        before = files.get(t.name) or {}
        if before.get("size") == t.size and before.get("mtimeNs") == t.mtime_ns:
            continue
        taken_before = set(seen.get(t.name, ()))
        done = before.get("line", 0) if before.get("size", 0) <= t.size else 0  # rewritten: all
        taken: list[str] = []
        last = done
        try:
            messages = t.read()
        except OSError as exc:
            logger.warning("dreaming could not read transcript %s: %s", t.name, exc)
            continue
        for m in messages:
            if m.line <= done:
                continue
            if len(taken) >= min(per_file, remaining):
                break
            last = m.line
            text = _line(m.text)
            moment = dt.datetime.fromtimestamp(m.at_ms / 1000, dt.UTC) if m.at_ms else now
            day = moment.astimezone(tz).date().isoformat() if tz else moment.date().isoformat()
            h = _digest(text)
            if (
                len(text.split(": ", 1)[-1]) < MIN_LINE_CHARS
                or h in taken_before
                or not within_lookback(day, now, lookback_days)
                or not is_promotable(text)
            ):
                continue
            taken.append(h)
            out.by_day.setdefault(day, []).append(text)
        files[t.name] = {"size": t.size, "mtimeNs": t.mtime_ns, "line": last}
        seen[t.name] = [*seen.get(t.name, ()), *taken][-SEEN_PER_TRANSCRIPT:]
        remaining -= len(taken)
        out.changed = True
    out.state = {"version": 1, "files": files, "seen": seen}
    return out


def save_sessions_state(
    root: Path, collected: SessionsCollected, folder: Path | None = None
) -> None:
    if collected.changed:
        body = json.dumps(collected.state, indent=1, sort_keys=True) + "\n"
        write_atomic(_state_path(folder or DreamPlace.inside(root).folder), body.encode())


def write_corpus(
    root: Path, day: str, lines: Sequence[str], folder: Path | None = None
) -> list[Mapping[str, Any]]:
    """Append ``lines`` to the corpus file of ``day``; the results to count, one per line."""
    place = DreamPlace(root, folder) if folder is not None else DreamPlace.inside(root)
    rel = f"{CORPUS_DIR}/{day}.txt"
    path = place.file(rel)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        before = 0 if path.is_symlink() else len(path.read_bytes().splitlines())
    except FileNotFoundError:
        before = 0
    # a symlink is refused (PathRefused) by append_text's no-follow open
    append_text(path, "".join(f"{line}\n" for line in lines))
    return [
        {
            "path": rel,
            "start_line": before + i,
            "end_line": before + i,
            "snippet": line,
            "score": DAILY_SCORE,
        }
        for i, line in enumerate(lines, start=1)
    ]
