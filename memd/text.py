"""Text measures shared by the chunker, the index and search: CJK-aware weights and tokens.

FTS5's unicode61 tokenizer keeps a run of CJK characters as one token, so Chinese or Japanese
memory is unfindable by keyword. memd writes CJK runs into the index as overlapping bigrams (plus
unigrams in a column of their own) and turns queries into the same terms, so any two adjacent
characters of a question find the text that holds them.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate

__all__ = [
    "CHARS_PER_TOKEN",
    "estimate_tokens",
    "first_control",
    "fts_body",
    "fts_unigrams",
    "is_cjk",
    "line_tokens_among",
    "mmr_tokens",
    "query_terms",
    "weighted_len",
    "word_tokens",
]

CHARS_PER_TOKEN = 4

# OpenClaw's "weighs more" ranges: each such character counts as a whole token.
_WEIGHTED = re.compile(
    "[\u2e80-\u9fff\ua000-\ua4ff\uac00-\ud7af\uf900-\ufaff\uff01-\uff60\uffe0-\uffe6"
    "\U00020000-\U0002fa1f]"
)
# Scripts written without spaces between words (plus Hangul, whose words carry particles).
_CJK = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf"  # CJK Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\u1100-\u11ff"  # Hangul Jamo
    "\U00020000-\U0002fa1f"  # CJK Extension B and later
)
_CJK_CHAR = re.compile(f"[{_CJK}]")
_CJK_RUN = re.compile(f"[{_CJK}]+")
# A word: letters, digits and underscore (what FTS5's unicode61 keeps together), minus CJK.
_WORD = re.compile(f"(?:(?![{_CJK}])\\w)+")
_TOKEN = re.compile(f"[{_CJK}]+|(?:(?![{_CJK}])\\w)+")


def first_control(text: str, allowed: str = "") -> str | None:
    """The first control character of ``text`` (C0, DEL or C1) not in ``allowed``, or None."""
    for ch in text:
        code = ord(ch)
        if (code < 0x20 or 0x7F <= code <= 0x9F) and ch not in allowed:
            return ch
    return None


def weighted_len(text: str) -> int:
    """Length in "estimate characters": CJK-like characters count as 4."""
    return len(text) + 3 * len(_WEIGHTED.findall(text))


def estimate_tokens(text: str) -> int:
    """Estimate a token count the way OpenClaw does (4 weighted characters per token)."""
    return math.ceil(weighted_len(text) / CHARS_PER_TOKEN)


def is_cjk(char: str) -> bool:
    """Say whether ``char`` belongs to a script memd splits into character n-grams."""
    return bool(_CJK_CHAR.fullmatch(char))


def _bigrams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def fts_body(text: str) -> str:
    """Text for the FTS body column: words as they are, CJK runs as space-separated bigrams."""
    return _CJK_RUN.sub(lambda m: " " + " ".join(_bigrams(m.group())) + " ", text)


def fts_unigrams(text: str) -> str:
    """Text for the FTS unigram column: every CJK character of ``text``, space-separated."""
    return " ".join(ch for run in _CJK_RUN.findall(text) for ch in run)


_WORDISH = re.compile(r"\w+")


def word_tokens(text: str) -> Iterator[str]:
    """Yield lower-cased tokens: words, and each CJK run whole."""
    for token in _WORDISH.findall(text.lower()):
        if _CJK_CHAR.search(token) is None:
            yield token
        else:
            yield from _TOKEN.findall(token)


# Words that carry no topic in English questions; removed from keyword queries unless nothing
# else is left. Short on purpose: BM25's IDF already discounts common words.
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "done",
        "for",
        "from",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "might",
        "my",
        "of",
        "on",
        "or",
        "our",
        "ours",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "to",
        "too",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "whose",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
    ]
)


def query_terms(query: str) -> tuple[list[str], list[str]]:
    """Split a query into (words, CJK runs), lower-cased, deduplicated, stopwords dropped.

    When every word is a stopword the words are kept, so "who is she" still searches something.
    """
    words: list[str] = []
    runs: list[str] = []
    for token in word_tokens(query):
        if _CJK_CHAR.match(token):
            if token not in runs:
                runs.append(token)
        elif token not in words:
            words.append(token)
    content = [w for w in words if w not in STOPWORDS]
    return (content or words), runs


def tokens_among(text: str, terms: Iterable[str]) -> set[str]:
    """The ``terms`` (lower-cased query tokens) that are tokens of ``text``, found
    without tokenising the whole text when it holds no CJK (a search checks a few query terms
    against dozens of candidate chunks)."""
    lowered = text.lower()
    if not lowered.isascii() and _CJK_CHAR.search(lowered) is not None:
        return set(terms) & mmr_tokens(lowered)
    # ``in`` first: most terms are absent from most lines, and it costs no Python call
    return {t for t in set(terms) if t and t in lowered and _has_token(lowered, t)}


def line_tokens_among(text: str, terms: Iterable[str]) -> list[set[str]]:
    """``tokens_among`` of each line of ``text`` (split on newlines), found with one pass of
    ``str.find`` over the whole text per term: a search asks this of every keyword candidate,
    and a pass per line cost twice as much. No token spans a newline, so the lines' sets
    together are ``tokens_among(text, terms)``."""
    lowered = text.lower()
    lines = lowered.split("\n")
    if not lowered.isascii() and _CJK_CHAR.search(lowered) is not None:
        return [tokens_among(line, terms) for line in lines]
    held: list[set[str]] = [set() for _ in lines]
    ends: list[int] | None = None  # the offset just past each line's newline
    for term in set(terms):
        at = lowered.find(term) if term else -1
        while at >= 0:
            if _whole(lowered, at, at + len(term)):
                if ends is None:
                    ends = list(accumulate(len(line) + 1 for line in lines))
                held[bisect_right(ends, at)].add(term)
            at = lowered.find(term, at + 1)
    return held


def _has_token(text: str, term: str) -> bool:
    """Whether ``term`` occurs in ``text`` as a whole ``\\w+`` token."""
    at = text.find(term)
    while at >= 0:
        if _whole(text, at, at + len(term)):
            return True
        at = text.find(term, at + 1)
    return False


def _whole(text: str, start: int, stop: int) -> bool:
    """Whether ``text[start:stop]`` is a whole ``\\w+`` token: neither side touches a letter,
    digit or underscore."""
    before = text[start - 1] if start else " "
    after = text[stop] if stop < len(text) else " "
    return not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_")


def mmr_tokens(text: str) -> set[str]:
    """Tokens for MMR similarity: ASCII-ish words, CJK unigrams and adjacent-character bigrams."""
    lowered = text.lower()
    if _CJK_CHAR.search(lowered) is None:
        return set(_WORDISH.findall(lowered))
    out: set[str] = set()
    for token in word_tokens(lowered):
        if _CJK_CHAR.match(token):
            out.update(token)
            out.update(token[i : i + 2] for i in range(len(token) - 1))
        else:
            out.add(token)
    return out
