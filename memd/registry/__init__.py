"""The workspaces memd serves, and their life: opened from the registry file and the config,
added and changed by ``workspace_add``, watched (their changes go to the writer), synced when
they open or appear, saved to the registry file, forgotten. One home for all of it: the daemon
and the methods call these, nothing else wires a workspace. What a workspace is registered
as (the records, and opening one) is memd/registry/records.py.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic
from memd.changes import Changes
from memd.config import WorkspaceConfig
from memd.private import open_private_file
from memd.registry.records import WorkspaceRecords
from memd.watch import Watchers
from memd.workspace import DirIdentity, Workspace, workspace_entry
from memd_client.errors import MemdError, PathRefused

__all__ = ["Workspaces", "load_registry", "save_registry"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Life:
    watchers: Watchers
    changes: Callable[[Workspace], Callable[[Changes], None]]
    sync: Callable[[Workspace, Changes | None, bool], object]
    registry_file: Path


class Workspaces(WorkspaceRecords):
    """Every open workspace, by root and by name, and the registered ones whose directory is
    missing (an unmounted drive): kept, shown in status, and opened when it appears. Their
    records are :class:`~memd.registry.records.WorkspaceRecords`; their life is here."""

    _life: _Life | None = None  # set by attach()

    # -- a workspace's life ---------------------------------------------------------------------

    def attach(
        self,
        *,
        watchers: Watchers,
        changes: Callable[[Workspace], Callable[[Changes], None]],
        sync: Callable[[Workspace, Changes | None, bool], object],
        registry_file: Path,
    ) -> None:
        """What a workspace's life needs beyond its index (given by the daemon's build): the
        watchers, where a workspace's changes go, how a sync is asked for (``sync(ws, keys,
        reconcile)``: the start-up reconcile runs behind other work), the registry file."""
        self._life = _Life(watchers, changes, sync, registry_file)

    def start(self, ws: Workspace, *, reconcile: bool = False) -> None:
        """Watch ``ws`` and queue its first sync (a reconcile of every file)."""
        life = self._require_life()
        life.watchers.watch(ws.root, ws.extra_paths, life.changes(ws))
        life.sync(ws, None, reconcile)

    def open_all(self, entries: Sequence[dict[str, Any]]) -> None:
        """At start: open the registered workspaces and those of the config, then watch and
        reconcile each."""
        for entry in entries:
            self.open_registered(entry)
        for ws in self.all():
            self.start(ws, reconcile=True)

    def add_or_update(
        self,
        path: str,
        *,
        name: str = "",
        extra_paths: tuple[str, ...] | None = None,
        sessions_dir: str = "",
        agent_id: str = "",
    ) -> tuple[Workspace, bool, list[str]]:
        """Register ``path`` (opened, watched, synced, saved), or change the settings given of
        the workspace registered there; (the workspace, added, what changed)."""
        known = self.find_root(path)
        if known is None:
            ws = self.add(
                path,
                name=name,
                extra_paths=extra_paths or (),
                sessions_dir=sessions_dir,
                agent_id=agent_id,
            )
            self.save()
            self.start(ws)
            return ws, True, []
        changed = self.update(
            known,
            name=name,
            extra_paths=extra_paths,
            sessions_dir=sessions_dir,
            agent_id=agent_id,
        )
        now = DirIdentity.of(known.root)
        if now is not None and (known.identity is None or not known.identity.same(now)):
            # Another directory at the registered path (a drive mounted elsewhere, a directory
            # put in place of the old one): adding it again follows it.
            known.identity = now
            changed.append("directory")
        if changed:
            self.save()
            self._require_life().watchers.unwatch(known.root)
            self.start(known)
        return known, False, changed

    def forget(self, ref: str) -> bool:
        """Stop watching a workspace, delete its index and drop it from the registry file
        (its Markdown is untouched); a missing one is only dropped from the file."""
        if self.forget_missing(ref):
            self.save()
            return True
        ws = self.get(ref)
        self._require_life().watchers.unwatch(ws.root)
        removed = self.remove(ws.name)
        self.save()
        return removed

    def appeared(self) -> list[Workspace]:
        """Open, watch and sync the missing workspaces whose directories have appeared."""
        opened = self.open_missing() if self.missing else []
        for ws in opened:
            logger.info("workspace %s appeared at %s", ws.name, ws.root)
            self.start(ws)
        return opened

    def follow(self, workspaces: Sequence[WorkspaceConfig]) -> None:
        """A reloaded configuration's workspaces: the new ones opened, watched and synced."""
        for entry in workspaces:
            known = self.find_root(entry.path)
            try:
                ws = self.add(entry.path, name=entry.name, extra_paths=entry.extra_paths)
            except MemdError as exc:
                logger.warning("workspace %s of the configuration not added: %s", entry.path, exc)
                continue
            if known is None:
                self.start(ws)

    def save(self) -> None:
        """Write the registry file: every workspace, with the directory it was registered
        with (Workspace.root_problem), and the missing ones (kept until they come back)."""
        entries = [
            {**workspace_entry(ws), **(ws.identity.to_entry() if ws.identity else {})}
            for ws in self.all()
        ]
        entries += list(self.missing.values())
        with self._file_lock:
            save_registry(self._require_life().registry_file, entries)

    def _require_life(self) -> _Life:
        if self._life is None:
            raise RuntimeError("the workspaces are not attached to watchers and a writer")
        return self._life


def load_registry(path: Path) -> list[dict[str, Any]]:
    """Registered workspaces from ``workspaces.json`` ([] when absent or unreadable). A
    symlink or anything but a file of the user's there is refused (PathRefused)."""
    try:
        fd = open_private_file(path, os.O_RDONLY)
    except PathRefused:
        if not os.path.lexists(path):
            return []
        raise
    try:
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return []
    entries = data.get("workspaces") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("path"), str)]


def save_registry(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write the registry atomically (temp file, fsync, rename, fsync of the directory)."""
    data = json.dumps({"version": 1, "workspaces": entries}, indent=2) + "\n"
    write_atomic(path, data.encode())
