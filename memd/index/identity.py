"""Index identity: everything that, when changed, makes the stored rows wrong for the new setup."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from memd.index.chunk import CHUNKER_VERSION, LINES_VERSION
from memd.index.schema import FTS_TOKENIZER
from memd.index.store import VectorStore

__all__ = ["KEYWORD_ONLY_MODEL", "Identity"]

SCHEMA_VERSION = 1
KEYWORD_ONLY_MODEL = "fts-only"

# Checked in this order, so the reported reason is the most fundamental difference.
_ORDER = (
    "schema",
    "chunker",
    "lines",
    "fts",
    "provider",
    "model",
    "settings_key",
    "dims",
    "vector_store",
    "chunk_tokens",
    "chunk_overlap",
    "max_tokens",
    "redact",
)


@dataclass(frozen=True)
class Identity:
    """What an index was built with. Keyword-only indexes have provider ``none``."""

    provider: str
    model: str
    settings_key: str
    dims: int
    vector_store: VectorStore
    chunk_tokens: int
    chunk_overlap: int
    max_tokens: int
    # Whether secrets were redacted from the indexed text (a change means other chunk text).
    redact: bool = True
    chunker: int = CHUNKER_VERSION
    # Which lines of a chunk get vectors of their own (0: an index from before line vectors).
    lines: int = LINES_VERSION
    fts: str = FTS_TOKENIZER
    schema: int = SCHEMA_VERSION

    @property
    def semantic(self) -> bool:
        """True when the index holds (or is meant to hold) vectors."""
        return self.provider != "none"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Identity | None:
        names = {f.name for f in fields(cls)}
        data = {"lines": 0, **data}
        if not names <= set(data):
            return None
        return cls(**{k: data[k] for k in names})

    def mismatch(self, stored: Identity | None) -> str | None:
        """Name the first field where ``stored`` differs from this one; None when equal."""
        if stored is None:
            return "missing"
        for name in _ORDER:
            if getattr(self, name) != getattr(stored, name):
                return name
        return None
