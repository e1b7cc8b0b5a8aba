"""Keyword ranking without SQLite's ranking: the FTS index's terms in memory (memd/index/
postings.py), ranked as FTS5's bm25() ranks them, only the chunks that can reach the top k
scored (memd/index/bm25.py).

FTS5 computes bm25() for every row an OR query matches, about a microsecond each: 50 to 100 ms
at 100,000 chunks for a question naming a person, and fts5vocab walks a term's whole doclist to
count its rows (1 to 10 ms a common term there), again after every write. A KeywordIndex is
held per index file, like the vector sketch, and shared by the searches over it. A search
first applies the log rows past the last applied, in the snapshot it reads; the writer does
the same after each sync and then trims the log. The postings are built on the writer's thread
for a small index and in a process of their own for a large one (memd/index/
postings_process.py; about a second of CPU per 10,000 chunks); until then, for a query they cannot answer (a phrase of several tokens), and
when the build was refused, FTS5 ranks (memd/index/reads.py chooses).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import apsw

from memd.heap import release_memory
from memd.index.bm25 import Ranked, rank_postings
from memd.index.db import atomic
from memd.index.postings import LOG_TRIMMED_KEY, Mismatch, Postings, Stopped, trimmed
from memd.index.postings_process import build_elsewhere
from memd.index.termcount import tokenizer

__all__ = ["KeywordIndex", "KeywordRanker"]

logger = logging.getLogger(__name__)

Opener = Callable[[], contextlib.AbstractContextManager[apsw.Connection]]
PHRASE = re.compile(r'^(?:(uni) : )?"([^"]+)"$')


class KeywordRanker(Protocol):
    """What a search asks of keyword postings (memd/index/reads.py): a KeywordIndex, or in a
    reader process the daemon's, asked over the pipe (memd/readers/host.py). None from either
    method: they cannot answer, and FTS5 does."""

    @property
    def ready(self) -> bool: ...

    def doc_freqs(
        self, conn: apsw.Connection, terms: list[str]
    ) -> tuple[dict[str, int], int] | None: ...

    def top(self, conn: apsw.Connection, match: str, k: int) -> Ranked | None: ...


class KeywordIndex:
    """The keyword postings of one index file, shared by its readers; see the module doc."""

    def __init__(self, open_reader: Opener, path: Path | None = None) -> None:
        self._open_reader = open_reader  # a read connection of the file
        self._path = path  # the file, for a build in a process of its own
        self._lock = threading.Lock()
        self._state: Postings | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: str | None = None  # why FTS5 ranks instead (a count that did not match)
        self.built_seconds: float | None = None
        self.builds = 0

    @property
    def ready(self) -> bool:
        return self._state is not None

    @property
    def _building(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def chunks(self) -> int:
        """The chunks the postings hold (0: not built)."""
        state = self._state
        return state.alive if state is not None else 0

    @property
    def nbytes(self) -> int:
        state = self._state
        return state.nbytes if state is not None else 0

    def report(self) -> dict[str, object]:
        """How keyword searches rank now, for status: ``postings`` (in memory), ``building``
        (FTS5 ranks until they are ready) or ``fts5`` (not built: an index too small to start
        one yet, or ``error`` says why)."""
        ranking = "postings" if self.ready else "building" if self._building else "fts5"
        return {
            "ranking": ranking,
            "postings_mb": round(self.nbytes / 2**20, 1) if self.ready else None,
            "built_seconds": (
                round(self.built_seconds, 1) if self.built_seconds is not None else None
            ),
            "error": self.error,
        }

    # -- building --------------------------------------------------------------------------------

    def build(self, *, background: bool) -> None:
        """Build them (or build again, when worn), unless a build runs or the counts did not
        match FTS5's; in the background, searches meanwhile use FTS5 or the postings there are."""
        with self._lock:
            state = self._state
            if self._building or self.error or self._stop.is_set() or (state and not state.worn()):
                return
            if background:
                self._thread = threading.Thread(
                    target=self._build_thread, args=(True,), name="memd-postings", daemon=True
                )
                self._thread.start()
                return
        self._build_thread(False)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a build that runs; whether the postings are ready."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.ready

    def close(self) -> None:
        """Stop a build that runs and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join()

    def _build_thread(self, elsewhere: bool) -> None:
        """Build here, or (``elsewhere``, with the file's path) in a process of its own."""
        t0 = time.monotonic()
        try:
            if elsewhere and self._path is not None:
                state = build_elsewhere(self._path, self._stop)
                with self._open_reader() as conn:
                    self._catch_up(conn, state)
            else:
                with self._open_reader() as conn:
                    state = Postings.build(conn, self._stop)
                    self._catch_up(conn, state)
        except Stopped:
            return
        except Mismatch as exc:
            self.error = str(exc)
            logger.error("keyword postings not used, FTS5 ranks instead: %s", exc)
            return
        except Exception:
            if self._stop.is_set():
                return  # the build process was stopped with its index
            logger.exception("keyword postings could not be built; FTS5 ranks instead")
            return
        with self._lock:
            self._state = state
            self.builds += 1
        self.built_seconds = time.monotonic() - t0
        logger.info(
            "keyword postings: %d chunks, %d terms, %.1f MB, built in %.1f s",
            state.alive,
            len(state.vocab),
            state.nbytes / 2**20,
            self.built_seconds,
        )
        release_memory()  # the build's batches are garbage: hand the heap back

    def _catch_up(self, conn: apsw.Connection, state: Postings) -> None:
        """Apply to a new build the rows logged while it was built."""
        with self._lock:
            state.apply_log(conn)

    # -- following the file -----------------------------------------------------------------------

    def refresh(self, conn: apsw.Connection) -> Postings | None:
        """Apply the log rows past the last applied, in ``conn``'s snapshot; the state to rank
        with, or None (not built, or the log was trimmed past it: built again meanwhile)."""
        with self._lock:
            state = self._state
            if state is None:
                return None
            if trimmed(conn) > state.seq:
                logger.info("fts_log trimmed past the keyword postings: building them again")
                self._state = None
                stale = True
            else:
                stale = False
        if stale:
            self.build(background=True)
            return None
        with self._lock:
            state.apply_log(conn)
            return state

    def trim_log(self, conn: apsw.Connection) -> None:
        """Delete the log rows the postings have applied (every row when none are kept and
        none are being built); the writer calls it after a sync. Nothing to delete: no write."""
        with self._lock:
            if self._building:
                return
            state = self._state
            if state is not None:
                upto = state.seq
            else:
                row = conn.execute("SELECT max(seq) FROM fts_log").fetchone()
                upto = int(row[0]) if row and row[0] is not None else 0
            if upto > trimmed(conn):
                with atomic(conn):
                    conn.execute("DELETE FROM fts_log WHERE seq <= ?", (upto,))
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (LOG_TRIMMED_KEY, str(upto)),
                    )

    # -- searching --------------------------------------------------------------------------------

    def doc_freqs(
        self, conn: apsw.Connection, terms: list[str]
    ) -> tuple[dict[str, int], int] | None:
        """How many chunks hold each term's first token, and the chunk count (as fts5vocab
        counts them), or None when the postings are not built."""
        state = self.refresh(conn)
        if state is None:
            return None
        tok = tokenizer(conn)
        out: dict[str, int] = {}
        with self._lock:
            for term in terms:
                tokens = _tokens(tok, term)
                if tokens:
                    t = state.vocab.get(tokens[0])
                    out[term] = 0 if t is None else len(state.run(None, t)[0])
            return out, state.alive

    def top(self, conn: apsw.Connection, match: str, k: int) -> Ranked | None:
        """The ``k`` best chunks for ``match`` (phrases joined by `` OR ``), best first, as
        FTS5 ranks them, or None when the postings cannot answer it."""
        phrases: list[tuple[str | None, str]] = []
        for part in match.split(" OR "):
            m = PHRASE.match(part)
            if m is None:
                return None
            phrases.append((m.group(1), m.group(2)))
        state = self.refresh(conn)
        if state is None:
            return None
        tok = tokenizer(conn)
        lists = []
        with self._lock:  # the postings as they stand: a refresh replaces, never rewrites them
            for kind, text in phrases:
                tokens = _tokens(tok, text)
                if len(tokens) != 1:
                    return None  # a phrase of several tokens (or none): FTS5 matches it
                t = state.vocab.get(tokens[0])
                if t is None:
                    continue
                rows, weights = state.run(kind, t)
                if len(rows):
                    fmax = state.fmax[t] if kind is None else float(weights.max())
                    dmin = state.dmin[t] if kind is None else float(state.lengths[rows].min())
                    lists.append((rows, weights, float(fmax), float(dmin)))
            alive, total, lengths, ids = state.alive, state.total, state.lengths, state.ids
            count = state.count
        if not lists or not alive:
            return []
        return rank_postings(lists, alive, total, lengths, ids, count, k)


def _tokens(tok: apsw.FTS5Tokenizer, text: str) -> list[str]:
    return [
        str(t)
        for t in tok(
            text.encode(),
            apsw.FTS5_TOKENIZE_QUERY,
            None,
            include_offsets=False,
            include_colocated=False,
        )
    ]
