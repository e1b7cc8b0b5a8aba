"""The recall store's file (``short-term-recall.json`` in the workspace's dreaming folder,
memd/dreams/place.py) as a whole: where it lives, its lock, reading it (a corrupt file
quarantined and ``.prev`` used instead, a store OpenClaw archived taken back once) and
replacing it atomically, keeping the previous copy.

Its own module: the protocol that keeps the file whole under concurrent writers, apart from
what is counted into it (memd/dreams/recall_store.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from memd.atomicfile import write_atomic
from memd.clock import Clock
from memd.dreams.place import DreamPlace
from memd.dreams.recall_entry import RecallEntry, iso_time, merged_entry
from memd.dreams.recall_lock import file_lock

__all__ = [
    "ABSORBED_NAME",
    "ARCHIVE_NAME",
    "LOCK_NAME",
    "STORE_NAME",
    "TMP_MAX_AGE_S",
    "OwnWrite",
    "RecallFile",
    "entry_line",
]

logger = logging.getLogger(__name__)

TMP_MAX_AGE_S = 3600.0

STORE_NAME = "short-term-recall.json"
LOCK_NAME = "short-term-promotion.lock"
# OpenClaw's state migration (memory-core's doctor, which runs even when memd holds the memory
# slot) moves this store into its own database and renames the file to this; memd takes the
# entries back once (by content digest, listed in ABSORBED_NAME).
ARCHIVE_NAME = STORE_NAME + ".migrated"
ABSORBED_NAME = "absorbed-archives.json"


def entry_line(key: str, entry: RecallEntry) -> str:
    return (
        json.dumps(key, ensure_ascii=False) + ": " + json.dumps(entry.to_json(), ensure_ascii=False)
    )


def store_text(updated_at: str, lines: Iterable[str]) -> str:
    """The store file, one entry per line (see entry_line). json.dumps with ``indent`` runs
    the pure-Python encoder, several times slower than the C one a line at a time uses; a
    store of thousands of entries is rewritten often, by a thread sharing the GIL with
    searches."""
    body = ",\n    ".join(lines)
    head = f'{{\n  "version": 1,\n  "updatedAt": {json.dumps(updated_at)},\n  "entries": {{'
    return head + (f"\n    {body}\n  }}\n}}\n" if body else "}\n}\n")


@dataclass
class OwnWrite:
    """What record_many keeps between calls: the entries as in the store file with this stat
    signature (inode, size, mtime_ns), and each entry's serialised line."""

    signature: tuple[int, int, int] | None
    entries: dict[str, RecallEntry]
    lines: dict[str, str]


class RecallFile:
    """The recall store file of the workspace at ``root``; every write happens under
    ``locked()``."""

    def __init__(
        self,
        root: Path,
        *,
        folder: Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.root = Path(root)
        self.dir = Path(folder) if folder is not None else DreamPlace.inside(self.root).folder
        self.path = self.dir / STORE_NAME
        self.prev_path = self.dir / (STORE_NAME + ".prev")
        self.lock_path = self.dir / LOCK_NAME
        self.clock = clock or Clock()
        # The entries as in the store file with this stat signature, as record_many last left
        # them: the recorder updates the store many times a minute and need not re-parse its
        # own writes. Anyone else's write (a new inode, by atomic replace) makes it stale.
        self._own: OwnWrite | None = None

    # -- locking ---------------------------------------------------------------------------------

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the store's lock (re-entrant within a thread); raise Busy after LOCK_TIMEOUT_S."""
        return file_lock(self.lock_path)

    # -- reading and writing ---------------------------------------------------------------------

    def load(self) -> dict[str, RecallEntry]:
        """Read and normalise the store; a corrupt file is quarantined and ``.prev`` used instead."""
        if (self.dir / ARCHIVE_NAME).exists():
            self._absorb_archive()
        data = self._read(self.path)
        if data is not None:
            return data
        if not self.path.exists():
            return {}
        with self.locked():  # quarantine only under the lock, after a second look
            data = self._read(self.path)
            if data is not None or not self.path.exists():
                return data or {}
            bad = self.dir / f"{STORE_NAME}.corrupt-{int(time.time() * 1000)}"
            logger.warning("recall store %s does not parse; moved to %s", self.path, bad.name)
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, bad)
            prev = self._read(self.prev_path)
            if not prev:
                logger.warning("no usable %s: starting an empty recall store", self.prev_path.name)
                return {}
            write_atomic(self.path, self.prev_path.read_bytes())  # restore the last good
            return prev

    def _absorb_archive(self) -> None:
        """Take back the entries of a store OpenClaw archived (see ARCHIVE_NAME), once."""
        archive, ledger = self.dir / ARCHIVE_NAME, self.dir / ABSORBED_NAME
        with self.locked():
            try:
                digest = hashlib.sha256(archive.read_bytes()).hexdigest()
                absorbed = json.loads(ledger.read_bytes()) if ledger.exists() else []
            except (OSError, ValueError) as exc:
                logger.warning("cannot take back %s: %s", archive, exc)
                return
            if not isinstance(absorbed, list) or digest in absorbed:
                return
            archived = self._read(archive)
            current = self._read(self.path)
            if archived is None or (current is None and self.path.exists()):
                return  # an unreadable side: leave both as they are
            merged = dict(current or {})
            for key, entry in archived.items():
                merged[key] = merged_entry(merged[key], entry) if key in merged else entry
            self.save(merged)
            write_atomic(ledger, (json.dumps([*absorbed, digest]) + "\n").encode())
            logger.info(
                "recall store of %s: took back %d entries from %s (moved there by OpenClaw)",
                self.root,
                len(archived),
                ARCHIVE_NAME,
            )

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self, path: Path) -> dict[str, RecallEntry] | None:
        """The entries of one store file; {} if missing, None if it does not parse."""
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            return {} if path == self.prev_path else None
        except (OSError, ValueError) as exc:
            logger.debug("reading %s failed: %s", path, exc)
            return None
        if not isinstance(raw, dict) or raw.get("version") != 1:
            return None
        entries = raw.get("entries")
        if not isinstance(entries, dict):
            return None
        out: dict[str, RecallEntry] = {}
        for key, value in entries.items():
            entry = RecallEntry.from_json(value, key)
            if entry is not None:
                out[entry.key] = entry
        return out

    def save(self, entries: Mapping[str, RecallEntry]) -> None:
        """Replace the store atomically (temp file, fsync, rename, fsync dir), keeping ``.prev``."""
        self._save((entry_line(k, e) for k, e in entries.items()), current_parses=False)

    def _save(self, lines: Iterable[str], *, current_parses: bool) -> None:
        """Write the store, the file it replaces kept as ``.prev`` when it parses. A file this
        process wrote and nobody replaced since (``current_parses``) becomes ``.prev`` by a
        hard link, not a copy: a store of 10,000 entries is 8.7 MB, and copying it at every
        rewrite doubled the recorder's writes."""
        self._own = None
        with self.locked():
            text = store_text(iso_time(self.clock.now()), lines)
            if not (current_parses and self._link_prev()):
                try:
                    current = self.path.read_bytes()
                    if not current_parses:
                        json.loads(current)
                except (OSError, ValueError):
                    current = None  # missing or not good: never copied over the last good .prev
                if current is not None:
                    write_atomic(self.prev_path, current)
            write_atomic(self.path, text.encode("utf-8"))

    def _link_prev(self) -> bool:
        """Make the store file ``.prev`` too (a second name, swapped in whole); False when
        the file system refuses links, or the file is gone."""
        tmp = self.dir / f".{self.prev_path.name}.tmp-link-{os.getpid()}"
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.link(self.path, tmp)
            os.replace(tmp, self.prev_path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        return True

    def cleanup(self, max_age_s: float = TMP_MAX_AGE_S) -> int:
        """Remove temp files older than ``max_age_s`` left by a crashed save; return how many."""
        removed = 0
        now = time.time()
        for tmp in self.dir.glob(f".{STORE_NAME}*.tmp-*") if self.dir.is_dir() else ():
            try:
                if now - tmp.stat().st_mtime > max_age_s:
                    tmp.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
