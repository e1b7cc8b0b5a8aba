"""Tests for memd.index.chunk: line-based chunking, the CJK-aware budget and fitting to a model."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.embed.fake import FakeEmbedder
from memd.index.chunk import (
    CHUNKER_VERSION,
    Chunk,
    Restart,
    chunk_markdown,
    chunk_resumable,
    chunk_text,
    fit_to_model,
    vector_lines,
)
from memd.text import estimate_tokens, weighted_len

# ---------------------------------------------------------------------------------------------
# Helpers: an independent reading of the file and checks that every chunk is a slice of it.


def source_lines(content: str) -> list[str]:
    """The file's real lines: split on LF, no phantom last line, one trailing CR removed."""
    lines = content.split("\n")
    if content.endswith("\n"):
        lines = lines[:-1]
    return [line.removesuffix("\r") for line in lines] if content else []


def max_chars(tokens: int) -> int:
    return max(32, tokens * 4)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def placements(chunk: Chunk, lines: list[str], starts: list[int], normalized: str) -> list[int]:
    """Offsets in ``normalized`` where ``chunk`` can sit, checking it is a slice of its lines.

    A multi-line chunk has one possible place; a piece of a single line may be ambiguous
    (``"0000"``), so every occurrence inside that line is returned.
    """
    assert 1 <= chunk.start_line <= chunk.end_line <= len(lines)
    parts = chunk.text.split("\n")
    assert len(parts) == chunk.end_line - chunk.start_line + 1
    first = chunk.start_line - 1
    line_end = starts[first] + len(lines[first])
    if len(parts) > 1:
        assert lines[first].endswith(parts[0])
        assert lines[chunk.end_line - 1].startswith(parts[-1])
        assert parts[1:-1] == lines[chunk.start_line : chunk.end_line - 1]
        return [line_end - len(parts[0])]
    found: list[int] = []
    pos = normalized.find(chunk.text, starts[first], line_end)
    while pos != -1:
        found.append(pos)
        pos = normalized.find(chunk.text, pos + 1, line_end)
    assert found, f"{chunk} is not inside line {chunk.start_line}"
    return found


def check_chunks(chunks: list[Chunk], content: str, *, ordered: bool = True) -> None:
    """Every chunk is an exact slice of its line range; together they cover all non-blank text.

    ``ordered``: there is a placement of the chunks in which each starts and ends strictly after
    the previous one and only whitespace lies between them or before the first or after the
    last (true of chunk_markdown, and of fit_to_model applied to non-overlapping chunks).
    """
    lines = source_lines(content)
    normalized = "\n".join(lines)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    # reach[p]: one past the last non-whitespace character before offset p.
    reach = [0] * (len(normalized) + 1)
    for i, ch in enumerate(normalized):
        reach[i + 1] = reach[i] if ch.isspace() else i + 1
    feasible: list[int] = [-1]  # sorted possible starts of the previous chunk
    prev_len = 0
    for chunk in chunks:
        assert chunk.text.strip(), "whitespace-only chunk"
        assert chunk.hash == sha(chunk.text)
        assert "\r" not in chunk.text or "\r" in normalized
        candidates = placements(chunk, lines, starts, normalized)
        if not ordered:
            continue
        size = len(chunk.text)
        now: list[int] = []
        for p in candidates:  # a previous start q in [low, high] is compatible with p
            low = reach[p] - prev_len if feasible != [-1] else (-1 if reach[p] == 0 else 0)
            high = min(p, p + size - prev_len) - 1
            i = bisect.bisect_left(feasible, low)
            if i < len(feasible) and feasible[i] <= high:
                now.append(p)
        assert now, f"{chunk} cannot follow the previous chunk without skipping text"
        feasible, prev_len = now, size
    if ordered:
        if feasible == [-1]:
            assert not normalized.strip()
        else:
            assert feasible[-1] + prev_len >= reach[-1], "non-blank text at the end skipped"
    # The line-level statement of the same: every non-blank line lies in some chunk's range.
    for index, line in enumerate(lines, start=1):
        if line.strip():
            assert any(c.start_line <= index <= c.end_line for c in chunks), index
    for a, b in zip(chunks, chunks[1:]):
        if ordered:
            assert a.start_line <= b.start_line and a.end_line <= b.end_line


# ---------------------------------------------------------------------------------------------
# Small, exact cases.


def test_empty_and_blank_content_give_no_chunks() -> None:
    assert chunk_markdown("") == []
    assert chunk_markdown("\n") == []
    assert chunk_markdown("  \n\t\n\n   ") == []


def test_single_short_line() -> None:
    assert chunk_markdown("hello world") == [
        Chunk(start_line=1, end_line=1, text="hello world", hash=sha("hello world"))
    ]


def test_small_file_is_one_chunk_with_inclusive_range() -> None:
    content = "# Title\n\nfirst line\nsecond line\n"
    (chunk,) = chunk_markdown(content)
    assert (chunk.start_line, chunk.end_line) == (1, 4)
    assert chunk.text == "# Title\n\nfirst line\nsecond line"


def test_trailing_newline_does_not_add_a_line() -> None:
    assert chunk_markdown("a\nb\n") == chunk_markdown("a\nb")
    assert chunk_markdown("a\nb\n")[-1].end_line == 2
    # One line per chunk (tokens=1 -> 32 chars): the last chunk is still line 2.
    lines = ["x" * 20, "y" * 20]
    chunks = chunk_markdown("\n".join(lines) + "\n", tokens=1, overlap=0)
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [
        (1, 1, lines[0]),
        (2, 2, lines[1]),
    ]


def test_hash_is_sha256_of_text() -> None:
    chunks = chunk_markdown("\n".join(f"line {i} café 中文 😀" for i in range(300)), 50, 10)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.hash == hashlib.sha256(chunk.text.encode("utf-8")).hexdigest()
    assert len({c.hash for c in chunks}) == len(chunks)


def test_chunker_version_is_an_int() -> None:
    assert isinstance(CHUNKER_VERSION, int) and CHUNKER_VERSION >= 1


# ---------------------------------------------------------------------------------------------
# Long lines, CJK, CRLF, emoji.


def test_huge_line_is_cut_into_pieces_on_line_one() -> None:
    line = "abcdefghij" * 1000  # 10,000 characters, no newline
    chunks = chunk_markdown(line)  # default 400 tokens / 80 overlap
    assert len(chunks) == 7
    assert all(c.start_line == c.end_line == 1 for c in chunks)
    assert all(len(c.text) <= 1600 for c in chunks)
    # Pieces of one line never overlap, so they concatenate back to the line.
    assert "".join(c.text for c in chunks) == line
    check_chunks(chunks, line)


def test_huge_line_between_normal_lines_keeps_line_numbers() -> None:
    content = "before\n" + "z" * 5000 + "\nafter\n"
    chunks = chunk_markdown(content, tokens=100, overlap=20)
    check_chunks(chunks, content)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 3
    on_line_2 = [c for c in chunks if c.start_line == c.end_line == 2]
    assert len(on_line_2) >= 10


CHINESE = (
    "记忆是智能体在多次会话之间保存知识的方式，它把用户的偏好、项目的决定和重要的事实写进文件，"
    "然后在需要的时候通过检索找回来。"
    "一个好的记忆系统应该快速、可靠，并且能够处理中文这样不用空格分词的语言。"
)


def chinese(n: int) -> str:
    return (CHINESE * (n // len(CHINESE) + 1))[:n]


def test_cjk_paragraph_respects_weighted_budget() -> None:
    paragraph = chinese(3000)
    assert weighted_len(paragraph) == 4 * 3000  # every character here is "weighted"
    chunks = chunk_markdown(paragraph, tokens=400, overlap=80)
    # The algorithm guarantees weighted_len(text) <= maxChars (1600) for every chunk; here each
    # chunk is one re-sliced piece of `tokens` characters, so the bound is reached exactly.
    assert [len(c.text) for c in chunks] == [400] * 7 + [200]
    assert max(weighted_len(c.text) for c in chunks) == 1600
    assert "".join(c.text for c in chunks) == paragraph
    check_chunks(chunks, paragraph)


def test_cjk_sentences_on_many_lines_respect_budget_with_overlap() -> None:
    sentences = [s + "。" for s in chinese(6000).split("。") if s]
    content = "\n".join(sentences)
    for tokens, overlap in [(400, 80), (64, 16), (8, 100)]:
        chunks = chunk_markdown(content, tokens, overlap)
        assert len(chunks) > 3
        assert all(weighted_len(c.text) <= max_chars(tokens) for c in chunks)
        check_chunks(chunks, content)


def test_mixed_cjk_line_pieces_are_joined_without_newlines() -> None:
    line = "abc中" * 1000  # re-sliced pieces weigh 700, so two pieces share a chunk
    chunks = chunk_markdown(line, tokens=400, overlap=0)
    assert all("\n" not in c.text for c in chunks)
    assert any(len(c.text) == 800 for c in chunks)
    assert all(weighted_len(c.text) <= 1600 for c in chunks)
    assert "".join(c.text for c in chunks) == line
    overlapping = chunk_markdown(line, tokens=400, overlap=80)
    assert all(c.text in line for c in overlapping)
    check_chunks(overlapping, line)


def test_crlf_gives_same_chunks_as_lf() -> None:
    lines = [f"- note {i}: the agent prefers tabs over spaces" for i in range(200)]
    lines[50] = ""
    lines[120] = "x" * 3000
    lf = "\n".join(lines) + "\n"
    crlf = lf.replace("\n", "\r\n")
    for tokens, overlap in [(400, 80), (50, 0)]:
        a, b = chunk_markdown(lf, tokens, overlap), chunk_markdown(crlf, tokens, overlap)
        assert a == b
        assert all("\r" not in c.text for c in b)
        assert b[-1].end_line == 200
        check_chunks(b, crlf)


def test_emoji_and_astral_characters_are_never_split() -> None:
    emoji = "😀👍🏽👩‍💻🇫🇷𠀀a "
    line = emoji * 700
    for tokens in (1, 7, 400):
        chunks = chunk_markdown(line, tokens, 0)
        assert len(chunks) > 1
        for chunk in chunks:
            chunk.text.encode("utf-8")  # strict: raises on a lone surrogate
            assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in chunk.text)
            assert set(chunk.text) <= set(emoji)
            assert weighted_len(chunk.text) <= max_chars(tokens)
        assert "".join(c.text for c in chunks) == line


# ---------------------------------------------------------------------------------------------
# Overlap.

NOTES = [f"line {i:03d} lorem ipsum dolor" for i in range(100)]  # 28 chars, cost 29 each


def test_overlap_shares_lines_between_consecutive_chunks() -> None:
    content = "\n".join(NOTES)
    chunks = chunk_markdown(content, tokens=50, overlap=10)  # 200 chars, overlap 40 chars
    assert len(chunks) > 5
    for a, b in zip(chunks, chunks[1:]):
        assert a.start_line < b.start_line <= a.end_line < b.end_line
        shared = NOTES[b.start_line - 1 : a.end_line]
        assert sum(weighted_len(s) + 1 for s in shared) >= 40
        assert len(shared) == 2  # the fewest lines that reach 40 chars
    check_chunks(chunks, content)


def test_overlap_stops_as_soon_as_it_reaches_overlap_chars() -> None:
    # Lines cost exactly 20; tokens=50 -> 200 chars = 10 lines; overlap 10 tokens = 40 chars,
    # reached by exactly two lines, so each chunk repeats the previous chunk's last two lines.
    lines = [f"entry {i:02d}".ljust(19, ".") for i in range(1, 31)]
    chunks = chunk_markdown("\n".join(lines), tokens=50, overlap=10)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 10), (9, 18), (17, 26), (25, 30)]


def test_no_overlap_means_chunks_are_disjoint() -> None:
    content = "\n".join(NOTES)
    chunks = chunk_markdown(content, tokens=50, overlap=0)
    assert len(chunks) > 5
    for a, b in zip(chunks, chunks[1:]):
        assert b.start_line == a.end_line + 1
    assert "\n".join(c.text for c in chunks) == content


def test_huge_overlap_never_repeats_a_whole_chunk() -> None:
    content = "\n".join(NOTES)
    chunks = chunk_markdown(content, tokens=50, overlap=1000)
    assert len(set(chunks)) == len(chunks)
    for a, b in zip(chunks, chunks[1:]):
        assert b.start_line == a.start_line + 1  # carries all but the first line
    assert chunks[-1].end_line == 100
    check_chunks(chunks, content)


def test_overlap_gives_way_to_the_budget() -> None:
    # tokens=10 -> 40 chars, overlap 20 chars. The carried lines a3, a4 (cost 20) plus the
    # 40-char line would weigh 60, so the overlap is dropped rather than exceed the budget.
    content = "\n".join(["a" * 9] * 4 + ["b" * 40])
    chunks = chunk_markdown(content, tokens=10, overlap=5)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 4), (5, 5)]
    assert all(weighted_len(c.text) <= 40 for c in chunks)


# ---------------------------------------------------------------------------------------------
# Property: random Markdown.

WORDS = ["memory", "agent", "the", "SQLite", "café", "中文", "記憶", "한국어", "😀", "👩‍💻"]
WORDS.append("x" * 45)
LINE = st.one_of(
    st.just(""),
    st.sampled_from(["   ", "\t", "#", "## Heading", "- item", "```", "> quote", "\r"]),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(" ".join),
    st.text(max_size=120),
    st.text(alphabet="中文記憶abc 😀", min_size=50, max_size=400),
)


@st.composite
def markdown(draw: st.DrawFn) -> str:
    lines = draw(st.lists(LINE, max_size=50))
    sep = "\r\n" if draw(st.booleans()) else "\n"
    return sep.join(lines) + (sep if draw(st.booleans()) else "")


@settings(max_examples=200, deadline=None)
@given(markdown(), st.integers(1, 120), st.integers(0, 150))
def test_chunks_cover_the_file_exactly(content: str, tokens: int, overlap: int) -> None:
    chunks = chunk_markdown(content, tokens, overlap)
    check_chunks(chunks, content)
    assert all(weighted_len(c.text) <= max_chars(tokens) for c in chunks)
    lines = source_lines(content)
    limit = max_chars(tokens)
    short = {i for i, x in enumerate(lines, 1) if len(x) <= limit and weighted_len(x) <= limit}
    for c in chunks:  # chunks bounded by unsplit lines are exactly those joined lines
        if c.start_line in short and c.end_line in short:
            assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
    if overlap == 0:
        for a, b in zip(chunks, chunks[1:]):
            assert a.end_line <= b.start_line


# ---------------------------------------------------------------------------------------------
# fit_to_model.


def words(text: str) -> int:
    return len(text.split())


def test_fit_to_model_splits_oversized_chunks_with_fake_embedder() -> None:
    embedder = FakeEmbedder(max_tokens=50)
    long_line = "word " * 400  # 2000 chars on line 31
    content = "\n".join(NOTES[:30] + [long_line] + NOTES[30:60])
    chunks = chunk_markdown(content, tokens=400, overlap=0)
    assert any(embedder.count_tokens(c.text) > 50 for c in chunks)
    fitted = fit_to_model(chunks, embedder.count_tokens, embedder.max_tokens)
    assert len(fitted) > len(chunks)
    assert all(embedder.count_tokens(c.text) <= 50 for c in fitted)
    check_chunks(fitted, content)  # exact slices, right ranges, nothing lost
    pieces = [c for c in fitted if c.start_line == c.end_line == 31]
    assert len(pieces) >= 10
    assert "".join(c.text for c in pieces) == long_line
    # Multi-line pieces were cut at line boundaries.
    assert any(c.end_line > c.start_line for c in fitted)


def test_fit_to_model_with_word_counter_splits_one_line() -> None:
    line = " ".join(f"w{i}" for i in range(23))
    fitted = fit_to_model(chunk_markdown(line), words, 5)
    assert [words(c.text) for c in fitted] == [5, 5, 5, 5, 3]
    assert all((c.start_line, c.end_line) == (1, 1) for c in fitted)
    assert all(c.hash == sha(c.text) for c in fitted)
    assert "".join(c.text for c in fitted) == line


def test_fit_to_model_halves_multi_line_chunks() -> None:
    content = "\n".join(f"a b c {i}" for i in range(1, 9))  # 8 lines of 4 words
    (chunk,) = chunk_markdown(content)
    fitted = fit_to_model([chunk], words, 8)
    assert [(c.start_line, c.end_line) for c in fitted] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert [c.text for c in fitted] == [
        "a b c 1\na b c 2",
        "a b c 3\na b c 4",
        "a b c 5\na b c 6",
        "a b c 7\na b c 8",
    ]


def test_fit_to_model_keeps_chunks_that_fit() -> None:
    chunks = chunk_markdown("\n".join(NOTES), 50, 10)
    assert fit_to_model(chunks, estimate_tokens, 1000) == chunks


def test_fit_to_model_raises_when_one_character_is_too_big() -> None:
    chunks = chunk_markdown("fine\n中文")
    with pytest.raises(ValueError, match="line 2"):
        fit_to_model(chunks, weighted_len, 3)  # a CJK character weighs 4
    with pytest.raises(ValueError):
        fit_to_model(chunks, weighted_len, 0)
    with pytest.raises(ValueError):  # text and line range disagree
        fit_to_model([Chunk(1, 1, "x\ny", sha("x\ny"))], len, 1)


@settings(max_examples=100, deadline=None)
@given(
    markdown(),
    st.integers(1, 120),
    st.sampled_from([(estimate_tokens, 3), (estimate_tokens, 17), (words, 1), (words, 4)]),
)
def test_fit_to_model_property(
    content: str, tokens: int, limit: tuple[Callable[[str], int], int]
) -> None:
    count, max_tokens = limit
    fitted = fit_to_model(chunk_markdown(content, tokens, 0), count, max_tokens)
    assert all(count(c.text) <= max_tokens for c in fitted)
    check_chunks(fitted, content)
    overlapping = fit_to_model(chunk_markdown(content, tokens, 30), count, max_tokens)
    assert all(count(c.text) <= max_tokens for c in overlapping)
    check_chunks(overlapping, content, ordered=False)


def test_chunk_text_combines_both_steps() -> None:
    content = "\n".join(NOTES) + "\n" + "y" * 3000
    plain = chunk_markdown(content, 400, 80)
    assert chunk_text(content, 400, 80) == plain
    embedder = FakeEmbedder(max_tokens=60)
    fitted = chunk_text(content, 400, 80, embedder.count_tokens, embedder.max_tokens)
    assert fitted == fit_to_model(plain, embedder.count_tokens, 60) != plain
    # A limit without a counter uses the estimate.
    assert chunk_text(content, 400, 80, max_tokens=60) == fitted


def test_vector_lines_skip_headings_short_and_single_lines() -> None:
    text = "# Title\n\nAlice: hello there\n  ok\nBob: hi Alice\n## Sub\n"
    assert [line for line, _ in vector_lines(text)] == ["Alice: hello there", "Bob: hi Alice"]
    assert vector_lines("# Title\nOnly one line here\n") == []
    (_, h1), (_, h2) = vector_lines("same line\nsame line\n")
    assert h1 == h2 == chunk_markdown("same line")[0].hash  # a line's key is its text's hash


# -- restarts: chunking again from the last one gives the same chunks ------------------------

CHUNK_LINES = st.lists(
    st.one_of(
        st.sampled_from(
            ["", "   ", "# Heading", "x" * 90, "部署到生产环境之前先检查", "word " * 12]
        ),
        st.text(alphabet="ab \t", max_size=40),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    head=CHUNK_LINES,
    tail=CHUNK_LINES,
    end=st.booleans(),
    tokens=st.integers(1, 24),
    overlap=st.integers(0, 12),
)
def test_chunking_from_a_restart_gives_the_same_chunks_after_an_append(
    head: list[str], tail: list[str], end: bool, tokens: int, overlap: int
) -> None:
    """For every restart of a text that its whole lines seal, the text with more appended
    chunks into the chunks before the restart plus the chunks of the new text from there."""
    overlap = min(overlap, tokens - 1)
    old = "\n".join(head) + ("\n" if end else "")
    new = old + "\n".join(tail)
    old_chunks, restarts = chunk_resumable(old, tokens, overlap)
    new_chunks = chunk_markdown(new, tokens, overlap)
    lines = new.split("\n")
    assert restarts[0] == Restart(1, 0)
    for r in restarts:
        if r.sealed > old.count("\n"):
            continue
        from_old = chunk_resumable(
            "\n".join(old.split("\n")[r.line - 1 :]), tokens, overlap, first_line=r.line
        )[0]
        before = old_chunks[: len(old_chunks) - len(from_old)]
        assert old_chunks[len(before) :] == from_old
        after = chunk_resumable("\n".join(lines[r.line - 1 :]), tokens, overlap, first_line=r.line)[
            0
        ]
        assert new_chunks == before + after, r
