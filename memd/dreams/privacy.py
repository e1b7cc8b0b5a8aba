"""What dreaming shows and writes, and to whom.

Text that came from a session transcript (a line of the session corpus) is shown only to a
caller that may see that workspace's transcripts: previews (``dream``, ``promote``) leave it out
for any other caller and say how much they left out; the diary (DREAMS.md, read by anyone who
may read long-term memory) never quotes it. A transcript line promoted into MEMORY.md is
long-term memory from then on, as any promoted note is. Every snippet a reply or the diary
shows is redacted as the index redacts text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memd.dreams.place import CORPUS_PREFIX

__all__ = ["from_transcript", "only_from_transcripts", "redacted", "without_transcripts"]


def from_transcript(path: object) -> bool:
    """Whether an entry's ``path`` (or a ``path:lines`` citation) names a day of the session
    corpus."""
    return isinstance(path, str) and path.replace("\\", "/").startswith(CORPUS_PREFIX)


def only_from_transcripts(item: Any) -> bool:
    """Whether a reply's item (an entry, a group, a REM theme named by a word of its
    evidence) says nothing that is not from a transcript."""
    if not isinstance(item, dict):
        return False
    if "path" in item:
        return from_transcript(item["path"])
    evidence = item.get("evidence")
    return isinstance(evidence, list) and bool(evidence) and all(map(from_transcript, evidence))


def redacted(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` (a reply: maps and lists) with every ``snippet`` passed through ``redact``."""
    if isinstance(value, dict):
        return {
            k: redact(v) if k == "snippet" and isinstance(v, str) else redacted(v, redact)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redacted(v, redact) for v in value]
    return value


def without_transcripts(value: Any) -> tuple[Any, int]:
    """``value`` (a reply) without the items whose ``path`` is in the session corpus (and the
    keys naming them), and how many items were left out."""
    corpus_keys = set()

    def find(v: Any) -> None:
        if isinstance(v, dict):
            if from_transcript(v.get("path")) and isinstance(v.get("key"), str):
                corpus_keys.add(v["key"])
            for item in v.values():
                find(item)
        elif isinstance(v, list):
            for item in v:
                find(item)

    find(value)
    left_out = 0

    def strip(v: Any) -> Any:
        nonlocal left_out
        if isinstance(v, dict):
            return {k: strip(item) for k, item in v.items()}
        if isinstance(v, list):
            kept = []
            for item in v:
                hidden = (
                    isinstance(item, dict)
                    and (only_from_transcripts(item) or item.get("key") in corpus_keys)
                ) or (isinstance(item, str) and item in corpus_keys)
                hidden = hidden or (
                    isinstance(item, list) and bool(item) and item[0] in corpus_keys
                )
                if hidden:
                    left_out += 1
                else:
                    kept.append(strip(item))
            return kept
        return v

    return strip(value), left_out
