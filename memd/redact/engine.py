"""The redaction pass: JSON strings as the text they encode and private keys, on the whole text;
then every rule on each block of lines, each block remembered by digest so that an append
redacts only what it added."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict

from memd.redact import assign, flags, personal, prefixes, urls
from memd.redact.armour import RULES as ARMOUR_RULES
from memd.redact.armour import redact_armour
from memd.redact.base import Rule
from memd.redact.escaped import redact_escaped
from memd.redact.lines import carry_over, redact_tables
from memd.redact.names import FRAGMENTS

# Each rule runs on a block only when the block holds one of its needles (lower-cased; none:
# any block) and, if the rule says so, a run of 16 characters without a space: every typed
# token, signed URL and random value is at least that long.
_LONG_RUN = re.compile(r"[a-z0-9_.:/~+=%-]{16}")
_RULES: list[tuple[frozenset[str], bool, Rule]] = [
    (frozenset(), True, prefixes.redact_prefixed),
    (frozenset({"q~"}), True, prefixes.redact_azure_secret),
    (frozenset({"-us"}), True, prefixes.redact_mailchimp),
    (frozenset({"access_token$", ".atlasv1."}), True, prefixes.redact_split_prefix),
    (frozenset(), True, prefixes.redact_shaped),
    (frozenset(), True, prefixes.redact_bare),
    *((frozenset(needles), long, rule) for needles, long, rule in urls.RULES),
    (frozenset(flags.COMMANDS), False, flags.redact_clients),
    *((frozenset(FRAGMENTS), False, rule) for rule in flags.RULES),
    *((frozenset(needles), False, rule) for needles, rule in assign.RULES),
    *((frozenset(needles), False, rule) for needles, rule in personal.RULES),
    (frozenset({"|"}), False, redact_tables),
]
_COMMANDS = frozenset(flags.COMMANDS)
_NEEDLES = tuple(sorted(set().union(*(needles for needles, _, _ in _RULES)) - _COMMANDS))


# Every rule stays inside a block: a line, with the lines that continue it (indented, a table's
# rows, after a trailing backslash, or a lone word: the rest of a wrapped value, or the value
# under its label).
# Private keys, which span unindented lines, are handled on the whole text first.
_CONTINUATION = r"[ \t]+[^\n]*|[ \t]*\|[^\n]*|(?<=\\\n)[^\n]+|[^\s|]+[ \t]*(?=\n|\Z)"
_BLOCK = re.compile(rf"[^\n]*\n?(?:(?:{_CONTINUATION})\n?)*")
_CONTINUES = re.compile(_CONTINUATION)
# Remembered by a 16-byte digest; the redacted text is kept only for the few blocks that held a
# secret (None: the block comes back unchanged), so 50,000 blocks cost a few MB, not the text.
_MEMO: OrderedDict[bytes, tuple[str, int] | None] = OrderedDict()
_MEMO_BLOCKS = 50_000
_MEMO_LOCK = threading.Lock()


class _Worth:
    """What is worth looking for in the blocks of one text: the needles (and client commands)
    the whole text holds, and the rules that any of them, or none, lets run. Each needle
    looked for costs every block, and a note holds few of them."""

    def __init__(self, lower: str) -> None:
        self.needles = tuple(n for n in _NEEDLES if n in lower)
        self.commands = tuple(n for n in _COMMANDS if n in lower)
        held = set(self.needles) | set(self.commands)
        self.rules = [r for r in _RULES if not r[0] or not r[0].isdisjoint(held)]


_ALL = _Worth("".join(_NEEDLES) + "".join(_COMMANDS))


def _redact_block(block: str, worth: _Worth = _ALL) -> tuple[str, int]:
    """Apply each rule whose needles the block holds; its needles are looked for once, as
    redaction only removes text."""
    lower = block.lower()
    present = {n for n in worth.needles if n in lower}
    if "-" in lower or "/" in lower:  # no client takes a password without either
        present.update(n for n in worth.commands if n in lower)
    long_run = _LONG_RUN.search(lower) is not None
    original, total = block, 0
    for needles, long, rule in worth.rules:
        if (not needles or not needles.isdisjoint(present)) and (long_run or not long):
            block, n = rule(block)
            total += n
    if total and "\n" in block.rstrip("\n"):
        block, n = carry_over(original, block)
        total += n
    return block, total


def _redact_blocks(text: str) -> tuple[str, int]:
    out: list[str] = []
    total = 0
    worth = _Worth(text.lower())
    for m in _BLOCK.finditer(text):
        block = m.group(0)
        if not block:
            continue
        key = hashlib.blake2b(block.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with _MEMO_LOCK:
            known = key in _MEMO
            hit = _MEMO.get(key)
            if known:
                _MEMO.move_to_end(key)
        if not known:
            done = _redact_block(block, worth)
            hit = done if done[1] else None
            with _MEMO_LOCK:
                _MEMO[key] = hit
                while len(_MEMO) > _MEMO_BLOCKS:
                    _MEMO.popitem(last=False)
        if hit is None:
            out.append(block)
        else:
            out.append(hit[0])
            total += hit[1]
    return "".join(out), total


def starts_block(previous: str | None, line: str) -> bool:
    """Whether a block starts at ``line`` (after ``previous``; None: the first line), whatever
    came before: then redacting the text from ``line`` on gives the rest of what redacting the
    whole text gives, unless :func:`reads_whole_text` (a file that grows is redacted from such
    a line only, memd/index/tail.py)."""
    if previous is None:
        return True
    return _CONTINUES.match(f"{previous}\n{line}", len(previous) + 1) is None


def reads_whole_text(text: str) -> bool:
    """Whether a rule that reads the whole text (a private key's armour) may act on ``text``."""
    lower = text.lower()
    return any(n in lower for needles, _ in ARMOUR_RULES for n in needles)


def redact_with_count(text: str) -> tuple[str, int]:
    """Return `text` with secrets replaced by MARK, and how many secrets were replaced."""
    text, total = redact_escaped(text, redact_with_count)
    text, n = redact_armour(text)
    total += n
    text, n = _redact_blocks(text)
    return text, total + n


def redact(text: str) -> str:
    """Return `text` with secrets replaced by MARK; line structure is unchanged."""
    return redact_with_count(text)[0]
