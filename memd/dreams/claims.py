"""What a search recalled, as claims: the snippets of a daily note that carry the query.

A search returns a chunk (up to 400 tokens: a heading, a few unrelated lines); promoting it
whole squashed a heading and an unrelated line into one bullet, and the same fact was promoted
twice, once as the chunk and once as the line Light had read. So a recall is counted for the
snippets of the note that hold the query's terms, cut as Light cuts a note
(memd/dreams/daily.py): a search and Light then count the same claim under the same entry. A
result with no line holding a term (a match by meaning only) counts for the snippets of the
lines the searcher was shown, at most ``MAX_CLAIMS``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memd.dreams.daily import DailySnippet, daily_snippets
from memd.text import query_terms, tokens_among

__all__ = ["CACHED_LINES", "MAX_CLAIMS", "recalled_claims"]

MAX_CLAIMS = 3

Lines = Callable[[str], Sequence[str] | None]  # a workspace file's lines (None: unreadable)

# Searches recall the same notes again and again, and cutting a note costs milliseconds of
# regular expressions (a third of a busy daemon's CPU at one client, on the recorder's thread
# while the next search waits for the GIL): the cuts of the last notes seen, by their text.
# Only notes of up to CACHED_LINES lines are kept; their lines are mostly the strings the
# recall store keeps (memd/dreams/recall_store.py, NOTES_BYTES), shared.
CACHED_NOTES = 128
CACHED_LINES = 1000


@functools.lru_cache(maxsize=CACHED_NOTES)
def _cut(lines: tuple[str, ...]) -> tuple[DailySnippet, ...]:
    return tuple(daily_snippets(lines, limit=10_000))


def _terms(query: str) -> list[str]:
    words, runs = query_terms(query)
    terms = [w for w in words if len(w) > 1 or w.isdigit()] or words
    for run in runs:
        terms += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
    return terms


def recalled_claims(query: str, result: Mapping[str, Any], lines_of: Lines) -> list[dict[str, Any]]:
    """``result`` (a search hit in a daily note) as the results of the claims it holds; the
    result itself when its note cannot be read or cut."""
    path, start, end = result.get("path"), result.get("start_line"), result.get("end_line")
    if not isinstance(path, str) or not isinstance(start, int) or not isinstance(end, int):
        return [dict(result)]
    lines = lines_of(path)
    if not lines:
        return [dict(result)]
    cut = _cut(tuple(lines)) if len(lines) <= CACHED_LINES else daily_snippets(lines, 10_000)
    inside = [s for s in cut if start <= s.end_line and s.start_line <= end]
    if not inside:
        return [dict(result)]
    terms = _terms(query)
    held = {
        s: len(tokens_among("\n".join(lines[s.start_line - 1 : s.end_line]), terms)) if terms else 0
        for s in inside
    }
    # the snippets holding most of the query's terms, in file order among equals
    carrying = sorted((s for s in inside if held[s]), key=lambda s: -held[s])
    if not carrying:
        shown_from = result.get("snippet_start_line") or start
        snippet = result.get("snippet")
        shown_to = shown_from + (snippet.count("\n") if isinstance(snippet, str) else end - start)
        carrying = [s for s in inside if shown_from <= s.end_line and s.start_line <= shown_to]
    return [
        {**result, "start_line": s.start_line, "end_line": s.end_line, "snippet": s.snippet}
        for s in (carrying or inside)[:MAX_CLAIMS]
    ]
