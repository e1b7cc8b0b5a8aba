"""Discovery of a workspace's memory files (MEMORY.md, memory/**.md, extra paths), the ignore
rules shared with the file watcher, and the evergreen/daily/topic/extra classification.

Over 400 lines: discovery and the ignore rules must agree with each other and with the
watcher, so they live in one place.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fnmatch
import logging
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from memd.markdown.identity import FileId, Longterm, file_id

__all__ = [
    "IGNORED_DIRS",
    "Discovery",
    "Kind",
    "SourceFile",
    "classify",
    "daily_date",
    "discover",
    "is_ignored",
    "memory_file",
    "read_regular",
    "resolve_extra_paths",
]

logger = logging.getLogger(__name__)

Kind = Literal["evergreen", "daily", "topic", "extra"]

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024

# Compared case-insensitively against every path segment.
IGNORED_DIRS = frozenset(
    {
        ".git",
        "node_modules",
        ".pnpm-store",
        ".venv",
        "venv",
        ".tox",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".idea",
        ".vscode",
        ".cache",
    }
)
# Editor swap, backup and temporary names (vim, emacs, gedit/GIO, atomic-save helpers).
_IGNORED_NAME_PATTERNS = (
    "*.swp",
    "*.swo",
    "*.swx",
    "*~",
    ".#*",
    "4913",
    ".goutputstream-*",
    "*.tmp",
    ".*.tmp-*",
)
_IGNORED_NAME_RE = re.compile(
    "|".join(fnmatch.translate(p) for p in _IGNORED_NAME_PATTERNS), re.IGNORECASE
)
_EVERGREEN = ("MEMORY.md", "memory.md", "DREAMS.md")  # DREAMS.md: the dream diary
DIARY = "DREAMS.md"  # indexed only when [index] diary says so
# ASCII digits only: \d would also accept other scripts' digits.
_DAILY_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:-.+)?\.md")


@dataclass(frozen=True)
class SourceFile:
    """One memory file found on disk."""

    rel: str
    path: str  # absolute: ``abs`` as a Path, made when asked (a walk of thousands reads few)
    size: int
    mtime_ns: int
    kind: Kind
    day: datetime.date | None

    @property
    def abs(self) -> Path:
        return Path(self.path)


@dataclass(frozen=True)
class Discovery:
    """The result of one scan; ``complete`` is False when some directory could not be listed."""

    files: list[SourceFile]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True


def is_ignored(rel_or_name: str) -> bool:
    """Say whether a path (or bare name) is in an ignored directory or is an editor temp name.

    The extension is not checked, so directories pass; callers still require ``.md`` for files.
    """
    parts = [p for p in rel_or_name.replace("\\", "/").split("/") if p]
    if not parts:
        return False
    if any(p.lower() in IGNORED_DIRS for p in parts):
        return True
    return _IGNORED_NAME_RE.match(parts[-1]) is not None


def daily_date(rel: str) -> datetime.date | None:
    """Return the date of a daily log (``memory/**/YYYY-MM-DD[-suffix].md``), else None."""
    rel = _strip_dot(rel)
    if not rel.startswith("memory/"):
        return None
    m = _DAILY_RE.fullmatch(rel.rsplit("/", 1)[-1])
    if m is None:
        return None
    try:
        return datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return None


def classify(rel: str) -> tuple[Kind, datetime.date | None]:
    """Return the kind of a workspace-relative path and, for a daily log, its date."""
    rel = _strip_dot(rel)
    if rel in _EVERGREEN:
        return "evergreen", None
    if rel.startswith("memory/"):
        day = daily_date(rel)
        return ("daily", day) if day is not None else ("topic", None)
    return "extra", None


def resolve_extra_paths(root: Path, extra_paths: Sequence[str]) -> list[Path]:
    """Normalise configured extra paths: trim, drop empty, expand ``~``, anchor at root, dedupe."""
    base = os.path.abspath(root)
    out: list[Path] = []
    seen: set[str] = set()
    for entry in extra_paths:
        text = str(entry).strip()
        if not text:
            continue
        full = os.path.normpath(os.path.join(base, os.path.expanduser(text)))
        if full not in seen:
            seen.add(full)
            out.append(Path(full))
    return out


def memory_file(
    root: Path, rel: str, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, *, diary: bool = False
) -> tuple[Literal["file"], SourceFile] | tuple[Literal["gone", "rescan"], None]:
    """Look at one path the way discover() would, without walking the workspace.

    Returns ("file", the file), ("gone", None) when discover() would not list it (missing,
    a symlink on the way, ignored, not .md), or ("rescan", None) when only a full discover()
    can tell (paths outside MEMORY.md and memory/, oversized files).
    """
    rel = _strip_dot(rel)
    parts = rel.split("/")
    if rel == DIARY and not diary:
        return "gone", None
    if rel in _EVERGREEN:
        pass
    elif not (len(parts) >= 2 and parts[0] == "memory" and rel.endswith(".md")):
        return "rescan", None
    if ".." in parts or "" in parts or is_ignored(rel):
        return "gone", None
    if _undecodable(rel):
        return "rescan", None  # discover() reports it as skipped
    path = os.path.abspath(root)
    try:
        above = {file_id(os.stat(path))}
    except OSError:
        return "rescan", None
    for part in parts:  # symlinks anywhere on the way are skipped by discover(), so here too
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except OSError:
            return "gone", None
        if stat.S_ISLNK(st.st_mode):
            return "gone", None
        if stat.S_ISDIR(st.st_mode):
            if file_id(st) in above:  # a folder mounted inside itself: discover() skips it
                return "gone", None
            above.add(file_id(st))
    if not stat.S_ISREG(st.st_mode):
        return "gone", None
    if st.st_nlink > 1:
        return "rescan", None  # another name of the same file: discover() picks the one indexed
    if rel not in _EVERGREEN and Longterm(Path(root)).holds_id(file_id(st)):
        return "gone", None  # MEMORY.md under another name (a bind mount): indexed as MEMORY.md
    if st.st_size > max_file_bytes:
        return "rescan", None
    kind, day = classify(rel)
    return "file", SourceFile(rel, path, st.st_size, st.st_mtime_ns, kind, day)


def read_regular(path: Path, limit: int = -1) -> bytes | None:
    """The bytes of ``path`` (at most ``limit`` of them) if it is still a regular file, else
    None: gone, or swapped for a folder, a symlink or a FIFO since it was listed (opening a
    FIFO would block forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink now
            return None
        raise
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(limit)


def discover(
    root: Path,
    extra_paths: Sequence[str] = (),
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    *,
    diary: bool = False,
) -> Discovery:
    """List the memory files of a workspace, sorted by rel path, with what was skipped and why
    (DREAMS.md, the dream diary, only with ``diary``: it is for people to read)."""
    scan = _Scan(Path(os.path.abspath(root)), max_file_bytes, diary=diary)
    scan.root_files()
    for extra in resolve_extra_paths(root, extra_paths):
        scan.extra(extra)
    # One file is indexed once, under one name, whatever links or mounts give it others:
    # MEMORY.md (DREAMS.md) first, so a second name of long-term memory never becomes a
    # daily log or a topic file in the index; otherwise the first name in order.
    longterm = Longterm(scan.root)
    seen: set[FileId] = set()
    files: list[SourceFile] = []
    for f, fid in sorted(scan.found, key=lambda x: (x[0].kind != "evergreen", x[0].rel)):
        if fid in seen or (f.kind != "evergreen" and longterm.holds_id(fid)):
            logger.debug("%s is the same file as one indexed already; not indexed twice", f.rel)
            continue
        if fid[1]:  # a filesystem without inode numbers tells files apart by name only
            seen.add(fid)
        files.append(f)
    files.sort(key=lambda f: f.rel)
    return Discovery(files=files, skipped=sorted(set(scan.skipped)), complete=scan.complete)


class _Scan:
    """The state of one discover() call."""

    def __init__(self, root: Path, max_file_bytes: int, *, diary: bool) -> None:
        self.root = root
        self._below = os.path.join(str(root), "")  # the walk's paths start so: cut, not relpath
        self.max_file_bytes = max_file_bytes
        self.found: list[tuple[SourceFile, FileId]] = []
        self.diary = diary
        self.skipped: list[tuple[str, str]] = []
        self.complete = True
        # Directories walked, by what they are: a bind mount of the workspace (or of a folder
        # walked already) inside itself is not walked again.
        self.walked: set[FileId] = set()
        self.root_id: FileId | None = None
        with contextlib.suppress(OSError):
            self.root_id = file_id(os.stat(root))

    def rel(self, path: str) -> str:
        # A file of the walk is cut from its path: relpath took a third of a walk's time.
        if path.startswith(self._below) and not path.endswith(os.sep):
            return path[len(self._below) :].replace(os.sep, "/")
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def root_files(self) -> None:
        entries = self.list_dir(str(self.root))
        if entries is None:
            return
        by_name = {e.name: e for e in entries}
        # Exact directory-entry names: on a case-insensitive FS one file has one name, never two.
        for name in _EVERGREEN:
            entry = by_name.get(name)
            if name == DIARY and not self.diary:
                continue
            if entry is not None and entry.is_file(follow_symlinks=False):
                self.take(entry.path, _entry_stat(entry))
        mem = by_name.get("memory")
        if mem is not None and mem.is_dir(follow_symlinks=False):
            self.walk(mem.path)

    def extra(self, path: Path) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.skipped.append((self.rel(str(path)), f"cannot stat: {exc.strerror}"))
            return
        if stat.S_ISDIR(st.st_mode):
            self.walk(str(path))
        elif stat.S_ISREG(st.st_mode) and path.name.endswith(".md") and not is_ignored(path.name):
            self.take(str(path), st)
        # Symlinks, FIFOs, sockets and devices are never taken.

    def walk(self, top: str) -> None:
        """Walk a real directory without following symlinks; ignore rules apply below ``top``."""
        stack = [top]
        while stack:
            path = stack.pop()
            if not self.first_visit(path, top):
                continue
            for entry in self.list_dir(path) or ():
                if entry.is_symlink() or is_ignored(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if _undecodable(entry.name):
                        self.skip_name(entry.path + "/", "a folder")
                    else:
                        stack.append(entry.path)
                elif entry.name.endswith(".md") and entry.is_file(follow_symlinks=False):
                    self.take(entry.path, _entry_stat(entry))

    def first_visit(self, path: str, top: str) -> bool:
        """False for a directory walked already under another name, or the workspace itself
        below ``top`` (bind mounts of them)."""
        try:
            st = os.stat(path)
        except OSError:
            return True  # list_dir says what is wrong with it
        fid = file_id(st)
        if fid[1] and (fid in self.walked or (fid == self.root_id and path != top)):
            logger.debug("%s is a folder walked already (a bind mount?); not walked again", path)
            return False
        self.walked.add(fid)
        return True

    def skip_name(self, path: str, what: str) -> None:
        shown = _shown(self.rel(path)) + ("/" if path.endswith("/") else "")
        self.skipped.append(
            (shown, f"{what} whose name is not valid UTF-8: rename it to have it indexed")
        )

    def list_dir(self, path: str) -> list[os.DirEntry[str]] | None:
        try:
            with os.scandir(path) as it:
                return list(it)
        except (FileNotFoundError, NotADirectoryError):
            if path == str(self.root):
                # A vanished or unmounted workspace must not look like "every file was deleted".
                logger.warning("workspace %s is not a directory", path)
                self.complete = False
            return None
        except OSError as exc:
            logger.warning("cannot list %s: %s; its files are kept as they were", path, exc)
            self.skipped.append((self.rel(path) + "/", f"cannot list directory: {exc.strerror}"))
            self.complete = False
            return None

    def take(self, path: str, st: os.stat_result | OSError | None) -> None:
        rel = self.rel(path)
        if st is None:  # vanished between listing and stat
            return
        if _undecodable(rel):  # the index, the wire and every reply hold UTF-8 text only
            self.skip_name(path, "a file")
            return
        if isinstance(st, OSError):
            self.skipped.append((rel, f"cannot stat: {st.strerror}"))
            return
        if not stat.S_ISREG(st.st_mode):
            return
        if st.st_size > self.max_file_bytes:
            logger.debug("skipping %s: %d bytes", path, st.st_size)
            self.skipped.append((rel, f"larger than {self.max_file_bytes} bytes ({st.st_size})"))
            return
        if not os.access(path, os.R_OK):
            self.skipped.append((rel, "unreadable: permission denied"))
            return
        kind, day = classify(rel)
        found = SourceFile(rel, path, st.st_size, st.st_mtime_ns, kind, day)
        self.found.append((found, file_id(st)))


def _undecodable(name: str) -> bool:
    """Say whether a name read from the filesystem is not valid UTF-8 (Python holds the bytes
    that are not as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _shown(name: str) -> str:
    """A name that is not valid UTF-8, printable: its stray bytes as \\xNN."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _entry_stat(entry: os.DirEntry[str]) -> os.stat_result | OSError | None:
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc


def _strip_dot(rel: str) -> str:
    while rel.startswith("./"):
        rel = rel[2:]
    return rel
