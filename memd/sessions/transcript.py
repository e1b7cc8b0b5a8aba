"""Session transcripts: which files count, and how a JSONL transcript renders to indexable text
(``User: …`` / ``Assistant: …`` lines with a map back to JSONL line numbers).

The format read is OpenClaw's: one JSON object per line, each with a string ``type``. A line
``{"type": "message", "message": {"role": "user" | "assistant", "content": ...}}`` is a message
(``content`` a string, or a list of blocks whose ``{"type": "text", "text": ...}`` are read);
other records (session headers, tool results, model changes) are skipped. A file of which no
line is a message and some are not records of this kind (other JSON, other chat formats, not
JSON) is not a transcript memd reads: it is reported, never counted as indexed.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DREAMING_PREFIX",
    "Rendered",
    "TranscriptFile",
    "is_archived",
    "is_transcript_name",
    "list_transcripts",
    "map_lines",
    "render",
]

logger = logging.getLogger(__name__)

DREAMING_PREFIX = "dreaming-narrative-"
_DREAMING_PROMPT = "Write a dream diary entry from these memory fragments"
# A name that is not valid UTF-8 (its stray bytes read as lone surrogates) is no transcript's:
# the index and every reply hold UTF-8 text only, and one such name would stop the whole sync.
_LIVE = re.compile(r"[^/\ud800-\udfff]+\.jsonl")
_ARCHIVED = re.compile(r"[^/\ud800-\udfff]+\.jsonl\.(?:reset|deleted)\.[^/\ud800-\udfff]+")
_WS = re.compile(r"\s+")
_SURROGATE = re.compile("[\ud800-\udfff]")
_LABELS = {"user": "User", "assistant": "Assistant"}
# Record types of other chat formats (Claude Code's {"type": "user", "message": ...}, ...).
_OTHER_FORMATS = frozenset({"user", "assistant", "human", "ai", "system"})


@dataclass(frozen=True, slots=True)
class TranscriptFile:
    """One transcript file in a sessions directory."""

    name: str
    abs: Path
    size: int
    mtime_ns: int
    archived: bool


@dataclass(frozen=True, slots=True)
class Rendered:
    """A transcript as text; ``line_map[i]`` is the JSONL line of rendered line ``i + 1``."""

    text: str
    line_map: list[int]
    timestamps: list[int]
    hash: str
    dreaming_narrative: bool = False
    foreign: int = 0  # complete lines that are not records of this format
    lines: int = 0  # complete, non-blank lines

    @property
    def unreadable(self) -> str | None:
        """Why this is not a transcript memd reads (None when it is one, if without messages)."""
        if self.line_map or self.dreaming_narrative or not self.foreign:
            return None
        return (
            f"not a transcript memd reads: {self.foreign} of {self.lines} lines are not "
            'OpenClaw records, and none is a message ({"type": "message", "message": '
            '{"role": "user", "content": ...}})'
        )


def is_archived(name: str) -> bool:
    """Say whether ``name`` is an archived transcript (``*.jsonl.reset.<ts>``/``.deleted.<ts>``)."""
    return _ARCHIVED.fullmatch(name) is not None


def is_transcript_name(name: str) -> bool:
    """Say whether ``name`` is a live (``*.jsonl``) or archived transcript file name."""
    return _LIVE.fullmatch(name) is not None or is_archived(name)


def list_transcripts(directory: Path) -> tuple[list[TranscriptFile], bool]:
    """List the transcript files of ``directory`` sorted by name, and whether the listing is complete.

    A missing directory is empty and complete; an unreadable one (or an entry that cannot be
    stat'ed) makes the listing incomplete, so callers must not prune rows from it.
    """
    out: list[TranscriptFile] = []
    complete = True
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if not is_transcript_name(entry.name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while listing
                except OSError as exc:
                    logger.warning("cannot stat transcript %s: %s", entry.path, exc)
                    complete = False
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # symlinks, directories, fifos
                out.append(
                    TranscriptFile(
                        entry.name,
                        Path(entry.path),
                        st.st_size,
                        st.st_mtime_ns,
                        is_archived(entry.name),
                    )
                )
    except (FileNotFoundError, NotADirectoryError):
        return [], True
    except OSError as exc:
        logger.warning("cannot list sessions directory %s: %s", directory, exc)
        return sorted(out, key=lambda f: f.name), False
    return sorted(out, key=lambda f: f.name), complete


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # JSON.parse refuses NaN/Infinity too


def _parse(line: str) -> dict[str, object] | None:
    try:
        record = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _normalise(text: str) -> str:
    return _WS.sub(" ", _SURROGATE.sub("\ufffd", text)).strip()


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    ]
    return " ".join(parts)


def _mentions_dreaming(obj: dict[str, object]) -> bool:
    return any(
        isinstance(obj.get(key), str) and DREAMING_PREFIX in str(obj[key])
        for key in ("runId", "sessionKey")
    )


def _is_dreaming_record(record: dict[str, object]) -> bool:
    """Bootstrap records and anything carrying a dreaming-narrative runId/sessionKey."""
    if _mentions_dreaming(record):
        return True
    data = record.get("data")
    return isinstance(data, dict) and _mentions_dreaming(data)


def _timestamp_ms(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            return 0
        if not math.isfinite(number):
            return 0
        ms = number * 1000 if 0 < number < 1e11 else number
        return round(ms) if math.isfinite(ms) and ms > 0 else 0
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            return 0
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)  # deterministic, unlike "local time"
        ms = round(when.timestamp() * 1000)
        return ms if ms > 0 else 0
    return 0


def _message_timestamp(record: dict[str, object], message: dict[str, object]) -> int:
    for value in (message.get("timestamp"), record.get("timestamp")):
        ms = _timestamp_ms(value)
        if ms > 0:
            return ms
    return 0


def render(data: bytes, redact: Callable[[str], str] | None = None) -> Rendered:
    """Render a JSONL transcript to ``User:``/``Assistant:`` lines, as OpenClaw renders them.

    Args:
        redact: applied to each message's normalised text before it is emitted.
    """
    lines: list[str] = []
    line_map: list[int] = []
    timestamps: list[int] = []
    dreaming = False
    foreign = complete = 0
    raw_lines = data.decode("utf-8", errors="replace").split("\n")
    for number, raw in enumerate(raw_lines, start=1):
        if dreaming or not raw.strip():
            continue
        record = _parse(raw)
        # The last line without its newline may be a record still being written.
        written = number < len(raw_lines) or record is not None
        complete += written
        if record is None:
            foreign += written
            continue
        if _is_dreaming_record(record):
            dreaming = True
            continue
        kind = record.get("type")
        if not isinstance(kind, str) or kind in _OTHER_FORMATS:
            foreign += 1
            continue
        message = record.get("message")
        if record.get("type") != "message" or not isinstance(message, dict):
            continue
        role = message.get("role")
        label = _LABELS.get(role) if isinstance(role, str) else None
        if label is None:
            continue
        content = _content_text(message.get("content"))
        text = _normalise(content)
        if not text:
            continue
        if _DREAMING_PROMPT in text:
            dreaming = True
            continue
        if redact is not None:
            # Redacted with its lines (a key split over table rows or wrapped onto the next
            # line is only seen so), then as the one line it renders to (a value on the line
            # after its name is only seen so).
            text = _normalise(redact(content))
            text = _normalise(redact(text)) if text else text
            if not text:
                continue
        lines.append(f"{label}: {text}")
        line_map.append(number)
        timestamps.append(_message_timestamp(record, message))
    text = "\n".join(lines)
    digest = hashlib.sha256(
        "\n".join((text, ",".join(map(str, line_map)), ",".join(map(str, timestamps)))).encode(
            "utf-8"
        )
    ).hexdigest()
    return Rendered(text, line_map, timestamps, digest, dreaming, foreign, complete)


def map_lines(line_map: Sequence[int], start: int, end: int) -> tuple[int, int]:
    """Map a 1-based inclusive range of rendered lines to the JSONL lines it came from.

    Out-of-range lines are clamped to the rendered text; an empty map returns the range as is.
    """
    if not line_map:
        return start, end
    last = len(line_map)
    first_i = min(max(start, 1), last)
    last_i = min(max(end, first_i), last)
    return line_map[first_i - 1], line_map[last_i - 1]
