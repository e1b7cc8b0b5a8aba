"""Facts that last although they are written once: an allergy, a name, a birthday, a rule that
holds "always" or "never". Recall statistics cannot find them (nobody searches for the peanut
allergy until it matters), so REM surfaces them with the phrase that marks them, and the Deep
phase lets a surfaced one past the statistical gates (memd/dreams/ranking.py).
"""

from __future__ import annotations

import re

__all__ = ["lasting_reason"]

# (what the phrase says, the phrase). Word boundaries keep "nevertheless" and "always-on"
# out; a question is never a fact.
_MARKS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(pattern, re.IGNORECASE))
    for label, pattern in (
        (
            "an allergy",
            r"\b(?:allergic|allergy|allergies|intolerant|intolerance)\b|过敏|アレルギー",
        ),
        ("a name", r"\b(?:my|his|her|their|our) (?:name|nickname) is\b|我叫|我的名字"),
        ("a birthday", r"\b(?:birthday|born on|date of birth)\b|生日|誕生日"),
        ("a diet", r"\b(?:is|am|are) (?:a )?(?:vegetarian|vegan|kosher|halal)\b"),
        ("always", r"\balways\b|总是|一直|永远|いつも"),
        ("never", r"\bnever\b(?! mind)|从不|从来不|绝不|決して"),
        ("a standing rule", r"\b(?:from now on|going forward|as a rule|do not ever|don't ever)\b"),
    )
)


def lasting_reason(snippet: str) -> str | None:
    """Why ``snippet`` reads as a lasting fact (``lasting: an allergy ("allergic")``), or None."""
    text = snippet.strip()
    if not text or text.rstrip(" .)*_`").endswith(("?", "？")):
        return None
    for label, pattern in _MARKS:
        m = pattern.search(text)
        if m is not None:
            return f'lasting: {label} ("{m[0]}")'
    return None
