"""Text inside JSON strings (`"...\\n..."`, `\\"`): a transcript's JSONL lines, logs, pasted
payloads. A string with escapes, or in a value's place, is redacted as the text it encodes and
written back encoded: every rule sees the lines and quotes its writer saw, and the outer text
keeps its lines."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from memd.redact.names import FRAGMENTS

# One JSON string literal: escapes pair up, so a backslash never ends it by mistake.
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*+"')
# A value's place (`"key": "...`, `["...`): such a string is a text of its own even without
# escapes, its first line a line (`ENV TOKEN x`, a `.pgpass` entry).
_VALUE_BEFORE = re.compile(r"[:\[,][ \t]*\Z")
# What only a rule that reads a line from its start finds: a name that says secret (one of
# FRAGMENTS), or a `.pgpass` entry (host:port:...).
_PGPASS_START = re.compile(r'"[^\s:"]+:(?:\d{1,5}|\*):')


def _line_rule_may_act(literal: str) -> bool:
    lower = literal.lower()
    return any(f in lower for f in FRAGMENTS) or _PGPASS_START.match(literal) is not None


def redact_escaped(text: str, redact: Callable[[str], tuple[str, int]]) -> tuple[str, int]:
    """Redact, with `redact`, the text of each JSON string with escapes or in a value's place."""
    if '"' not in text:
        return text, 0
    out: list[str] = []
    pos = count = 0
    for m in _STRING.finditer(text):
        literal = m.group(0)
        if "\\" not in literal and not (
            len(literal) >= 18
            and _VALUE_BEFORE.search(text, max(0, m.start() - 16), m.start())
            and _line_rule_may_act(literal)
        ):
            continue
        try:
            decoded = json.loads(literal)
        except ValueError:
            continue
        redacted, n = redact(decoded)
        if n:
            out += [text[pos : m.start()], json.dumps(redacted, ensure_ascii=False)]
            pos = m.end()
            count += n
    out.append(text[pos:])
    return "".join(out), count
