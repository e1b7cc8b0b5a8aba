"""Changes: what changed in a workspace, as the watcher reports it, the writer queues it and a
sync indexes it.

A typed value instead of a set of strings: memory files are workspace-relative paths, and the
two rescans (the whole workspace, the session transcripts) are flags, so no path, not even a
file named ``*``, can be taken for a rescan. Its own module, below the watcher, the writer, the
index and freshness, which all pass it along.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Changes"]


@dataclass(frozen=True)
class Changes:
    """Changed memory files (``paths``) and the rescans asked for."""

    paths: frozenset[str] = frozenset()
    rescan_all: bool = False
    """Rescan the whole workspace: a directory changed, or events may have been lost."""
    rescan_sessions: bool = False
    """Rescan the session transcripts (they are checked by a stat pass)."""

    @classmethod
    def of(cls, paths: Iterable[str]) -> Changes:
        """The changes of ``paths`` (workspace-relative memory files), no rescan."""
        return cls(frozenset(paths))

    @classmethod
    def everything(cls) -> Changes:
        return cls(rescan_all=True)

    @classmethod
    def sessions(cls) -> Changes:
        return cls(rescan_sessions=True)

    @property
    def rescans(self) -> bool:
        """Whether a rescan (of the workspace or of the transcripts) is asked for."""
        return self.rescan_all or self.rescan_sessions

    def __or__(self, other: Changes) -> Changes:
        """Both changes merged."""
        return Changes(
            self.paths | other.paths,
            self.rescan_all or other.rescan_all,
            self.rescan_sessions or other.rescan_sessions,
        )

    def __sub__(self, other: Changes) -> Changes:
        """These changes without ``other``'s paths and rescans."""
        return Changes(
            self.paths - other.paths,
            self.rescan_all and not other.rescan_all,
            self.rescan_sessions and not other.rescan_sessions,
        )

    def __len__(self) -> int:
        """How many things changed: each path, and each rescan counts as one."""
        return len(self.paths) + self.rescan_all + self.rescan_sessions
