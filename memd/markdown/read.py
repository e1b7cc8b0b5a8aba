"""Safe reads of memory files for ``get``: path validation, symlink containment, line windows.
Nothing outside a workspace's memory files and configured extra paths is ever opened."""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from memd.markdown.discover import resolve_extra_paths
from memd.markdown.identity import FileId, Longterm, file_id
from memd.markdown.lines import read_window
from memd.text import first_control
from memd_client.errors import BadRequest, PathRefused

__all__ = [
    "MAX_LINES",
    "MAX_PATH_CHARS",
    "GetResult",
    "MemoryPath",
    "locate",
    "read_lines",
    "read_located",
    "resolve_memory_path",
]

logger = logging.getLogger(__name__)

MAX_PATH_CHARS = 4096
MAX_LINES = 10_000
_ROOT_NAMES = ("MEMORY.md", "memory.md", "DREAMS.md")
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass(frozen=True)
class GetResult:
    """A window of lines from one memory file."""

    path: str
    text: str
    from_line: int
    lines: int
    truncated: bool
    next_from: int | None
    missing: bool


@dataclass(frozen=True)
class MemoryPath:
    """A ``get`` path resolved and contained: what access decisions are made on, and what is
    then opened (walking down from ``container`` without following symlinks)."""

    rel: str  # what the caller asked for, normalised
    real: str  # the symlink-free path that will be opened
    container: str  # symlink-free directory the open walks down from
    parts: tuple[str, ...]  # components below container
    # The workspace's long-term memory (MEMORY.md, DREAMS.md), by the name asked for, the path a
    # symlink or another spelling leads to (compared without case, as on macOS volumes), or what
    # the file is: a hard link or a bind mount of MEMORY.md is MEMORY.md.
    longterm: bool = False
    # What the file was when the decision was made (None: missing); the open must find it again.
    ident: FileId | None = None


_Target = MemoryPath


def _is_longterm(root: Path, root_real: str, rel: str, real: str, ident: FileId | None) -> bool:
    """MEMORY.md, or DREAMS.md (the dream diary quotes MEMORY.md), by name, target or identity."""
    by_path = any(
        rel.lower() == name or real.lower() == os.path.join(root_real, name).lower()
        for name in ("memory.md", "dreams.md")
    )
    return by_path or Longterm(root).holds_id(ident)


def _refuse(reason: str) -> PathRefused:
    return PathRefused(f"path refused: {reason}")


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def _is_memory_rel(rel: str) -> bool:
    parts = rel.split("/")
    if not parts[-1].lower().endswith(".md") or ".." in parts:
        return False
    return rel in _ROOT_NAMES or (parts[0] == "memory" and len(parts) > 1)


def _check_text(path: object) -> str:
    if not isinstance(path, str):
        raise BadRequest(f"path must be a string, not {type(path).__name__}")
    if len(path) > MAX_PATH_CHARS:
        raise _refuse(f"longer than {MAX_PATH_CHARS} characters")
    if "\x00" in path:
        raise _refuse("contains a NUL byte")
    text = path.strip()
    if not text:
        raise _refuse("empty path")
    if first_control(text) is not None:
        raise _refuse("contains a control character")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise _refuse("contains an invalid (surrogate) character")
    if "\\" in text:
        raise _refuse("backslashes are not allowed (use '/')")
    if text.startswith("~"):
        raise _refuse("'~' is not allowed")
    return text


def _extras(root: Path, extra_paths: Sequence[str]) -> list[tuple[bool, str, str]]:
    """Usable extra paths as (is_dir, lexical path, real path); symlinked ones are not honoured."""
    out: list[tuple[bool, str, str]] = []
    for p in resolve_extra_paths(root, extra_paths):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            out.append((True, str(p), os.path.realpath(p)))
        elif stat.S_ISREG(st.st_mode) and p.name.lower().endswith(".md"):
            out.append((False, str(p), os.path.realpath(p)))
    return out


def _in_extra(path: str, extras: list[tuple[bool, str, str]], real: bool) -> str | None:
    """Return the extra-path directory (or file's directory) holding ``path``, else None."""
    for is_dir, lexical, realpath in extras:
        for base in (realpath,) if real else (lexical, realpath):
            if is_dir and _under(path, base) and path != base and path.lower().endswith(".md"):
                return base
            if not is_dir and path == base:
                return os.path.dirname(base)
    return None


def _resolve(root: Path, path: object, extra_paths: Sequence[str]) -> _Target:
    text = _check_text(path)
    root_abs = os.path.abspath(root)
    root_real = os.path.realpath(root_abs)
    is_abs = text.startswith("/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    dotdot = ".." in parts
    if dotdot:
        lead = 0
        while lead < len(parts) and parts[lead] == "..":
            lead += 1
        # Only the "../x/y.md" form that discovery gives files of outside extra paths.
        if is_abs or ".." in parts[lead:]:
            raise _refuse("'..' is not allowed")
    target = os.path.normpath("/" + "/".join(parts) if is_abs else os.path.join(root_abs, *parts))
    extras = _extras(root, extra_paths)
    if dotdot and _in_extra(target, extras, real=False) is None:
        raise _refuse("'..' is not allowed")
    if _under(target, root_abs) and target != root_abs:
        rel = os.path.relpath(target, root_abs)
    elif is_abs and _under(target, root_real) and target != root_real:
        rel = os.path.relpath(target, root_real)
    elif is_abs and _in_extra(target, extras, real=False) is None:
        raise _refuse("absolute path outside the workspace")
    else:
        rel = os.path.relpath(target, root_abs)
    if not parts or not parts[-1].lower().endswith(".md"):
        raise _refuse("only .md files")
    if not (_is_memory_rel(rel) or _in_extra(target, extras, real=False)):
        raise _refuse("not a memory file")

    # Symlinks may be followed only when they land on an allowed file again.
    real = _realpath(target)
    container: str | None = None
    if (
        real != root_real
        and _under(real, root_real)
        and _is_memory_rel(os.path.relpath(real, root_real))
    ):
        container = root_real
    if container is None:
        container = _in_extra(real, extras, real=True)
    if container is None:
        inside = _under(real, root_real) or any(_under(real, r) for _, _, r in extras)
        if inside:
            raise _refuse("leads through a symlink to a file that is not a memory file")
        raise _refuse("leads outside the workspace through a symlink")
    below = os.path.relpath(real, container).split("/")
    ident = _ident(real)
    longterm = _is_longterm(root, root_real, rel, real, ident)
    return MemoryPath(rel, real, container, tuple(below), longterm, ident)


def _ident(real: str) -> FileId | None:
    try:
        return file_id(os.stat(real))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _open_error(exc) from None


def _realpath(path: str) -> str:
    for _ in range(3):
        try:
            return os.path.realpath(path, strict=True)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse("symlink loop") from None
        try:
            return os.path.realpath(path)  # missing (or unreadable) components stay as written
        except OSError:
            continue  # a symlink vanished between lstat and readlink: the tree is changing
    raise _refuse("the path changed while it was being resolved; retry")


def resolve_memory_path(root: Path, path: str, extra_paths: Sequence[str] = ()) -> tuple[str, Path]:
    """Validate a ``get`` path: return (normalised rel path, symlink-free absolute path).

    Raises PathRefused naming the reason, or BadRequest when ``path`` is not a string.
    """
    t = _resolve(root, path, extra_paths)
    return t.rel, Path(t.real)


def _open_beneath(t: _Target) -> int | None:
    """Open ``t`` walking down from its container with O_NOFOLLOW; None when it does not exist.

    ``t.real`` held no symlink when it was resolved, so meeting one now means the tree was swapped
    under us (TOCTOU): refuse instead of following it out.
    """
    dirfd = _open_at(None, t.container, _O_DIR)
    for i, part in enumerate(t.parts):
        if dirfd is None:
            return None
        last = i == len(t.parts) - 1
        try:
            fd = _open_at(dirfd, part, _O_FILE if last else _O_DIR)
        finally:
            os.close(dirfd)
        if last:
            return fd
        dirfd = fd
    return None


def _open_at(dirfd: int | None, name: str, flags: int) -> int | None:
    try:
        return os.open(name, flags, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if dirfd is not None and exc.errno in (errno.ENOTDIR, errno.EMLINK, errno.ELOOP):
            try:
                st = os.lstat(name, dir_fd=dirfd)
            except FileNotFoundError:
                return None
            if stat.S_ISLNK(st.st_mode):
                raise _refuse("a symlink appeared while opening; not followed") from None
            if exc.errno == errno.ENOTDIR:
                return None  # a file where a directory should be: no such path
        elif exc.errno == errno.ENOTDIR:
            return None
        raise _open_error(exc) from None


def _open_error(exc: OSError) -> PathRefused:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return _refuse("permission denied")
    if exc.errno == errno.ENAMETOOLONG:
        return _refuse("name too long")
    if exc.errno == errno.ELOOP:
        return _refuse("symlink loop")
    logger.debug("open failed: %s", exc)
    return _refuse(f"cannot open: {exc.strerror}")


def read_lines(
    root: Path,
    path: str,
    from_line: int = 1,
    lines: int = 120,
    max_chars: int = 12_000,
    extra_paths: Sequence[str] = (),
) -> GetResult:
    """Return lines ``from_line``.. of a memory file, within ``lines`` and a character budget."""
    _check_int("from", from_line, 1, None)
    _check_int("lines", lines, 1, MAX_LINES)
    _check_int("max_chars", max_chars, 1, None)
    return read_located(locate(root, path, extra_paths), from_line, lines, max_chars)


def locate(root: Path, path: object, extra_paths: Sequence[str] = ()) -> MemoryPath:
    """Resolve and contain a ``get`` path; raises PathRefused naming why it may not be read."""
    return _resolve(root, path, extra_paths)


def read_located(t: MemoryPath, from_line: int, lines: int, max_chars: int) -> GetResult:
    """Lines of a file :func:`locate` resolved (no symlink is followed on the way)."""
    _check_int("from", from_line, 1, None)
    _check_int("lines", lines, 1, MAX_LINES)
    _check_int("max_chars", max_chars, 1, None)
    empty = GetResult(t.rel, "", from_line, 0, False, None, missing=True)
    fd = _open_beneath(t)
    if fd is None:
        return empty
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse("not a regular file")
        # The access decision was made on what the file was then: read only that file.
        if t.ident is None or file_id(st) != t.ident:
            raise _refuse("the file changed while it was being opened; retry")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return _window(f, t.rel, from_line, lines, max_chars)


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name} must be an integer")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"{name} must be {bound}, got {value}")


def _window(f: BinaryIO, rel: str, from_line: int, lines: int, max_chars: int) -> GetResult:
    w = read_window(f, from_line, lines, max_chars)
    return GetResult(rel, w.text, from_line, w.lines, w.truncated, w.next_from, False)
