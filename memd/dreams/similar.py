"""When two short-term memories say the same thing: by their words (Jaccard similarity of their
tokens, as OpenClaw measures it) and, where an embedder is configured, by their meaning (cosine
of their vectors), so that "Ana prefers morning meetings" and "Ana likes her meetings in the
morning" are one claim. And the merging of such entries into groups (OpenClaw's dedupe).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from memd.dreams.recall_entry import RecallEntry
from memd.markdown.discover import daily_date
from memd.text import mmr_tokens

__all__ = [
    "MEANING_THRESHOLDS",
    "Group",
    "Meaning",
    "VectorSource",
    "dedupe",
    "facts_agree",
    "meaning_threshold",
    "text_similarity",
]

logger = logging.getLogger(__name__)

# Cosine at or above which two snippets that agree on their facts (facts_agree) are one
# claim, by embedding model. Measured with bench/dedupe_study.py on bench/dedupe_pairs.json
# (docs/benchmarks.md): for all-MiniLM-L6-v2, 0.94 merges 9 of 31 paraphrases and no pair that
# words alone would not; any lower threshold merges "Sam's daughter is named Mia" with "Sam's
# sister ...". multilingual-e5-small puts paraphrases and different facts alike between 0.93
# and 0.998: no threshold separates them, so it (and any model not measured) merges by words.
MEANING_THRESHOLDS = {"all-minilm-l6-v2": 0.94}


def meaning_threshold(model: str) -> float | None:
    """The measured cosine threshold of an embedding model, or None (merge by words only)."""
    name = model.lower()
    return next((t for key, t in MEANING_THRESHOLDS.items() if key in name), None)


# Texts -> their vectors (L2-normalised), or None for a text that has none.
VectorSource = Callable[[Sequence[str]], Sequence[np.ndarray | None]]


_NUMBER = re.compile(r"\d+(?:[.:,/]\d+)*")
_NEGATION = re.compile(
    r"\b(?:not|no|never|without|none|nobody|nothing|neither|nor|cannot)\b|n't\b", re.IGNORECASE
)
_TIME = re.compile(
    r"\b(?:(mon|tue|wed|thu|fri|sat|sun)[a-z]*day|(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|"
    r"nov|dec)[a-z]*|(today|tomorrow|yesterday|tonight|morning|afternoon|evening|night))s?\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_POSSESSIVE = re.compile(r"['’]s?$")
_NOT_NAMES = frozenset(
    "a an the in on at for to of we i he she they it its this that these those our my his her "
    "their your also then so but and or if when note".split()
)
_NOTE_DAY = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})\.")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def _facts(text: str) -> tuple[frozenset[str], bool, frozenset[str], frozenset[str]]:
    """What a paraphrase must keep: numbers, polarity, names (capitalised words), days."""
    times = frozenset(
        (m[1] or m[2] or m[3]).lower()[:3] if not m[3] else m[3].lower()
        for m in _TIME.finditer(text)
    )
    names = frozenset(
        name
        for w in _WORD.findall(text)
        if w[0].isupper()
        and (name := _POSSESSIVE.sub("", w).lower()) not in _NOT_NAMES
        and not _TIME.fullmatch(name)
    )
    return frozenset(_NUMBER.findall(text)), bool(_NEGATION.search(text)), names, times


def facts_agree(a: str, b: str) -> bool:
    """Whether two texts a model finds alike may be merged: the same numbers, names, days and
    polarity. Embeddings barely move for "Friday" against "Thursday", "9:30" against "10:30"
    or "with" against "without" (bench/dedupe_study.py), so meaning alone never merges those.
    Text with CJK characters never merges by meaning: which characters carry the fact cannot
    be told without a segmenter."""
    if _CJK.search(a) or _CJK.search(b):
        return False
    na, pa, names_a, ta = _facts(a)
    nb, pb, names_b, tb = _facts(b)
    # A name may be left out ("Note to self: Ana ..."), never swapped for another.
    return (na, pa, ta) == (nb, pb, tb) and (names_a <= names_b or names_b <= names_a)


def text_similarity(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' tokens (words; CJK characters and their bigrams).
    Two texts without tokens are alike only when equal, as in OpenClaw."""
    ta, tb = mmr_tokens(a), mmr_tokens(b)
    if not ta and not tb:
        return 1.0 if a.strip().lower() == b.strip().lower() else 0.0
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / len(ta | tb)


class Meaning:
    """The vectors of a set of entries' texts, fetched once; ``cosine`` of two entries."""

    def __init__(
        self, source: VectorSource | None, threshold: float, texts: Mapping[str, str] | None = None
    ) -> None:
        self.source = source
        self.threshold = threshold
        # Each entry's lines as in its note (what the index embedded, so usually cached), by key.
        self.texts = dict(texts or {})
        self._vectors: dict[str, np.ndarray | None] = {}
        self.failed: str | None = None

    @property
    def active(self) -> bool:
        return self.source is not None and self.failed is None

    def load(self, texts: Iterable[str]) -> None:
        """Fetch the vectors of ``texts`` not fetched yet; a failing source turns meaning off
        (words still decide) and says why in ``failed``."""
        if not self.active:
            return
        assert self.source is not None
        todo = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if not todo:
            return
        try:
            vectors = self.source(todo)
        except Exception as exc:  # a provider outage costs the paraphrase merge, not the run
            self.failed = str(exc) or type(exc).__name__
            logger.warning("dreaming compares words only: no vectors: %s", self.failed)
            return
        self._vectors.update(zip(todo, vectors, strict=True))

    def vector(self, text: str) -> np.ndarray | None:
        """The vector fetched for ``text`` (None if it has none)."""
        return self._vectors.get(text)

    def cosine(self, a: str, b: str) -> float | None:
        va, vb = self._vectors.get(a), self._vectors.get(b)
        if va is None or vb is None or va.shape != vb.shape:
            return None
        return float(np.dot(va, vb))

    def same(self, a: str, b: str) -> bool:
        """Alike by meaning (cosine at least the threshold) and agreeing on the facts."""
        c = self.cosine(a, b)
        return c is not None and c >= self.threshold and facts_agree(a, b)


@dataclass
class Group:
    """Entries that say one thing. ``entry`` stands for them (the first one met, with their
    counts merged as OpenClaw merges them); ``members`` are all of them, ``entry``'s first."""

    entry: RecallEntry
    members: list[RecallEntry] = field(default_factory=list)
    by_meaning: int = 0  # members merged by meaning whose words alone would not have merged

    @property
    def keys(self) -> list[str]:
        return [m.key for m in self.members]

    @property
    def days(self) -> list[str]:
        """The distinct days of the notes the members came from, oldest first."""
        return sorted({note_day(m) for m in self.members} - {""})

    @property
    def average(self) -> float:
        """The best average score among the members (a member's ``totalScore`` over its own
        signals; OpenClaw divides the largest total by the first member's signals, which can
        pass 1 and is then clamped)."""
        return max(average_score(m) for m in self.members)

    def evidence(self, limit: int = 3) -> list[str]:
        return [f"{m.path}:{m.start_line}-{m.end_line}" for m in self.members[:limit]]


def average_score(entry: RecallEntry) -> float:
    signals = entry.recall_count + entry.daily_count + entry.grounded_count
    return min(1.0, max(0.0, entry.total_score / signals)) if signals > 0 else 0.0


def note_day(entry: RecallEntry) -> str:
    """The day of the daily note an entry comes from (its first recall day if the name has none)."""
    day = daily_date(entry.path)
    if day is not None:
        return day.isoformat()
    named = _NOTE_DAY.match(entry.path.rsplit("/", 1)[-1])  # a day of the session corpus
    if named is not None:
        return named[1]
    return entry.recall_days[0] if entry.recall_days else ""


def _merge(into: RecallEntry, other: RecallEntry) -> RecallEntry:
    return dataclasses.replace(
        into,
        recall_count=max(into.recall_count, other.recall_count),
        total_score=max(into.total_score, other.total_score),
        max_score=max(into.max_score, other.max_score),
        query_hashes=list(dict.fromkeys([*into.query_hashes, *other.query_hashes])),
        recall_days=sorted({*into.recall_days, *other.recall_days}),
        concept_tags=list(dict.fromkeys([*into.concept_tags, *other.concept_tags])),
        last_recalled_at=max(into.last_recalled_at, other.last_recalled_at),
    )


def dedupe(
    entries: Sequence[RecallEntry],
    threshold: float,
    *,
    meaning: Meaning | None = None,
) -> list[Group]:
    """Merge, in order, each entry into the first group whose first entry it matches: words
    at least ``threshold`` alike, or (with ``meaning``) a cosine at least its threshold.
    Unlike OpenClaw, entries of different notes merge too: the same claim written on three
    days is one claim written three times.

    Comparing each entry with every group made a run over a few thousand recalled snippets
    take tens of seconds on the writer's thread (appends waited behind it). The same
    decisions are reached by comparing only with the groups that could match: by words, the
    groups whose first entry shares a token of the entry's prefix (``_WordIndex``); by
    meaning, those whose cosine, computed for all groups in one product, is near the
    threshold or above. Each candidate is then decided exactly as before."""
    texts = {e.key: (meaning.texts if meaning else {}).get(e.key) or e.snippet for e in entries}
    if meaning is not None:
        meaning.load(texts.values())
    words = _WordIndex([e.snippet for e in entries], threshold)
    vectors = _VectorIndex(meaning) if meaning is not None else None
    groups: list[Group] = []
    for i, entry in enumerate(entries):
        home = words.first_match(i)  # an index into groups, or None
        by_meaning = False
        if meaning is not None and vectors is not None:
            before = len(groups) if home is None else home
            for g in vectors.above(texts[entry.key], before):
                if meaning.same(texts[groups[g].members[0].key], texts[entry.key]):
                    home, by_meaning = g, True
                    break
        if home is None:
            words.add_group(i)
            if vectors is not None:
                vectors.add_group(texts[entry.key])
            groups.append(Group(entry, [entry]))
            continue
        group = groups[home]
        group.entry = _merge(group.entry, entry)
        group.members.append(entry)
        group.by_meaning += by_meaning
    return groups


class _WordIndex:
    """The groups a snippet's words could match (``text_similarity`` at least ``threshold``),
    found by prefix filtering: with every token set in one order (rarest first), two sets
    whose Jaccard similarity reaches t share a token among the first |X| - ceil(t·|X|) + 1 of
    each. Only the groups' first entries are indexed, as only they are compared."""

    def __init__(self, snippets: Sequence[str], threshold: float) -> None:
        self.snippets = snippets
        self.threshold = threshold
        self.tokens = [mmr_tokens(s) for s in snippets]
        counts: dict[str, int] = {}
        for tokens in self.tokens:
            for t in tokens:
                counts[t] = counts.get(t, 0) + 1
        self.rank = {t: (n, t) for t, n in counts.items()}
        self.postings: dict[str, list[int]] = {}  # token -> groups whose prefix holds it
        self.firsts: list[int] = []  # group -> the entry that founded it
        self.blank: dict[str, int] = {}  # a token-less snippet, lowered -> its first group
        self.compared = 0  # exact comparisons made (each a candidate the prefixes found)

    def _prefix(self, i: int) -> list[str]:
        tokens = sorted(self.tokens[i], key=self.rank.__getitem__)
        # Overlap needed is at least ceil(t·|X|); the small allowance keeps a product that
        # lands a hair above an integer from shortening the prefix (a longer one is safe).
        needed = max(0, math.floor(self.threshold * len(tokens) - 1e-9))
        return tokens[: len(tokens) - needed + 1]

    def first_match(self, i: int) -> int | None:
        """The first group whose founding snippet is ``threshold`` alike to entry ``i``'s."""
        if self.threshold <= 0:  # every pair is alike
            return 0 if self.firsts else None
        tokens = self.tokens[i]
        if not tokens:  # alike only to an equal snippet without tokens (text_similarity)
            return self.blank.get(self.snippets[i].strip().lower())
        candidates = sorted({g for t in self._prefix(i) for g in self.postings.get(t, ())})
        for g in candidates:
            # text_similarity of two snippets with tokens, from the tokens already made
            first = self.tokens[self.firsts[g]]
            self.compared += 1
            if len(first & tokens) / len(first | tokens) >= self.threshold:
                return g
        return None

    def add_group(self, i: int) -> None:
        g = len(self.firsts)
        self.firsts.append(i)
        if not self.tokens[i]:
            self.blank.setdefault(self.snippets[i].strip().lower(), g)
            return
        for t in self._prefix(i):
            self.postings.setdefault(t, []).append(g)


class _VectorIndex:
    """The groups' first vectors in one matrix, for the groups whose cosine with a text could
    reach ``meaning``'s threshold. A product of many rows need not equal each row's dot product
    to the last bit, so the margin admits the near ones and ``Meaning.same`` decides."""

    MARGIN = 1e-4

    def __init__(self, meaning: Meaning) -> None:
        self.meaning = meaning
        self.count = 0  # groups added
        self.matrix = np.zeros((0, 0), dtype=np.float32)  # grown by doubling; zero rows: none

    def add_group(self, text: str) -> None:
        vector = self.meaning.vector(text)
        if vector is not None and vector.ndim == 1 and self.matrix.shape[1] == 0:
            self.matrix = np.zeros((max(64, 2 * self.count), vector.shape[0]), np.float32)
        if self.count == self.matrix.shape[0] and self.matrix.shape[1]:
            grown = np.zeros((2 * self.count, self.matrix.shape[1]), np.float32)
            grown[: self.count] = self.matrix
            self.matrix = grown
        if vector is not None and vector.shape == (self.matrix.shape[1],):
            self.matrix[self.count] = vector
        self.count += 1

    def above(self, text: str, before: int) -> list[int]:
        """The groups, in order and fewer than ``before``, near or above the threshold."""
        vector = self.meaning.vector(text)
        if vector is None or before == 0 or vector.shape != (self.matrix.shape[1],):
            return []
        cosines = self.matrix[:before] @ vector.astype(np.float32, copy=False)
        return [int(g) for g in np.flatnonzero(cosines >= self.meaning.threshold - self.MARGIN)]
