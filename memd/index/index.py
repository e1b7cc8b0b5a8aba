"""Index: one workspace's database file, its writer, a pool of readers and the atomic swap."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import apsw

from memd.atomicfile import fsync_dir
from memd.index.db import VecSupport, connect, probe_sqlite_vec, translate_errors
from memd.index.identity import Identity
from memd.index.keywords import KeywordIndex, KeywordRanker
from memd.index.schema import migrate
from memd.index.sketch import Sketch
from memd.index.store import Store, VectorStore

# Read connections open at once per index. Each holds a page cache of its own (2 MB), and on
# a machine of a few cores more concurrent readers only queue for the CPU: 64 sessions
# searching at once share these instead of growing the daemon by a connection each.
MAX_READERS = max(4, 4 * (os.cpu_count() or 1))

# An index of at most this many chunk ids has its keyword postings built on the writer's thread
# (a few tenths of a second), so they serve from its first search; a larger one in the background.
POSTINGS_AT_ONCE = 2000

# A reader process's sketch holds back the trim of the vector log for this long after its last
# report; past it the log is trimmed without it (it then loads again, memd/index/sketch.py).
REMOTE_SKETCH_TTL_S = 300.0

__all__ = ["Index", "reads_first"]

_first = threading.local()


def reads_first() -> None:
    """Let the calling thread (the writer) read without queueing for the readers the searches
    share: under 64 sessions the writer waited there for most of a bulk edit."""
    _first.on = True


logger = logging.getLogger(__name__)


class _SharedLock:
    """Many readers or one exclusive holder (the swap); the swap waits for readers to finish."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class Index:
    """The database file of one workspace.

    One writer connection (used by one thread at a time: the caller serialises writes) and a
    pool of at most MAX_READERS read-only connections. :meth:`swap_in` replaces the whole file atomically with a
    database built elsewhere, waiting for readers in flight and reopening everything.
    """

    TEMP_MARK = ".tmp-"

    def __init__(self, path: Path, *, use_vec: bool = True) -> None:
        self.path = path
        self.use_vec = use_vec
        self.vec: VecSupport = (
            probe_sqlite_vec()
            if use_vec
            else VecSupport(False, error="disabled by configuration (index.sqlite_vec = false)")
        )
        self._lock = _SharedLock()
        self._pool: list[apsw.Connection] = []
        self._readers = threading.BoundedSemaphore(MAX_READERS)
        self._pool_lock = threading.Lock()
        self._writer: apsw.Connection | None = None
        self.epoch = 0
        # Names this file for reader processes (memd/readers), which keep files open: a new
        # one after each swap, and another for an index created again at the same path.
        self.token = uuid.uuid4().hex
        # The vectors of a plain vector store, in memory (memd/index/sketch.py); one per file:
        # a swapped-in file gets a new one.
        self._sketch: Sketch | None = None
        # The FTS index's terms in memory (memd/index/keywords.py), built after the first sync;
        # one per file, as the sketch.
        self._keywords = KeywordIndex(self._connection, self.path)
        self._ranker: KeywordRanker | None = None  # another's postings (rank_with)
        # Where the sketches of reader processes (memd/readers) stand in the vector log:
        # reader -> (last row applied, when reported). The writer trims no further.
        self._remote: dict[int, tuple[int, float]] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Remove leftovers of an interrupted rebuild, open the writer and migrate the schema."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.remove_temp_files()
        with translate_errors(f"index {self.path}"):
            self._writer = connect(self.path, load_vec=self.vec.available)
            migrate(self._writer)

    def close(self) -> None:
        self._keywords.close()
        with self._lock.exclusive():
            self._close_all()
            self._keywords = KeywordIndex(self._connection, self.path)  # for a file opened again

    def _close_all(self) -> None:
        with self._pool_lock:
            for conn in self._pool:
                conn.close()
            self._pool.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def remove_temp_files(self) -> list[Path]:
        removed = []
        for p in self.path.parent.glob(self.path.name + self.TEMP_MARK + "*"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
        if removed:
            logger.info("removed %d leftover file(s) of an interrupted rebuild", len(removed))
        return removed

    # -- stores ---------------------------------------------------------------------------------

    def _store(self, conn: apsw.Connection) -> Store:
        identity = self.stored_identity(conn)
        kind: VectorStore = identity.vector_store if identity else "none"
        if kind == "vec0" and not self.vec.available:
            kind = "none"  # the vectors are there but unreadable without the extension
        dims = identity.dims if identity else 0
        sketch = self._sketch_for(dims) if kind == "plain" else None
        return Store(conn, kind, dims, sketch, self._ranker or self._keywords)

    def rank_with(self, ranker: KeywordRanker) -> None:
        """Rank keyword searches with ``ranker`` instead of postings of this process's own: a
        reader process asks the daemon's (memd/readers/host.py), built once, not per process."""
        self._ranker = ranker

    def _sketch_for(self, dims: int) -> Sketch:
        with self._pool_lock:
            if self._sketch is None or self._sketch.dims != dims:
                self._sketch = Sketch(dims)
            return self._sketch

    def tend(self) -> None:
        """After a sync (the writer's): build the keyword postings if they are not (at once
        for a small index, else in the background: FTS5 ranks meanwhile), apply the sync's
        rows to them here rather than in the next search, and drop the log rows they have
        applied; then the vector sketch."""
        with self.reader() as store:
            row = store.conn.execute("SELECT max(id) FROM chunks").fetchone()
            small = not row or row[0] is None or int(row[0]) <= POSTINGS_AT_ONCE
        self._keywords.build(background=not small)
        with self.reader() as store:
            self._keywords.refresh(store.conn)
        if self._writer is not None:
            self._keywords.trim_log(self._writer)
        self.tend_sketch()

    @property
    def keywords(self) -> KeywordIndex:
        return self._keywords

    @contextlib.contextmanager
    def _connection(self) -> Iterator[apsw.Connection]:
        with self.reader() as store:
            yield store.conn

    def tend_sketch(self) -> None:
        """After a sync (the writer's): load the vector sketch if it is not yet (so the first
        search does not pay for it), and drop the vector-log rows every sketch has applied."""
        with self.reader() as store:
            sketch = store.reads.sketch
            if sketch is None:
                return
            sketch.refresh(store.conn)
        if self._writer is not None:
            sketch.trim_log(self._writer, self._trim_floor(sketch.seq))

    def loaded_sketch(self) -> Sketch | None:
        sketch = self._sketch
        return sketch if sketch is not None and sketch.loaded else None

    def note_remote_sketch(self, reader: int, seq: int) -> None:
        """A reader process's sketch of this file has applied the log up to ``seq``."""
        with self._pool_lock:
            self._remote[reader] = (seq, time.monotonic())

    def forget_remote_sketch(self, reader: int) -> None:
        with self._pool_lock:
            self._remote.pop(reader, None)

    def _trim_floor(self, seq: int) -> int:
        """How far the log may be trimmed: to the slowest sketch that reported lately. A reader
        silent longer than REMOTE_SKETCH_TTL_S does not hold the log back: if it searches again
        it finds the log trimmed past it and loads its sketch anew."""
        now = time.monotonic()
        with self._pool_lock:
            recent = [s for s, at in self._remote.values() if now - at < REMOTE_SKETCH_TTL_S]
        return min([seq, *recent])

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold off a swap while a reader process reads this file (as :meth:`reader` does)."""
        with self._lock.shared():
            yield

    @staticmethod
    def stored_identity(conn: apsw.Connection) -> Identity | None:
        data = Store(conn, "none", 0).identity()
        return None if data is None else Identity.from_dict(data)

    def writer(self) -> Store:
        """The write store; only the single writer may use it."""
        if self._writer is None:
            raise RuntimeError("index is not open")
        return self._store(self._writer)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Store]:
        """A read-only store from the pool (waiting while MAX_READERS are out, unless the thread
        reads first), returned to it afterwards."""
        with (
            contextlib.nullcontext() if getattr(_first, "on", False) else self._readers,
            self._lock.shared(),
        ):
            with self._pool_lock:
                conn = self._pool.pop() if self._pool else None
            if conn is None:
                with translate_errors(f"index {self.path}"):
                    conn = connect(self.path, load_vec=self.vec.available, readonly=True)
            try:
                yield self._store(conn)
            finally:
                with self._pool_lock:
                    self._pool.append(conn)

    def release_memory(self) -> None:
        """Free the page caches of the idle readers (up to 2 MB each after a burst of
        searches); one in use keeps its own. The pages are read back from the OS's cache."""
        with self._pool_lock:
            idle, self._pool = self._pool, []
        try:
            for conn in idle:
                conn.release_memory()
        finally:
            with self._pool_lock:
                self._pool.extend(idle)

    # -- rebuild --------------------------------------------------------------------------------

    def temp_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}{self.TEMP_MARK}{uuid.uuid4().hex[:12]}")

    def open_temp(self, path: Path) -> apsw.Connection:
        """Open a fresh database at ``path`` for a rebuild, with the schema in place."""
        conn = connect(path, load_vec=self.vec.available)
        migrate(conn)
        return conn

    def swap_in(self, temp: Path) -> None:
        """Atomically replace the index file with ``temp`` (a closed, complete database)."""
        self._keywords.close()  # a build in progress reads the file being replaced
        with self._lock.exclusive():
            self._close_all()
            # With every connection closed SQLite has checkpointed and removed -wal/-shm; if one
            # survived (a crash, an outside reader) it belongs to the old file: move it aside so
            # it is never replayed into the new one.
            stamp = f".old-{int(time.time())}"
            for suffix in ("-wal", "-shm"):
                side = Path(str(self.path) + suffix)
                if side.exists():
                    side.rename(Path(str(temp) + suffix + stamp))
            os.replace(temp, self.path)
            fsync_dir(self.path.parent)
            with translate_errors(f"index {self.path}"):
                self._writer = connect(self.path, load_vec=self.vec.available)
                migrate(self._writer)
            self.epoch += 1
            self.token = uuid.uuid4().hex
            self._sketch = None
            self._keywords = KeywordIndex(self._connection, self.path)
            with self._pool_lock:
                self._remote.clear()
        self.remove_temp_files()
