"""SQLite connections through apsw: pragmas, sqlite-vec loading and the atomic() transaction."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from memd_client.errors import IndexError_

__all__ = [
    "VecSupport",
    "atomic",
    "connect",
    "probe_sqlite_vec",
    "select_in",
    "translate_errors",
]

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
IN_BATCH = 500  # ids per "IN (...)" list: well under SQLite's limit on bound parameters


@dataclass(frozen=True)
class VecSupport:
    """Whether sqlite-vec loads here, its version, and why not when it does not."""

    available: bool
    version: str = ""
    path: str = ""
    error: str = ""


_probe_lock = threading.Lock()
_probe: VecSupport | None = None


def probe_sqlite_vec() -> VecSupport:
    """Load sqlite-vec into a scratch connection once and check it registers its functions."""
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = _try_load(apsw.Connection(":memory:"), close=True)
        return _probe


def _try_load(conn: apsw.Connection, *, close: bool = False) -> VecSupport:
    try:
        import sqlite_vec
    except ImportError as exc:
        return VecSupport(False, error=f"the sqlite-vec package is not installed ({exc})")
    path = sqlite_vec.loadable_path()
    try:
        conn.enable_load_extension(True)
        try:
            conn.load_extension(path)
        finally:
            conn.enable_load_extension(False)
        # An ABI mismatch can load the library yet register nothing: ask it for its version.
        row = conn.execute("SELECT vec_version()").fetchone()
        return VecSupport(True, version=str(row[0]) if row else "?", path=path)
    except apsw.Error as exc:
        return VecSupport(False, path=path, error=f"cannot load sqlite-vec from {path}: {exc}")
    finally:
        if close:
            conn.close()


def connect(path: Path | str, *, load_vec: bool, readonly: bool = False) -> apsw.Connection:
    """Open ``path`` in WAL mode with memd's pragmas; load sqlite-vec when asked and possible."""
    conn = apsw.Connection(str(path))
    try:
        conn.setbusytimeout(BUSY_TIMEOUT_MS)
        if not readonly:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA journal_size_limit=67108864")
        if readonly:
            conn.execute("PRAGMA query_only=1")
        if load_vec:
            support = _try_load(conn)
            if not support.available:
                logger.warning("%s", support.error)
    except apsw.Error as exc:
        conn.close()
        raise IndexError_(f"cannot open index {path}: {exc}") from None
    return conn


@contextlib.contextmanager
def snapshot(conn: apsw.Connection) -> Iterator[None]:
    """One read transaction for several statements (or the caller's, if one is open)."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


_depth = threading.local()


@contextlib.contextmanager
def atomic(conn: apsw.Connection) -> Iterator[None]:
    """Run the block in one write transaction (``BEGIN IMMEDIATE``); nested use is a SAVEPOINT."""
    if conn.in_transaction:
        name = f"sp{id(conn)}_{getattr(_depth, 'n', 0)}"
        _depth.n = getattr(_depth, "n", 0) + 1
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            conn.execute(f"ROLLBACK TO {name}")
            conn.execute(f"RELEASE {name}")
            raise
        else:
            conn.execute(f"RELEASE {name}")
        finally:
            _depth.n -= 1
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    else:
        conn.execute("COMMIT")


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn SQLite failures (disk full, read-only, corrupt) into a typed IndexError_."""
    try:
        yield
    except apsw.FullError as exc:
        raise IndexError_(f"{what}: disk full ({exc})") from None
    except apsw.ReadOnlyError as exc:
        raise IndexError_(f"{what}: index is read-only ({exc})") from None
    except apsw.CorruptError as exc:
        raise IndexError_(f"{what}: index is corrupt ({exc}); run a rebuild") from None
    except (apsw.IOError, apsw.CantOpenError) as exc:
        raise IndexError_(f"{what}: I/O error ({exc})") from None


def select_in(
    conn: apsw.Connection, sql: str, ids: Sequence[int], params: Sequence[object] = ()
) -> Iterator[tuple[Any, ...]]:
    """The rows of ``sql`` for ``ids``, IN_BATCH at a time: ``{ids}`` in ``sql`` stands for
    the placeholders of one batch, and ``params`` are bound after them."""
    for start in range(0, len(ids), IN_BATCH):
        part = list(ids[start : start + IN_BATCH])
        yield from conn.execute(sql.format(ids=",".join("?" * len(part))), [*part, *params])
