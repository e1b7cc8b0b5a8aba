"""What every redaction rule shares: the mark, the rule shape, and replacing a match's value."""

from __future__ import annotations

import re
from collections.abc import Callable

MARK = "[REDACTED]"

# A rule takes a block of text and returns it redacted with the number of secrets replaced.
Rule = Callable[[str], tuple[str, int]]
# A regex rule's replacement: the new text for a match, or None to leave the match as it is.
Replace = Callable[[re.Match[str]], str | None]

B = r"(?<![A-Za-z0-9_-])"  # start of a token: never inside a longer word or base64 run
E = r"(?![A-Za-z0-9_-])"


def regex_rule(pattern: re.Pattern[str], replace: Replace) -> Rule:
    """Return a rule that applies `replace` to every match of `pattern`."""

    def rule(text: str) -> tuple[str, int]:
        count = 0

        def wrapped(m: re.Match[str]) -> str:
            nonlocal count
            out = replace(m)
            if out is None:
                return m.group(0)
            count += 1
            return out

        return pattern.sub(wrapped, text), count

    return rule


def marked(m: re.Match[str], group: str) -> bool:
    """Is this value already redacted (or does MARK follow it, e.g. `token=sk-[REDACTED]`)?"""
    return MARK in m.group(group) or m.string.startswith(MARK, m.end(group))


def replace_group(m: re.Match[str], group: str) -> str:
    """The match's text with `group` replaced by MARK and everything around it kept."""
    whole, start = m.group(0), m.start()
    return whole[: m.start(group) - start] + MARK + whole[m.end(group) - start :]


def replace_head(m: re.Match[str], group: str, length: int) -> str:
    """The match's text with the first ``length`` characters of ``group`` replaced by MARK:
    a value whose trailing punctuation (a full stop) stays."""
    whole, cut = m.group(0), m.start(group) - m.start()
    return whole[:cut] + MARK + whole[cut + length :]


def keep_prefix(check: Callable[[str], bool], group: str = "v") -> Replace:
    """A replacement that redacts `group` when `check` accepts it and it is not marked yet."""

    def replace(m: re.Match[str]) -> str | None:
        if marked(m, group) or not check(m.group(group)):
            return None
        return replace_group(m, group)

    return replace
