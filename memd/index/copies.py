"""Copies of one vector in the sketch (memd/index/sketch.py): the same text written again,
found by the vector's bytes, and an index that is mostly copies scored by its distinct vectors.

A print is a hash of a vector's bytes, never a float computed from it: BLAS gives equal rows
different last bits by where they fall in a kernel's tile (AVX2 and AVX-512 differ), so float
equality finds no copies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["COPIES_SHARE", "Copies", "by_print", "fingerprints", "grouped"]

# An index whose distinct vectors are at most this share of its live ones is searched by its
# distinct vectors (one row each, the copies' ids beside it): at 97,501 chunks of 390 texts the
# flat pass read 37 MB and widened to 16 x its size for each query to find them.
COPIES_SHARE = 0.5


def fingerprints(vectors: np.ndarray[Any, np.dtype[np.float32]]) -> np.ndarray[Any, Any]:
    """A 64-bit hash (BLAKE2b) of each row's bytes: equal for copies of one vector, and (but
    for a 2^-64 chance) only for them. About a microsecond a row."""
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    digests = b"".join(hashlib.blake2b(row.data, digest_size=8).digest() for row in rows)
    return np.frombuffer(digests, dtype=np.uint64).copy()


def by_print(prints: np.ndarray[Any, Any], at: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """The rows ``at`` (ascending) in order of their prints, copies in row order whatever the
    sort, and where each distinct print's run starts among them."""
    order = at[np.argsort(prints[at], kind="stable")]
    sorted_prints = prints[order]
    return order, np.flatnonzero(np.r_[True, sorted_prints[1:] != sorted_prints[:-1]])


def grouped(
    ids: np.ndarray[Any, Any], order: Any, starts: Any, chosen: Iterable[int]
) -> list[list[int]]:
    """The ids of the runs ``chosen`` of ``by_print``'s ``order`` and ``starts``."""
    flat = ids[order].tolist()
    bounds = [*starts.tolist(), len(flat)]
    return [flat[bounds[g] : bounds[g + 1]] for g in chosen]


class Copies:
    """The distinct vectors of a sketch that is mostly copies: one projected row each (its
    first live copy's), and the ids of its live copies in row order, for one version of the
    rows. An index that is not mostly copies gets an empty one, kept until its live count
    moves by a tenth: a few writes cannot make most of it copies."""

    def __init__(
        self,
        version: int,
        alive: int,
        rows: np.ndarray[Any, Any] | None = None,
        groups: list[list[int]] | None = None,
    ) -> None:
        self.version, self.alive = version, alive
        self.rows = rows
        self.groups = groups or []  # shared by every search: read, never changed

    @classmethod
    def of(
        cls,
        version: int,
        rows: np.ndarray[Any, Any],
        ids: np.ndarray[Any, Any],
        prints: np.ndarray[Any, Any],
        live: np.ndarray[Any, Any],
    ) -> Copies:
        at = np.flatnonzero(live)
        order, starts = by_print(prints, at)
        if len(starts) > COPIES_SHARE * len(at):
            return cls(version, len(at))
        groups = grouped(ids, order, starts, range(len(starts)))
        return cls(version, len(at), np.ascontiguousarray(rows[order[starts]]), groups)

    def holds(self, version: int, alive: int) -> bool:
        """Whether this answers for the rows at ``version`` (holding ``alive`` live rows)."""
        if self.groups:
            return self.version == version
        return abs(alive - self.alive) * 10 < max(self.alive, 1)

    def best(self, q: np.ndarray[Any, Any], n: int) -> list[list[int]]:
        """The ``n`` groups whose projections score best against ``q`` (projected), best
        first; ties in the order of their prints, as the flat pass orders them."""
        assert self.rows is not None
        scores = self.rows @ q
        if len(scores) > n:
            top = np.argpartition(-scores, n)[:n]
            top.sort()
            top = top[np.argsort(-scores[top], kind="stable")]
        else:
            top = np.argsort(-scores, kind="stable")
        return [self.groups[g] for g in top.tolist()]
