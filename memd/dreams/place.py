"""Where a workspace's dreaming keeps its own files.

The recall store, the phase signals, what Light has read, the session corpus (transcript lines,
redacted) and the record of runs live in memd's private state, one folder per workspace
(``$STATE/dreams/<workspace>/``), never in the workspace: a search must not change the user's
files (a git-tracked memory folder was dirty after one search), and text taken from a
transcript must not lie where anyone who reads the workspace finds it. The workspace holds only
what people read: MEMORY.md and DREAMS.md. The folder an earlier memd kept in the workspace,
``memory/.dreams/``, is moved into the state folder the first time it is used.

Entries go on naming a corpus day ``memory/.dreams/session-corpus/DAY.txt``, so their keys stay
what they were; :meth:`DreamPlace.file` finds such a file in the state folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CORPUS_PREFIX", "LEGACY_DIR", "DreamPlace"]

logger = logging.getLogger(__name__)

LEGACY_DIR = "memory/.dreams"
CORPUS_PREFIX = f"{LEGACY_DIR}/session-corpus/"
CORPUS_DIR = "session-corpus"


@dataclass(frozen=True)
class DreamPlace:
    """A workspace (``root``) and the folder that holds its dreaming files (``folder``)."""

    root: Path
    folder: Path

    @classmethod
    def inside(cls, root: Path) -> DreamPlace:
        """The files kept in the workspace itself, as before memd had a state folder for them:
        for tools and tests that run dreaming on a directory alone."""
        return cls(Path(root), Path(root) / LEGACY_DIR)

    @property
    def corpus(self) -> Path:
        return self.folder / CORPUS_DIR

    def file(self, rel: str) -> Path:
        """The file an entry's path names: a corpus day in the folder, else a workspace file."""
        rel = rel.replace("\\", "/")
        if rel.startswith(CORPUS_PREFIX):
            return self.corpus / rel[len(CORPUS_PREFIX) :]
        return self.root / rel

    def prepare(self) -> None:
        """Create the folder (private: it holds transcript text), moving in what an earlier
        memd kept in ``memory/.dreams/`` of the workspace."""
        if self.folder.is_dir():
            return
        self.folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = self.root / LEGACY_DIR
        if old.is_dir() and not old.is_symlink() and old != self.folder:
            staging = self.folder.with_name(self.folder.name + ".moving")
            shutil.rmtree(staging, ignore_errors=True)
            try:
                shutil.copytree(old, staging, symlinks=True)
                os.chmod(staging, 0o700)
                os.rename(staging, self.folder)
            except OSError as exc:
                logger.warning("could not move %s into memd's state: %s", old, exc)
                shutil.rmtree(staging, ignore_errors=True)
            else:
                logger.info("moved %s into memd's state (%s)", old, self.folder)
                with contextlib.suppress(OSError):
                    shutil.rmtree(old)
        with contextlib.suppress(FileExistsError):
            self.folder.mkdir(mode=0o700)
