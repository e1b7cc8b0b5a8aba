"""What a search gives back: Hit (one chunk found, with its snippet window), SearchOutcome
(the hits, the mode used and why), and the making of a Hit from a candidate row.

Apart from the ranking because they are also what a reply carries: a reader process's outcome
comes back shaped and is made into Hits only when asked (SearchOutcome.from_reply).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memd.index.reads import ChunkRow
from memd.search.options import SearchOptions
from memd.text import line_tokens_among

__all__ = ["Hit", "SearchOutcome"]


@dataclass
class Hit:
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    source: str
    vector_score: float = 0.0
    text_score: float = 0.0
    chunk_id: int = field(default=0, repr=False)
    keyword: bool = field(default=False, repr=False)
    exact: bool = field(default=False, repr=False)
    text: str = field(default="", repr=False)  # the whole chunk, for the snippet window
    snippet_start_line: int = 0  # the file line the snippet starts at
    match_lines: list[int] = field(default_factory=list)  # file lines holding query terms
    # the query's terms each line of ``text`` holds, when the ranking found them (the window's
    # terms are the ranking's: memd.search.search passes both the same)
    line_terms: list[set[str]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, r: dict[str, Any]) -> Hit:
        return cls(
            r["path"],
            r["start_line"],
            r["end_line"],
            r["score"],
            r["snippet"],
            r["source"],
            r["vector_score"],
            r["text_score"],
            snippet_start_line=r["snippet_start_line"],
            match_lines=list(r["match_lines"]),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(self.score, 6),
            "snippet": self.snippet,
            "snippet_start_line": self.snippet_start_line or self.start_line,
            "match_lines": list(self.match_lines),
            "source": self.source,
            "vector_score": round(self.vector_score, 6),
            "text_score": round(self.text_score, 6),
        }

    def window(self, terms: Sequence[str], max_chars: int) -> None:
        """Make the snippet the part of the chunk that shows the query best: the run of whole
        lines within ``max_chars`` holding the most distinct query terms (then the most
        matching lines, then the earliest), and note which file lines match."""
        if not self.text:
            return
        lines = self.text.split("\n")
        found = self.line_terms
        if found is None:
            found = line_tokens_among(self.text, terms)
        self.match_lines = [self.start_line + i for i, f in enumerate(found) if f]
        if len(self.text) <= max_chars or not self.match_lines:
            self.snippet_start_line = self.start_line
            self._transcript_lines()
            return
        best: tuple[int, int, int] = (-1, -1, 0)
        best_span = (0, 1)
        for i in range(len(lines)):
            used, seen, matching, j = 0, set[str](), 0, i
            while j < len(lines) and used + len(lines[j]) + (j > i) <= max_chars:
                used += len(lines[j]) + (j > i)
                seen |= found[j]
                matching += bool(found[j])
                j += 1
            score = (len(seen), matching, -i)
            if j > i and score > best:
                best, best_span = score, (i, j)
        i, j = best_span
        if best[0] <= 0:  # not even one line fits: the first matching line, cut
            i = self.match_lines[0] - self.start_line
            self.snippet = lines[i][:max_chars]
        else:
            self.snippet = "\n".join(lines[i:j])
        self.snippet_start_line = self.start_line + i
        self._transcript_lines()

    def _transcript_lines(self) -> None:
        """A transcript chunk's lines are rendered messages, not its file's JSONL lines: its
        snippet cites the chunk, and no line is named."""
        if self.source != "memory":
            self.snippet_start_line, self.match_lines = self.start_line, []


@dataclass
class SearchOutcome:
    results: list[Hit]
    mode: str  # the mode actually used
    provider: str
    model: str
    note: str | None = None  # why the mode used differs from the one asked for
    # The hits as a reply carries them, when they came that way (from a reader process):
    # they go on as they are, never made Hits again to be made maps again.
    shaped: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def hits(self) -> list[Any]:
        """The hits as a reply carries them (``memd_client.types.SearchHit``)."""
        if self.shaped is not None:
            return self.shaped
        return [h.to_dict() for h in self.results]

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> SearchOutcome:
        """An outcome as a reader process sent it; its Hits are made only if asked for."""
        outcome = cls([], reply["mode"], reply["provider"], reply["model"], reply["note"])
        outcome.shaped = list(reply["results"])
        outcome.results = _LazyHits(outcome.shaped)
        return outcome


class _LazyHits(list[Hit]):
    """Hits made from shaped hits the first time they are looked at (tests, the CLI)."""

    def __init__(self, shaped: list[dict[str, Any]]) -> None:
        super().__init__()
        self._shaped: list[dict[str, Any]] | None = shaped

    def _fill(self) -> None:
        if self._shaped is not None:
            shaped, self._shaped = self._shaped, None
            self.extend(Hit.from_dict(r) for r in shaped)

    def __iter__(self) -> Any:
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()

    def __getitem__(self, i: Any) -> Any:
        self._fill()
        return super().__getitem__(i)

    def __bool__(self) -> bool:
        return len(self) > 0


def _hit(row: ChunkRow, options: SearchOptions, **scores: Any) -> Hit:
    snippet = (
        row.text if len(row.text) <= options.snippet_chars else row.text[: options.snippet_chars]
    )
    return Hit(
        row.path,
        row.start_line,
        row.end_line,
        0.0,
        snippet,
        row.source,
        chunk_id=row.id,
        text=row.text,
        **scores,
    )
