"""Promotion into MEMORY.md: re-read each candidate's lines from its daily note and add them as one
dated, marker-tagged section, without ever losing a line a human wrote.

Over 400 lines: one write protocol from start to end (snapshot, re-read, append or swap,
settle), whose steps only make sense together.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path, PurePosixPath

from memd.atomicfile import append_whole, fsync, fsync_dir
from memd.dreams.ranking import Candidate
from memd.dreams.recall_store import RecallEntry, is_promotable
from memd_client.errors import PathRefused

__all__ = ["Applied", "PromotionResult", "apply_promotions", "rehydrate"]

logger = logging.getLogger(__name__)

MEMORY_FILE = "MEMORY.md"
FILE_HEADER = "# Long-Term Memory"
SECTION_TITLE = "Promoted From Short-Term Memory"
CAS_ATTEMPTS = 5
# After the swap, how long a writer that opened the old MEMORY.md may still write to it.
SALVAGE_GRACE_S = 0.02

_WS = re.compile(r"\s+")
_MARKER = re.compile(r"<!--\s*(?:memd|openclaw-memory)-promotion:(.+?)\s*-->")
_SECTION = re.compile(r"## Promoted From Short-Term Memory \((\d{4}-\d{2}-\d{2})\)")
_TOP_HEADING = re.compile(r"#{1,2}\s")  # a "# " or "## " line ends a promoted section
_TRAILING_BLANKS = re.compile(r"(?<=\n)(?:[ \t]*\r?\n)+\Z")  # blank lines at the end


@dataclass(frozen=True)
class Applied:
    """One entry written to MEMORY.md, with the lines and text it was rehydrated to."""

    key: str
    path: str
    start_line: int
    end_line: int
    text: str


@dataclass
class PromotionResult:
    """What one ``apply_promotions`` call did."""

    applied: list[Applied] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    dropped_sections: int = 0
    memory_path: str = ""


def _collapse(text: str) -> str:
    return _WS.sub(" ", text).strip()


def _source_rel(root: Path, path: str) -> str | None:
    """The workspace-relative file holding ``path``: as given, else ``memory/<basename>``."""
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute():
        try:
            p = PurePosixPath(Path(p).relative_to(root).as_posix())
        except ValueError:
            return None
    if ".." in p.parts or not p.name:
        return None
    for rel in dict.fromkeys((p.as_posix(), f"memory/{p.name}")):
        if (root / rel).is_file():
            return rel
    return None


def _locate(lines: list[str], want: str, start: int, end: int) -> tuple[int, int] | None:
    """Find the 1-based line range now holding ``want`` (whitespace-collapsed)."""
    n = len(lines)
    if 1 <= start <= end <= n and _collapse("\n".join(lines[start - 1 : end])) == want:
        return start, end
    span = max(1, end - start + 1)
    widest = max(span + 3, 8)
    flat = [_collapse(line) for line in lines]
    best: tuple[int, int, int] | None = None
    found: tuple[int, int] | None = None
    for i in range(n):
        text = ""
        for w in range(1, min(widest, n - i) + 1) if flat[i] else ():
            piece = flat[i + w - 1]
            if not piece:  # a window neither starts nor ends on a blank line
                continue
            text = f"{text} {piece}" if text else piece
            if text == want:
                quality = 3
            elif want in text:
                quality = 2
            elif text in want and 2 * len(text) >= len(want):
                # A fragment must still be most of the snippet, or any short line would match.
                quality = 1
            else:
                continue
            rank = (-quality, abs(i + 1 - start), abs(w - span))
            if best is None or rank < best:
                best, found = rank, (i + 1, i + w)
    return found


def _rehydrate(root: Path, entry: RecallEntry) -> tuple[str, int, int, str] | str:
    rel = _source_rel(root, entry.path)
    if rel is None:
        return f"source file not found: {entry.path}"
    try:
        lines = (root / rel).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"cannot read {rel}: {exc.strerror or exc}"
    want = _collapse(entry.snippet)
    if not want:
        return "empty snippet"
    span = _locate(lines, want, entry.start_line, entry.end_line)
    if span is None:
        return f"snippet no longer found in {rel}"
    text = "\n".join(lines[span[0] - 1 : span[1]])
    if not is_promotable(text):
        return "rehydrated text is not promotable"
    return rel, span[0], span[1], text


def rehydrate(root: Path, entry: RecallEntry) -> tuple[int, int, str] | str:
    """Re-read ``entry``'s lines from its source file: ``(start, end, text)`` or why not."""
    found = _rehydrate(root, entry)
    return found if isinstance(found, str) else found[1:]


def _section(day: date, items: Sequence[tuple[Candidate, Applied]], nl: str) -> str:
    out = ["", f"## {SECTION_TITLE} ({day.isoformat()})", ""]
    for cand, a in items:
        avg = cand.entry.total_score / max(1, cand.signal_count)
        out.append(f"<!-- memd-promotion:{a.key} -->")
        out.append(
            f"- {_collapse(a.text)} [score={cand.score:.3f} recalls={cand.entry.recall_count} "
            f"avg={avg:.3f} source={a.path}:{a.start_line}-{a.end_line}]"
        )
    return nl.join(out) + nl


def _drop_oldest(text: str, room: int) -> tuple[str, int]:
    """Drop the oldest promoted sections until ``text`` fits ``room``; other lines all stay."""
    lines = text.splitlines(keepends=True)
    nl = "\r\n" if "\r\n" in text else "\n"
    regions: dict[int, tuple[str, int]] = {}  # first line -> (date, end)
    for i, line in enumerate(lines):
        if m := _SECTION.fullmatch(line.strip()):
            j = i + 1
            while j < len(lines) and not _TOP_HEADING.match(lines[j]):
                j += 1
            regions[i] = (m[1], j)
    dropped: dict[int, list[str]] = {}
    result = text
    for _day, i in sorted((day, i) for i, (day, _end) in regions.items()):
        if len(result) <= room:
            break
        dropped[i] = _residue(lines[i + 1 : regions[i][1]], nl)
        out: list[str] = []
        k = 0
        while k < len(lines):
            if k in dropped:
                out += dropped[k]
                k = regions[k][1]
            else:
                out.append(lines[k])
                k += 1
        result = _TRAILING_BLANKS.sub("", "".join(out)) if "".join(out).strip() else ""
    if result and not result.endswith("\n"):
        result += nl
    return result, len(dropped)


def _residue(body: list[str], nl: str) -> list[str]:
    """The lines of a promoted section that memd did not write (a human's additions)."""
    keep: list[str] = []
    after_marker = False
    for line in body:
        s = line.strip()
        if after_marker and s.startswith("- "):
            after_marker = False
            continue
        after_marker = bool(_MARKER.fullmatch(s))
        if not after_marker:
            keep.append(line)
    while keep and not keep[0].strip():
        keep.pop(0)
    while keep and not keep[-1].strip():
        keep.pop()
    if keep and not keep[-1].endswith("\n"):
        keep[-1] += nl
    return keep + [nl] if keep else []


@dataclass
class _Snapshot:
    data: bytes
    fd: int | None  # open on the file read, so bytes appended to it later can be salvaged
    st: os.stat_result | None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "surrogateescape")


def _open_nofollow(path: Path, flags: int, mode: int = 0o666) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{path} is a symlink; memd does not write through it") from exc
        raise


def _read_from(fd: int, offset: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _snapshot(path: Path) -> _Snapshot:
    try:
        fd = _open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return _Snapshot(b"", None, None)
    return _Snapshot(_read_from(fd, 0), fd, os.fstat(fd))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n < len(view):
            logger.warning(
                "short write to MEMORY.md (%d of %d bytes); writing the rest", n, len(view)
            )
        view = view[n:]


def _append(path: Path, body: str, *, header: str = "", nl: str = "\n") -> None:
    """Append ``body`` with one write on an O_APPEND fd: appends cannot clobber a concurrent editor."""
    fd = _open_nofollow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            data = header + body
        else:  # decided at write time, so a line the human just added without "\n" stays whole
            data = body if os.pread(fd, 1, size - 1) == b"\n" else nl + body
        append_whole(fd, data.encode("utf-8", "surrogateescape"), size)  # all or nothing
    finally:
        os.close(fd)
    if size == 0:
        fsync_dir(path.parent)


@functools.cache
def _exchange_fn() -> Callable[[str, str], bool] | None:
    """An atomic swap of two paths (Linux renameat2 RENAME_EXCHANGE, macOS renamex_np RENAME_SWAP)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        fn = libc.renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]

        def call(a: bytes, b: bytes) -> int:
            return int(fn(-100, a, -100, b, 2))  # AT_FDCWD, RENAME_EXCHANGE

    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        fn = libc.renamex_np
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]

        def call(a: bytes, b: bytes) -> int:
            return int(fn(a, b, 2))  # RENAME_SWAP

    else:
        return None

    def exchange(a: str, b: str) -> bool:
        if call(os.fsencode(a), os.fsencode(b)) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False  # this filesystem cannot swap; the caller falls back to os.replace
        raise OSError(err, os.strerror(err), a)

    return exchange


def _swap_in(path: Path, base: _Snapshot, new_text: str) -> bool:
    """Replace MEMORY.md with ``new_text`` only if it still is ``base``; False = it changed."""
    data = new_text.encode("utf-8", "surrogateescape")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            if base.st is not None:
                os.fchmod(fd, stat.S_IMODE(base.st.st_mode))
            _write_all(fd, data)
            fsync(fd)
        finally:
            os.close(fd)
        if _snapshot_bytes(path) != base.data:
            return False
        exchange = _exchange_fn()
        if exchange is None or base.fd is None or base.st is None or not exchange(tmp, str(path)):
            os.replace(tmp, path)  # no atomic swap here: the re-read above is the whole check
        elif not _settle(path, tmp, base, len(data), exchange):
            return False
        fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _settle(
    path: Path, tmp: str, base: _Snapshot, written: int, exchange: Callable[[str, str], bool]
) -> bool:
    """After a swap, ``tmp`` holds the displaced file: undo unless it is ``base`` plus appends."""
    assert base.fd is not None and base.st is not None
    displaced = os.stat(tmp, follow_symlinks=False)
    if (displaced.st_dev, displaced.st_ino) == (base.st.st_dev, base.st.st_ino):
        time.sleep(SALVAGE_GRACE_S)  # let a writer that opened the old file finish its write
        now = _read_from(base.fd, 0)
        if now.startswith(base.data):
            tail = now[len(base.data) :]
            if tail:  # appended to the old file after our check: carry it over
                _append(path, tail.decode("utf-8", "surrogateescape"))
            return True
    # Someone renamed a new MEMORY.md in, or rewrote it in place: give theirs back.
    exchange(tmp, str(path))
    late = _snapshot_bytes(Path(tmp))[written:]
    if late:  # appended to our file while it was in place
        _append(path, late.decode("utf-8", "surrogateescape"))
    return False


def _snapshot_bytes(path: Path) -> bytes:
    snap = _snapshot(path)
    if snap.fd is not None:
        os.close(snap.fd)
    return snap.data


def apply_promotions(
    root: Path, candidates: Sequence[Candidate], *, day: date, max_chars: int = 10_000
) -> PromotionResult:
    """Append the candidates not yet in ``root/MEMORY.md`` as one section dated ``day``."""
    path = root / MEMORY_FILE
    if path.is_symlink():
        raise PathRefused(f"{path} is a symlink; memd does not write through it")
    result = PromotionResult(memory_path=str(path))
    present = set(_MARKER.findall(_snapshot_bytes(path).decode("utf-8", "surrogateescape")))
    ready: list[tuple[Candidate, Applied]] = []
    seen: set[str] = set()
    for cand in candidates:
        key = cand.entry.key
        if key in seen:
            continue
        seen.add(key)
        if key in present:
            result.already_present.append(key)
            continue
        found = _rehydrate(root, cand.entry)
        if isinstance(found, str):
            logger.info("not promoting %s: %s", key, found)
            result.skipped.append((key, found))
            continue
        ready.append((cand, Applied(key, *found)))
    if ready:
        _write(path, ready, day, max_chars, result)
    return result


def _write(
    path: Path,
    ready: list[tuple[Candidate, Applied]],
    day: date,
    max_chars: int,
    result: PromotionResult,
) -> None:
    for attempt in range(CAS_ATTEMPTS + 1):
        if attempt == CAS_ATTEMPTS:
            logger.warning("%s kept changing; appending without trimming to its budget", path)
        base = _snapshot(path)
        try:
            text = base.text
            present = set(_MARKER.findall(text))
            todo = [(c, a) for c, a in ready if a.key not in present]
            nl = "\r\n" if "\r\n" in text else "\n"
            section = _section(day, todo, nl)
            sep = "" if text.endswith("\n") else nl
            budget = 0 if attempt == CAS_ATTEMPTS else max_chars
            if todo and text and budget > 0 and len(text + sep + section) > budget:
                trimmed, dropped = _drop_oldest(text, budget - len(section))
                if dropped:
                    if not _swap_in(path, base, (trimmed or FILE_HEADER + nl) + section):
                        logger.debug("%s changed while promoting; starting over", path)
                        continue
                    result.dropped_sections = dropped
                    _record(result, ready, todo)
                    return
            if todo:
                _append(path, section, header=FILE_HEADER + nl, nl=nl)
            _record(result, ready, todo)
            return
        finally:
            if base.fd is not None:
                os.close(base.fd)


def _record(
    result: PromotionResult,
    ready: list[tuple[Candidate, Applied]],
    todo: list[tuple[Candidate, Applied]],
) -> None:
    written = {a.key for _c, a in todo}
    for _c, a in ready:
        if a.key in written:
            result.applied.append(a)
        else:  # appeared in MEMORY.md while this run was rehydrating
            result.already_present.append(a.key)
