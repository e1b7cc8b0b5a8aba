"""What a file is (its device and inode), and which files are a workspace's long-term memory.

A hard link, a bind mount or another spelling of MEMORY.md is MEMORY.md: access decisions
compare what a file is, not what it is called.
"""

from __future__ import annotations

import os
from pathlib import Path

from memd.scopes import is_longterm

__all__ = ["LONGTERM_NAMES", "FileId", "Longterm", "file_id"]

# MEMORY.md, its legacy spelling, and DREAMS.md (the dream diary quotes what was promoted).
LONGTERM_NAMES = ("MEMORY.md", "memory.md", "DREAMS.md")

FileId = tuple[int, int]


def file_id(st: os.stat_result) -> FileId:
    """What a file is: its (device, inode)."""
    return (st.st_dev, st.st_ino)


class Longterm:
    """The long-term memory files of one workspace as they are now: each name in
    LONGTERM_NAMES that exists, by what it is (a symlink is followed: what it leads to is what
    is kept under that name)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))
        ids: set[FileId] = set()
        for name in LONGTERM_NAMES:
            try:
                st = os.stat(self.root / name)
            except (OSError, ValueError):
                continue
            if st.st_ino:  # a filesystem without inode numbers tells files apart by name only
                ids.add(file_id(st))
        self.ids = frozenset(ids)

    def holds_id(self, fid: FileId | None) -> bool:
        """Say whether a file of identity ``fid`` is long-term memory."""
        return fid is not None and fid in self.ids

    def holds(self, rel: str) -> bool:
        """Say whether the workspace-relative ``rel`` names long-term memory, by its name or by
        what the file there is now."""
        if is_longterm(rel):
            return True
        if not self.ids:
            return False
        try:
            return self.holds_id(file_id(os.stat(self.root / rel)))
        except (OSError, ValueError):  # gone, or a name the filesystem cannot hold
            return False
