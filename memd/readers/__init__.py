"""Reader processes: searches that run beside the daemon, each process with a GIL of its own.

A search is mostly SQLite and numpy, which let go of the GIL, and partly Python (ranking,
snippets), which does not. In one process, 16 sessions searching at once took turns at the
GIL: keyword search served no more searches a second with 16 clients than with one. A few
processes that open the index read-only and run the same search code give reads the other
cores (docs/benchmarks.md has the figures).

The daemon stays the only writer and the only owner of the embedder: a reader that needs a
query's vector asks for it over its pipe, and the daemon sends it back. So with keyword
ranking: the daemon's keyword postings (memd/index/keywords.py, 78 MB at 100,000 chunks) are
built once, and a reader asks them for a query's document frequencies and its best chunk ids
(a few milliseconds of the daemon's time at that size, against tens for FTS5's ranking in the
reader); the reader reads and finishes the rows. An index of up to ``ASK_POSTINGS_ABOVE``
chunks is ranked by FTS5 in the reader: there the round trip costs more than the ranking. A
search reads a snapshot opened after the request arrived, so read-your-writes holds as in the
daemon. Each reader keeps its own vector sketch, in step through ``vector_log`` like the daemon's; the writer trims that log no further
than the sketches that have reported (memd/index/index.py), and a sketch that finds the log
trimmed past it loads again (memd/index/sketch.py).

Readers are used when searches overlap: one search at a time runs in the daemon, as it always
did, and costs no process. A search that finds another in flight goes to an idle reader that
has the index open; when none has, one is started or opened in the background and the search
runs in the daemon meanwhile, so no search waits for a reader to start. When every reader is
busy the search waits for one, unless none comes back for ``READER_WAIT_S``: then it runs in
the daemon. No reader waits for the model: a search whose query vector is
not ready (the model is busy with documents) gives its reader back and waits for the vector
first; else keyword searches would queue behind it. When the daemon goes quiet
(memd/daemon/) the readers exit.
A reader that dies or stops answering is replaced, and its search runs in the daemon; after
FAILURES_MAX deaths in a row the pool stops using readers and status says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import apsw
import numpy as np

from memd import frames
from memd.embed.base import Embedder, Vectors
from memd.index.index import Index
from memd.index.keywords import KeywordRanker
from memd.readers.reader import Reader, ReaderDied
from memd.search import search
from memd.search.hits import SearchOutcome
from memd.search.options import SearchOptions
from memd_client import errors

__all__ = ["ReaderPool"]

logger = logging.getLogger(__name__)

# How long a search waits, with every reader busy, for one of them to come back before it runs
# in the daemon instead. Several searches' worth of a reader's time: readers that keep coming
# back are a queue worth waiting in (the daemon would take the searches to its own GIL), but
# a reader the scheduler does not run, or one stopped, is not waited for longer than this.
READER_WAIT_S = 0.05
# A reader asks the daemon's keyword postings to rank only for an index of more chunks than
# this: below, FTS5 ranks a query in the reader in well under a millisecond, less than the
# round trip to the daemon and a turn at its GIL (at 391 chunks, 16 clients got half the
# searches a second asking); above, the postings win (97,501 chunks: 2 ms against 21).
ASK_POSTINGS_ABOVE = 2000
FAILURES_MAX = 3  # deaths in a row (without one answered search) before readers are given up


class ReaderPool:
    """Up to ``size`` reader processes for the daemon's searches (0: every search in the daemon)."""

    def __init__(self, size: int) -> None:
        self.size = max(0, size)
        self._cond = threading.Condition()
        self._readers: list[Reader] = []
        self._ids = itertools.count(1)
        self._inflight = 0
        self._closed = False
        self._opening: set[threading.Thread] = set()
        self._failures = 0  # deaths since the last answered search
        self.failed: str | None = None
        self.searches = 0  # answered by a reader
        self.in_daemon = 0  # run in the daemon
        self.waited_out = 0  # of those, after READER_WAIT_S without a reader coming back
        self._returned_at = 0.0  # when a reader last came back from a search
        self.ranked = 0  # keyword rankings of readers' searches by the daemon's postings
        self.deaths = 0
        self.last_exit: str | None = None

    # -- searching ------------------------------------------------------------------------------

    def search(
        self, index: Index, query: str, options: SearchOptions, embedder: Embedder | None
    ) -> SearchOutcome:
        """``memd.search.search`` of ``query``, in a reader when searches overlap."""
        with self._cond:
            self._inflight += 1
        try:
            started = None
            reader = self._take(index)
            if reader is not None and embedder and options.mode != "keyword" and query.strip():
                started = embedder.start_query(query.strip())
            if reader is not None and started is not None and not started.done():
                # A reader never waits for the model (busy with documents, it can take
                # seconds): keyword searches would queue behind the readers held so. The
                # vector first, then a reader.
                self._give_back(reader, answered=False)
                started.result()  # raises ProviderUnavailable past the query timeout
                reader = self._take(index)
            if reader is not None:
                try:
                    outcome = self._remote(reader, index, query, options, embedder, started)
                except ReaderDied as exc:
                    self._died(reader, str(exc))
                except BaseException:
                    self._give_back(reader, answered=True)  # a typed error is an answer too
                    raise
                else:
                    self._give_back(reader, answered=True)
                    return outcome
            with self._cond:
                self.in_daemon += 1
            return search(index, query, options, embedder=embedder, started=started)
        finally:
            with self._cond:
                self._inflight -= 1

    def _take(self, index: Index) -> Reader | None:
        """A reader to run this search, or None to run it in the daemon."""
        key = index.token
        since: float | None = None  # when this search began to wait for a reader
        with self._cond:
            while True:
                if self._closed or self.failed or not self.size:
                    return None
                idle = [r for r in self._readers if not r.busy]
                ready = next((r for r in idle if key in r.opened), None)
                if ready is not None:
                    ready.busy = True
                    return ready
                if self._inflight < 2:
                    return None  # the only search: it runs here, and no reader is needed
                if idle:
                    idle[0].busy = True
                    self._background(idle[0], index)
                    return None
                if len(self._readers) < self.size:
                    reader = Reader.start(next(self._ids))
                    self._readers.append(reader)
                    self._background(reader, index)
                    return None
                if not any(key in r.opened for r in self._readers):
                    return None  # every reader busy, none with this index: not worth a wait
                # Wait while the readers get through their searches; when none has come
                # back for READER_WAIT_S (held by the scheduler, stopped), the daemon runs it.
                now = time.monotonic()
                since = now if since is None else since
                stalled = now - max(since, self._returned_at)
                if stalled >= READER_WAIT_S:
                    self.waited_out += 1
                    return None
                self._cond.wait(READER_WAIT_S - stalled)

    def _background(self, reader: Reader, index: Index) -> None:
        thread = threading.Thread(
            target=self._open, args=(reader, index), name="memd-reader-open", daemon=True
        )
        self._opening.add(thread)
        thread.start()

    def _open(self, reader: Reader, index: Index) -> None:
        """Have ``reader`` open ``index`` and load its sketch; then it takes searches."""
        try:
            reader.send({"op": "open", "index": _spec(index)})
            reply = reader.receive()
            if "error" in reply:
                logger.warning("reader %d cannot open %s: %s", reader.ident, index.path, reply)
            else:
                self._note(reader, index, reply)
                reader.opened.add(index.token)
        except ReaderDied as exc:
            self._died(reader, str(exc))
        else:
            self._give_back(reader, answered=False)
        finally:
            with self._cond:
                self._opening.discard(threading.current_thread())

    def _remote(
        self,
        reader: Reader,
        index: Index,
        query: str,
        options: SearchOptions,
        embedder: Embedder | None,
        started: Future[Vectors] | None,
    ) -> SearchOutcome:
        # Shallow: every field is immutable (asdict's deep copy was 3 % of the daemon's GIL).
        values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
        if values["sources"] is not None:
            values["sources"] = list(values["sources"])
        # A swap waits for this search, as for one in the daemon; the connection is the
        # daemon's, for the keyword postings the reader asks to rank with.
        postings = index.keywords
        asks = postings.ready and postings.chunks > ASK_POSTINGS_ABOVE
        with index.reader() as store:
            keywords = store.reads.keywords
            reader.send(
                {
                    "op": "search",
                    "index": _spec(index),
                    "query": query,
                    "options": values,
                    "embedder": embedder.settings_key if embedder is not None else None,
                    "keywords": asks,
                }
            )
            while True:
                reply = reader.receive()
                if "embed" in reply:
                    assert embedder is not None
                    future = started or embedder.start_query(str(reply["embed"]))
                    started = None
                    try:
                        vector = future.result()
                    except errors.ProviderUnavailable as exc:
                        reader.send({"embed_error": str(exc)})
                    else:
                        reader.send({"vector": np.asarray(vector, dtype=np.float32).tobytes()})
                elif "freqs" in reply or "rank" in reply:
                    reader.send(self._keywords(store.conn, keywords, reply))
                else:
                    break
            self._note(reader, index, reply)
        frames.raise_error(reply)
        return _outcome(reply["ok"])

    def _keywords(
        self, conn: apsw.Connection, keywords: KeywordRanker | None, ask: dict[str, Any]
    ) -> dict[str, Any]:
        """A reader's question to the daemon's keyword postings, answered; None when they
        cannot answer (the reader's FTS5 ranks then), and never an exception: the reader
        waits for an answer."""
        try:
            if "freqs" in ask:
                counted = keywords.doc_freqs(conn, list(ask["freqs"])) if keywords else None
                return {"freqs": None if counted is None else list(counted)}
            ranked = keywords.top(conn, str(ask["rank"]), int(ask["k"])) if keywords else None
        except Exception:
            logger.exception("keyword postings could not answer a reader; FTS5 ranks there")
            return {"freqs": None} if "freqs" in ask else {"ranked": None}
        if ranked is not None:
            with self._cond:
                self.ranked += 1
        return {"ranked": ranked}

    def _note(self, reader: Reader, index: Index, reply: dict[str, Any]) -> None:
        """Record the reader's sketch position, which bounds the writer's trim of the log."""
        seq = reply.get("seq")
        if seq is not None and reply.get("token") == index.token:
            index.note_remote_sketch(reader.ident, int(seq))
            reader.indexes[str(index.path)] = index

    def _give_back(self, reader: Reader, *, answered: bool) -> None:
        with self._cond:
            reader.busy = False
            self._returned_at = time.monotonic()
            if answered:
                self.searches += 1
                self._failures = 0
            if self._closed:
                self._drop(reader)
            # One reader came back: one waiting search can have it. Waking every waiter (16
            # sessions' worth) to find one reader cost the daemon a fifth of its GIL under load.
            self._cond.notify()
        if self._closed:
            reader.stop()

    def _died(self, reader: Reader, cause: str) -> None:
        reader.kill()
        with self._cond:
            self._drop(reader)
            self.deaths += 1
            self._failures += 1
            self.last_exit = cause
            if self._failures >= FAILURES_MAX and not self.failed:
                self.failed = f"{self._failures} reader processes died in a row (last: {cause})"
                logger.error("searches run in the daemon from now: %s", self.failed)
            self._cond.notify_all()
        logger.warning(
            "reader process %d ended (%s); its search ran in the daemon", reader.ident, cause
        )
        with contextlib.suppress(ReaderDied, OSError, ValueError):
            reader.stop()

    def _drop(self, reader: Reader) -> None:
        if reader in self._readers:
            self._readers.remove(reader)

    # -- lifecycle ------------------------------------------------------------------------------

    def resize(self, size: int) -> None:
        """Use up to ``size`` readers from now (a config reload): the idle ones stop, and
        readers start again as searches need them."""
        self.size = max(0, size)
        self.stop_idle()

    def stop_idle(self) -> int:
        """Stop the readers that are not running anything (the daemon is quiet); how many."""
        with self._cond:
            idle = [r for r in self._readers if not r.busy]
            for reader in idle:
                self._drop(reader)
        for reader in idle:
            reader.stop()
        return len(idle)

    def close(self) -> None:
        """Stop every reader; one running a search stops when it has answered."""
        with self._cond:
            self._closed = True
            opening = list(self._opening)
        for thread in opening:
            thread.join()
        self.stop_idle()

    def health(self) -> dict[str, Any]:
        """The pool as status shows it."""
        with self._cond:
            running = [r.proc.pid for r in self._readers]
            busy = sum(r.busy for r in self._readers)
        return {
            "processes": self.size,
            "running": len(running),
            "busy": busy,
            "pids": running,
            "searches": self.searches,
            "in_daemon": self.in_daemon,
            "waited_out": self.waited_out,
            "ranked_by_daemon": self.ranked,
            "deaths": self.deaths,
            "last_exit": self.last_exit,
            "error": self.failed,
        }


def _spec(index: Index) -> dict[str, Any]:
    return {"path": str(index.path), "token": index.token, "use_vec": index.use_vec}


def _outcome(ok: dict[str, Any]) -> SearchOutcome:
    return SearchOutcome.from_reply(ok)
