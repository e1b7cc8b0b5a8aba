"""SearchOptions: one search's knobs, and the modes a search can run in.

Its own module because every step of a search reads it, and so do the callers that build it
(the daemon, the reader processes), while it reads nothing of a search itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from memd.config import SearchConfig

__all__ = ["Mode", "SearchOptions"]

Mode = Literal["hybrid", "keyword", "vector"]


_DEFAULTS = SearchConfig()


@dataclass(frozen=True)
class SearchOptions:
    """One search's knobs; ``from_config`` fills them from ``[search]``."""

    # The defaults are [search]'s: SearchConfig is their one home.
    mode: Mode = _DEFAULTS.mode
    max_results: int = _DEFAULTS.max_results
    min_score: float = _DEFAULTS.min_score
    sources: tuple[str, ...] | None = None
    vector_weight: float = _DEFAULTS.vector_weight
    text_weight: float = _DEFAULTS.text_weight
    candidate_multiplier: int = _DEFAULTS.candidate_multiplier
    snippet_chars: int = _DEFAULTS.snippet_chars
    decay: bool = _DEFAULTS.decay
    half_life_days: float = _DEFAULTS.half_life_days
    mmr: bool = _DEFAULTS.mmr
    mmr_lambda: float = _DEFAULTS.mmr_lambda
    # The user's day (ISO) that "today" and "yesterday" in a query mean: the daemon's Clock,
    # in its configured zone. Empty: the machine's local day.
    today: str = ""

    @classmethod
    def from_config(cls, config: SearchConfig, **overrides: object) -> SearchOptions:
        """Options from ``[search]``, with the ``overrides`` that are not None on top."""
        names = {f.name for f in fields(cls)}
        values = {f.name: getattr(config, f.name) for f in fields(config) if f.name in names}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def candidates(self) -> int:
        return min(200, max(1, self.max_results * self.candidate_multiplier))
