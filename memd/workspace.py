"""One workspace memd serves: its record (name, root, extra paths, transcripts), its open index
and syncer, where its dreaming keeps its files, and the checks a workspace's paths must pass.
The set of them and their life (open, watch, sync, save, forget) is memd/registry/.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.config import Config, refused_extra_path
from memd.config.parse import MAX_EXTRA_PATHS
from memd.dreams.place import DreamPlace
from memd.dreams.transcripts import Message, Transcript, TranscriptSource
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.redact import redact as redact_text
from memd.sessions.transcript import list_transcripts, render
from memd.text import first_control
from memd_client.errors import BadRequest
from memd_client.types import WorkspaceEntry

__all__ = [
    "DirIdentity",
    "Workspace",
    "check_name",
    "check_walked",
    "directory",
    "dreams_folder",
    "index_file",
    "workspace_entry",
]

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"\.checkpoint\..+\.jsonl$", re.IGNORECASE)  # OpenClaw's copies


@dataclass(frozen=True)
class DirIdentity:
    """Which directory a workspace path named when it was registered: an unmounted drive or a
    directory put in place of another has the same path and another identity."""

    device: int
    inode: int
    fsid: int  # the filesystem's own id (statvfs): stable where device numbers are not

    @classmethod
    def of(cls, path: Path) -> DirIdentity | None:
        """The identity of the directory at ``path`` (None: no directory there)."""
        try:
            st = os.stat(path)
            fsid = os.statvfs(path).f_fsid
        except (OSError, ValueError):
            return None
        return cls(st.st_dev, st.st_ino, fsid) if stat.S_ISDIR(st.st_mode) else None

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> DirIdentity | None:
        """The identity a registry entry recorded (None for an entry from an older memd)."""
        values = [entry.get(k) for k in ("device", "inode", "fsid")]
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        return cls(*ints) if len(ints) == 3 else None

    def to_entry(self) -> dict[str, int]:
        return {"device": self.device, "inode": self.inode, "fsid": self.fsid}

    def same(self, other: DirIdentity) -> bool:
        """The same directory: its inode, on the same device (or, as device numbers may change
        when a drive is mounted again, the same filesystem)."""
        return self.inode == other.inode and (
            self.device == other.device or (self.fsid != 0 and self.fsid == other.fsid)
        )


@dataclass
class Workspace:
    """A workspace memd serves, with its index and its syncer (whose lock serialises writes)."""

    name: str
    root: Path
    extra_paths: tuple[str, ...]
    index: Index
    syncer: Syncer
    sessions_dir: Path | None = None
    agent_id: str = ""
    identity: DirIdentity | None = None  # of the root, when it was registered
    dreams: DreamPlace | None = None  # where its dreaming keeps its files (memd's state)

    @property
    def dream_place(self) -> DreamPlace:
        return self.dreams or DreamPlace.inside(self.root)

    def dream_transcripts(self, *, redact: bool) -> TranscriptSource | None:
        """The live transcripts for dreaming (None without a transcript folder), each rendered
        when it is read, redacted as the index redacts them; checkpoint copies and dreaming's
        own runs left out. Dreams and sessions do not know each other: this is where they
        meet."""
        directory = self.sessions_dir
        if directory is None:
            return None

        def reader(path: Path) -> list[Message]:
            rendered = render(path.read_bytes(), redact=redact_text if redact else None)
            if rendered.dreaming_narrative:
                return []
            lines = rendered.text.split("\n") if rendered.text else []
            return [
                Message(line, at, text)
                for line, at, text in zip(
                    rendered.line_map, rendered.timestamps, lines, strict=True
                )
            ]

        def transcripts() -> list[Transcript]:
            files, _complete = list_transcripts(directory)
            return [
                Transcript(f.name, f.size, f.mtime_ns, functools.partial(reader, f.abs))
                for f in files
                if not f.archived and not _CHECKPOINT.search(f.name)
            ]

        return transcripts

    def root_problem(self) -> str | None:
        """Why the workspace directory cannot be followed now: gone, or not the directory that
        was registered (a drive unmounted, a directory put in its place). None when it can."""
        try:
            st = os.stat(self.root)
        except (OSError, ValueError):
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            return f"the workspace directory {self.root} is gone (deleted, moved or unmounted)"
        if self.identity is None or (st.st_dev, st.st_ino) == (
            self.identity.device,
            self.identity.inode,
        ):
            return None  # every reply asks: one stat when nothing changed
        now = DirIdentity.of(self.root)
        if now is None:
            return f"the workspace directory {self.root} is gone (deleted, moved or unmounted)"
        if not self.identity.same(now):
            return (
                f"the workspace directory {self.root} is not the one registered (another "
                "device or inode: unmounted, or replaced); its index is kept as it was. Mount "
                f"it again, or follow the directory there now: memctl workspace add {self.root}"
            )
        return None


MAX_NAME_CHARS = 64


def check_name(name: str) -> str:
    """A workspace name as memctl and status can show and address it, or BadRequest."""
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("a workspace name must not be empty")
    if name != name.strip() or len(name) > MAX_NAME_CHARS:
        raise BadRequest(
            f"workspace name {name!r}: at most {MAX_NAME_CHARS} characters, no outer spaces"
        )
    if name in (".", "..") or "/" in name or first_control(name) is not None:
        raise BadRequest(f"workspace name {name!r} may not be '.', '..' or hold '/' or controls")
    return name


def directory(path: str | Path) -> Path | None:
    """``path`` resolved, if it names a directory (``~`` expanded; "~someone" for an unknown
    user, a NUL byte or an unreadable path is no directory)."""
    try:
        root = Path(path).expanduser()
        if "\x00" in str(root) or not root.is_dir():
            return None
        return root.resolve()
    except (RuntimeError, OSError):
        return None


def check_walked(root: Path, extra_paths: Sequence[str], sessions_dir: str | Path = "") -> None:
    """Refuse (BadRequest) extra paths or a transcript folder memd would have to walk the
    system or the whole home directory for, and more extra paths than memd watches."""
    if len(extra_paths) > MAX_EXTRA_PATHS:
        raise BadRequest(f"{len(extra_paths)} extra paths given, at most {MAX_EXTRA_PATHS}")
    for entry in extra_paths:
        why = refused_extra_path(root, entry)
        if why is not None:
            raise BadRequest(why)
    if sessions_dir:
        why = refused_extra_path(root, str(sessions_dir), "a transcript folder")
        if why is not None:
            raise BadRequest(why)


def _slug(root: Path) -> str:
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", root.name).strip("-.") or "workspace"
    return f"{name[:40]}-{digest}"


def dreams_folder(config: Config, root: Path) -> Path:
    """Where the workspace at ``root`` (resolved) keeps its dreaming files: memd's state."""
    return config.state_dir / "dreams" / _slug(root)


def index_file(config: Config, root: Path) -> Path:
    """The index file of the workspace at ``root`` (resolved), in memd's state."""
    return config.index_dir / f"{_slug(root)}.sqlite"


def workspace_entry(ws: Workspace) -> WorkspaceEntry:
    """What the registry file and the workspace methods say of ``ws``."""
    entry: WorkspaceEntry = {
        "name": ws.name,
        "path": str(ws.root),
        "extra_paths": list(ws.extra_paths),
    }
    if ws.sessions_dir is not None:
        entry["sessions_dir"] = str(ws.sessions_dir)
        entry["agent_id"] = ws.agent_id
    return entry
