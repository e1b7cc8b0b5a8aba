"""Dreaming's dedupe compares an entry only with the groups that could match it (prefix
filtering for words, one matrix product for meaning). Invariant: it reaches exactly the
groups that comparing every entry with every group's first entry reaches, for any entries,
threshold and vectors. The reference below is that plain loop, as dedupe was written before.

The vectors come from a small function of the text (a real ``VectorSource``, no model): texts
that share words get near vectors, so cosines land on both sides of the threshold and near it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.dreams import similar
from memd.dreams.recall_entry import RecallEntry, entry_key
from memd.dreams.similar import Group, Meaning, _merge, dedupe, text_similarity

WORDS = ["ana", "prefers", "morning", "meetings", "the", "a", "friday", "9:30", "not", "Sam"]
WORDS += ["会議", "朝", "です", "!!", "—", ""]


def reference(
    entries: Sequence[RecallEntry], threshold: float, meaning: Meaning | None
) -> list[Group]:
    texts = {e.key: (meaning.texts if meaning else {}).get(e.key) or e.snippet for e in entries}
    if meaning is not None:
        meaning.load(texts.values())
    groups: list[Group] = []
    for entry in entries:
        home, by_meaning = None, False
        for group in groups:
            first = group.members[0]
            if text_similarity(first.snippet, entry.snippet) >= threshold:
                home = group
                break
            if meaning is not None and meaning.same(texts[first.key], texts[entry.key]):
                home, by_meaning = group, True
                break
        if home is None:
            groups.append(Group(entry, [entry]))
            continue
        home.entry = _merge(home.entry, entry)
        home.members.append(entry)
        home.by_meaning += by_meaning
    return groups


def vectors_of(texts: Sequence[str]) -> list[np.ndarray | None]:
    """A unit vector per text from its words' hashes (None for a text without words)."""
    out: list[np.ndarray | None] = []
    for text in texts:
        words = text.lower().split()
        if not words:
            out.append(None)
            continue
        v = np.zeros(6, dtype=np.float32)
        for w in words:
            v[sum(map(ord, w)) % 6] += 1.0
        out.append(v / np.linalg.norm(v))
    return out


def entries_of(snippets: list[str]) -> list[RecallEntry]:
    return [
        RecallEntry(entry_key(f"memory/n{i % 3}.md", i + 1, i + 1), f"memory/n{i % 3}.md", i + 1,
                    i + 1, s, recall_count=i % 4, total_score=0.1 * (i % 7))
        for i, s in enumerate(snippets)
    ]  # fmt: skip


def shape(groups: list[Group]) -> list[tuple[list[str], int, int]]:
    return [(g.keys, g.by_meaning, g.entry.recall_count) for g in groups]


VOCAB = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey yankee"
).split()  # no digits, capitals or days: facts_agree holds, so meaning can merge


@st.composite
def snippets(draw: st.DrawFn) -> list[str]:
    """Near-duplicates of a few base sentences (a word dropped or added), so that word and
    meaning similarities fall on both sides of every threshold, plus odd snippets."""
    bases = draw(
        st.lists(st.lists(st.sampled_from(VOCAB), min_size=2, max_size=14, unique=True),
                 min_size=1, max_size=4)
    )  # fmt: skip
    out = []
    for _ in range(draw(st.integers(0, 40))):
        if draw(st.integers(0, 9)) == 0:
            out.append(" ".join(draw(st.lists(st.sampled_from(WORDS), max_size=5))))
            continue
        words = list(draw(st.sampled_from(bases)))
        for _ in range(draw(st.integers(0, 3))):
            if words and draw(st.booleans()):
                words.pop(draw(st.integers(0, len(words) - 1)))
            else:
                words.insert(0, draw(st.sampled_from(VOCAB)))
        out.append(" ".join(words))
    return out


@settings(max_examples=300, deadline=None)
@given(
    snippets=snippets(),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 0.75, 0.8, 0.88, 0.9, 1.0]),
    cosine=st.none() | st.floats(0.5, 1.0),
)
def test_dedupe_equals_comparing_every_pair(
    snippets: list[str], threshold: float, cosine: float | None
) -> None:
    entries = entries_of(snippets)
    fast = Meaning(vectors_of, cosine) if cosine is not None else None
    slow = Meaning(vectors_of, cosine) if cosine is not None else None
    assert shape(dedupe(entries, threshold, meaning=fast)) == shape(
        reference(entries, threshold, slow)
    )


def test_dedupe_of_thousands_of_snippets_is_not_quadratic_in_text_comparisons() -> None:
    # 3,000 distinct snippets (a few months of recalls): the plain loop compared about 4.5
    # million pairs, tens of seconds on the writer's thread. Counted, not timed: the exact
    # comparisons must stay a small multiple of the entries (about 13 a snippet here).
    rng = np.random.default_rng(7)
    vocab = [f"w{i}" for i in range(2000)]
    snippets = [" ".join(rng.choice(vocab, size=12)) for _ in range(3000)]
    snippets += snippets[:50]  # some repeats, which must merge
    entries = entries_of(snippets)
    words = similar._WordIndex([e.snippet for e in entries], 0.9)  # dedupe's word matching
    for i in range(len(entries)):
        if words.first_match(i) is None:
            words.add_group(i)
    calls = words.compared
    groups = dedupe(entries, 0.9)
    assert len(groups) == 3000
    assert sum(len(g.members) == 2 for g in groups) == 50
    assert calls < 50 * len(snippets), calls
