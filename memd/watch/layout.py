"""What the watcher watches in a workspace (root, memory/, extra paths) and the change an event maps to."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memd.changes import Changes
from memd.markdown.discover import is_ignored, resolve_extra_paths

__all__ = ["WatchLayout"]

logger = logging.getLogger(__name__)

_EVERGREEN = frozenset({"MEMORY.md", "memory.md", "DREAMS.md"})


@dataclass(frozen=True)
class WatchLayout:
    """The absolute, normalised paths of one workspace that matter to the watcher."""

    root: str
    extras: tuple[str, ...]

    @classmethod
    def build(cls, root: Path, extra_paths: Sequence[str]) -> WatchLayout:
        """Resolve the workspace root and its extra paths the way ``memd.markdown.discover`` does."""
        base = os.path.abspath(root)
        extras: list[str] = []
        for path in resolve_extra_paths(root, extra_paths):
            if _contains(str(path), base):
                # A recursive watch there would cover node_modules and the like (and the home
                # directory for "~"); the periodic rescan still indexes it.
                logger.warning("extra path %s contains the workspace: it is not watched", path)
                continue
            extras.append(str(path))
        return cls(base, tuple(extras))

    @property
    def memory(self) -> str:
        return os.path.join(self.root, "memory")

    def desired(self) -> dict[str, bool]:
        """Return the directories to watch now, from what is on disk: path -> recursive.

        The root is watched non-recursively (MEMORY.md, and the replacement of memory/),
        memory/ and extra directories recursively when they are real directories, and the
        parent of an extra file non-recursively unless a watch already covers it.
        """
        want: dict[str, bool] = {self.root: False}
        dirs: list[str] = []
        files: list[str] = []
        if _is_real_dir(self.memory):
            dirs.append(self.memory)
        for extra in self.extras:
            st = _lstat(extra)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                dirs.append(extra)
            elif stat.S_ISREG(st.st_mode) and extra.endswith(".md"):
                files.append(extra)
        recursive: list[str] = []
        for path in sorted(dirs, key=len):  # outer directories first, nested ones are covered
            if not any(_contains(top, path) for top in recursive):
                recursive.append(path)
                want[path] = True
        for path in files:
            parent = os.path.dirname(path)
            if parent not in want and not any(_contains(top, parent) for top in recursive):
                want[parent] = False
        return want

    def is_structural(self, path: str) -> bool:
        """Say whether a directory event on ``path`` can change which directories are watched."""
        return os.path.abspath(path) in {self.root, self.memory, *self.extras}

    def key_for(self, path: str, *, is_dir: bool) -> Changes | None:
        """Map an event path to its change: a workspace-relative path, a rescan of the whole
        workspace, or None (not ours)."""
        path = os.path.abspath(path)
        if is_dir and self.is_structural(path):
            return Changes.everything()
        try:
            rel = os.path.relpath(path, self.root).replace(os.sep, "/")
        except ValueError:  # another drive (Windows): nothing we can map
            return Changes.everything()
        if rel in _EVERGREEN:
            return None if is_dir else Changes.of([rel])
        if rel.startswith("memory/"):
            return _below(rel, rel[len("memory/") :], is_dir=is_dir)
        for extra in self.extras:
            if path == extra:
                return _below(rel, os.path.basename(path), is_dir=is_dir)
            if _contains(extra, path):
                below = os.path.relpath(path, extra).replace(os.sep, "/")
                return _below(rel, below, is_dir=is_dir)
        return None


def _below(rel: str, below: str, *, is_dir: bool) -> Changes | None:
    """Apply the ignore rules to the part of a path below a watched top directory."""
    if is_ignored(below):
        return None
    if is_dir:
        return Changes.everything()
    return Changes.of([rel]) if rel.endswith(".md") else None


def _contains(top: str, path: str) -> bool:
    """Say whether ``path`` is ``top`` or inside it (both absolute and normalised)."""
    try:
        return os.path.commonpath([top, path]) == top
    except ValueError:
        return False


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _is_real_dir(path: str) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)
