"""Path, snippet and tag helpers of the recall store: what counts as a daily note or a promotable
snippet, and the query/claim hashes and concept tags stored with each entry."""

from __future__ import annotations

import hashlib
import re

from memd.markdown.discover import daily_date

__all__ = [
    "DAY",
    "MAX_CONCEPT_TAGS",
    "claim_hash",
    "collapse",
    "concept_tags",
    "is_promotable",
    "is_short_term",
    "query_hash",
]

MAX_CONCEPT_TAGS = 8

_WS = re.compile(r"\s+")
_UNDER_MEMORY = re.compile(r"(?:^|/)(memory/.+)$")
_DREAMING = re.compile(r"(?:^|/)memory/dreaming/")
_SESSION_CORPUS = re.compile(
    r"(?:^|/)memory/\.dreams/session-corpus/[0-9]{4}-[0-9]{2}-[0-9]{2}\.(?:md|txt)$"
)
DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_HEADING = re.compile(r"#{1,6}(?:\s.*)?")
_EMPTY_BULLET = re.compile(r"(?:[-*+]|[0-9]+[.)])(?:\s+\[[ xX]\])?")
_COMMENT = re.compile(r"<!--.*?-->")
_MARKERS = (
    "<!-- memd-promotion:",
    "<!-- openclaw-memory-promotion:",
    "<!-- memd:dreaming:",
    "<!-- openclaw:dreaming:",
)
_DREAM_LEAD = re.compile(r"^\W*(candidate|reflections)\b", re.IGNORECASE | re.MULTILINE)
_DREAM_FIELDS = (
    re.compile(r"\bconfidence\s*:", re.IGNORECASE),
    re.compile(r"\bevidence\s*:", re.IGNORECASE),
    re.compile(r"\bstatus\s*:\s*staged\b", re.IGNORECASE),
    re.compile(r"\brecalls\s*:", re.IGNORECASE),
)
_TAG_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{2,}")
_TAG_STOP = frozenset(
    "all and any are but can did for get got had has her his how its may not now one our out "
    "per see she the too two use via was way who why yes you "
    "about above after again agent agents also because been before being below between both "
    "could does doing done during each either from have having here into just like more most "
    "memory memories notes other over same session sessions search should some such than that "
    "their them then there these they this those through today tomorrow under until very what "
    "when where which while with without workspace would yesterday your "
    "md markdown json jsonl ts tsx js jsx txt yaml yml toml py html css".split()
)


def is_short_term(path: str) -> bool:
    """Say whether ``path`` is a dated daily note (``memory/**/YYYY-MM-DD[-x].md``), not dreaming
    output, or a day of the session corpus dreaming reads transcripts into."""
    rel = path.replace("\\", "/")
    if _SESSION_CORPUS.search(rel):
        return True
    m = _UNDER_MEMORY.search(rel)
    if m is None or _DREAMING.search(rel):
        return False
    return daily_date(m[1]) is not None


_LINE_BREAKS = re.compile(r"\n|\s(?=(?:#{1,6}|[-*+])\s)")


def is_promotable(snippet: str) -> bool:
    """Say whether a snippet carries content worth promoting (not empty, a skeleton or dream output)."""
    if not snippet or not snippet.strip():
        return False
    lower = snippet.lower()
    if any(marker in lower for marker in _MARKERS):
        return False
    if _DREAM_LEAD.search(snippet) and all(f.search(snippet) for f in _DREAM_FIELDS):
        return False
    # Stored snippets are whitespace-collapsed, so a heading and the bullet after it share one
    # line: split before every heading or bullet marker as well as at line ends.
    for line in _LINE_BREAKS.split(snippet):
        line = _COMMENT.sub("", line).strip()
        if line and not _HEADING.fullmatch(line) and not _EMPTY_BULLET.fullmatch(line):
            return True
    return False


def collapse(snippet: str) -> str:
    """Collapse every whitespace run to one space and trim."""
    return _WS.sub(" ", snippet).strip()


def query_hash(query: str) -> str:
    """First 12 hex digits of SHA-1 of the lower-cased, trimmed query."""
    return hashlib.sha1(query.strip().lower().encode("utf-8")).hexdigest()[:12]


def claim_hash(snippet: str) -> str:
    """First 12 hex digits of SHA-1 of the whitespace-collapsed snippet."""
    return hashlib.sha1(collapse(snippet).encode("utf-8")).hexdigest()[:12]


def concept_tags(path: str, snippet: str) -> list[str]:
    """Up to 8 distinct lower-case tags from the file name and the snippet (no stop words/dates)."""
    tags: list[str] = []
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    for raw in _TAG_TOKEN.findall(f"{name} {snippet}"):
        tag = raw.strip("./_-").replace("_", "-").lower()
        if not 3 <= len(tag) <= 32 or tag.isdigit() or DAY.match(tag) or tag in _TAG_STOP:
            continue
        if tag not in tags:
            tags.append(tag)
            if len(tags) == MAX_CONCEPT_TAGS:
                break
    return tags
