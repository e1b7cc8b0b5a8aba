"""The pre-compaction memory flush: when an agent host asks its model to write down what is worth
keeping before a long session is compacted, and what it tells the model.

The thresholds and the safety rules are OpenClaw's: flush when the session is within 4,000 tokens
of its compaction point, or once its transcript reaches 2 MiB; write only to today's daily log
(in the user's time zone), append only; MEMORY.md, DREAMS.md and the other bootstrap files are
read-only; no timestamped variants; reply NO_REPLY when nothing is worth keeping. memd computes the
target path and the text, so a host needs no copy of them, and ``append`` holds writes that come
from a flush to the same rules (:func:`check_flush_target`).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from memd_client.errors import PathRefused

__all__ = [
    "FORCE_FLUSH_TRANSCRIPT_BYTES",
    "SILENT_REPLY",
    "SOFT_THRESHOLD_TOKENS",
    "check_flush_target",
    "daily_log",
    "flush_plan",
    "is_silent",
]

SOFT_THRESHOLD_TOKENS = 4_000
FORCE_FLUSH_TRANSCRIPT_BYTES = 2 * 1024 * 1024
SILENT_REPLY = "NO_REPLY"
READ_ONLY_FILES = ("MEMORY.md", "DREAMS.md", "SOUL.md", "TOOLS.md", "AGENTS.md", "USER.md")

# OpenClaw's own wording, so a model tuned on it meets what it knows.
_RULES = (
    "Store durable memories only in {path} (create memory/ if needed). Treat workspace "
    "bootstrap/reference files such as MEMORY.md, DREAMS.md, SOUL.md, and AGENTS.md as read-only "
    "during this flush; never overwrite, replace, or edit them. If {path} already exists, APPEND "
    "new content only and do not overwrite existing entries."
)
_PROMPT = (
    "Pre-compaction memory flush. "
    + _RULES
    + " Do NOT create timestamped variant files (e.g., {date}-HHMM.md); always use the canonical "
    "{date}.md filename. If nothing to store, reply with {silent}.\n"
    "Current time: {now}\nReference UTC: {utc}"
)
_SYSTEM_PROMPT = (
    "Pre-compaction memory flush turn. The session is near auto-compaction; capture durable "
    "memories to disk. " + _RULES + " You may reply, but usually {silent} is correct."
)


def daily_log(day: dt.date) -> str:
    """The workspace-relative path of ``day``'s daily log."""
    return f"memory/{day.isoformat()}.md"


def flush_plan(now: dt.datetime, *, timezone: str) -> dict[str, Any]:
    """The flush plan for a session at ``now`` (aware, in the user's time zone)."""
    path = daily_log(now.date())
    zone = timezone or now.tzname() or ""
    local = now.strftime("%A, %Y-%m-%d %H:%M") + (f" ({zone})" if zone else "")
    utc = now.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    values = {"path": path, "date": now.date().isoformat(), "silent": SILENT_REPLY}
    return {
        "soft_threshold_tokens": SOFT_THRESHOLD_TOKENS,
        "force_flush_transcript_bytes": FORCE_FLUSH_TRANSCRIPT_BYTES,
        "relative_path": path,
        "date": now.date().isoformat(),
        "timezone": zone,
        "silent_reply": SILENT_REPLY,
        "read_only": list(READ_ONLY_FILES),
        "prompt": _PROMPT.format(now=local, utc=utc, **values),
        "system_prompt": _SYSTEM_PROMPT.format(**values),
    }


_DATED = re.compile(r"memory/\d{4}-\d{2}-\d{2}[^/]*\.md", re.IGNORECASE)


def check_flush_target(path: str, day: dt.date) -> None:
    """Refuse ``path`` unless it is ``day``'s daily log, naming the rule it breaks."""
    want = daily_log(day)
    if path == want:
        return
    name = path.rsplit("/", 1)[-1]
    if any(name.lower() == ro.lower() for ro in READ_ONLY_FILES):
        why = f"{name} is read-only to agents"
    elif path.lower().startswith(want[:-3].lower()):
        why = "timestamped or other variants of today's log are not written"
    elif _DATED.fullmatch(path):
        why = "another day's log is not written"
    else:
        why = "only today's daily log is written"
    raise PathRefused(f"append refused for {path!r}: {why}; write to {want} (append only)")


def is_silent(text: str) -> bool:
    """Whether ``text`` is the silent reply: the model found nothing worth keeping."""
    return text.strip() == SILENT_REPLY
