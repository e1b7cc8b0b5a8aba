"""The workspaces' records: every open workspace by root and by name, the registered ones
whose directory is missing, and what opening one makes (its index, its syncer, its dreaming
folder), changing its settings, finding and removing it.

Its own module: what a workspace is registered as, apart from its life (watched, synced,
saved to the registry file: memd/registry/__init__.py), which these records know nothing of.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from memd.config import Config, refused_directory, refused_extra_path
from memd.dreams.place import DreamPlace
from memd.embed.base import Embedder
from memd.embed.batch import Batches
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.workspace import (
    DirIdentity,
    Workspace,
    check_name,
    check_walked,
    directory,
    dreams_folder,
    index_file,
)
from memd_client.errors import BadRequest, UnknownWorkspace

__all__ = ["WorkspaceRecords"]

logger = logging.getLogger(__name__)


class WorkspaceRecords:
    """The records of every open workspace, by root and by name, and of the registered ones
    whose directory is missing: opening one (its index and syncer), changing, finding and
    removing it, under one lock."""

    def __init__(
        self,
        config: Config,
        *,
        embedder: Embedder | None,
        cache: EmbeddingCache | None,
        protect: bool,
        batches: Batches | None = None,
    ) -> None:
        self.config = config
        self.embedder = embedder
        self.cache = cache
        self.protect = protect
        self.batches = batches
        self._workspaces: dict[Path, Workspace] = {}
        self._names: dict[str, Path] = {}
        self.missing: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()  # the registry file's writes (Workspaces.save)

    def add(
        self,
        path: str | Path,
        *,
        name: str = "",
        extra_paths: tuple[str, ...] = (),
        sessions_dir: str = "",
        agent_id: str = "",
        identity: DirIdentity | None = None,
    ) -> Workspace:
        """Register a workspace directory (idempotent) and open its index.

        ``sessions_dir`` adds the agent's transcripts as a second source; they belong to
        ``agent_id`` (default: the workspace name). ``identity``: the directory's when it was
        registered (from the registry file); by default the directory's now.
        """
        root = directory(path)
        if root is None:
            raise UnknownWorkspace(f"workspace {str(path)!r} is not a directory")
        why = refused_directory(root)
        if why is not None:
            raise BadRequest(f"{root} cannot be a workspace: {why}; choose the agent's own folder")
        check_walked(root, extra_paths, sessions_dir)
        name = check_name(name or root.name)
        with self._lock:
            if root in self._workspaces:
                return self._workspaces[root]
            if name in self._names and self._names[name] != root:
                raise BadRequest(f"workspace name {name!r} is already used by {self._names[name]}")
            index = Index(index_file(self.config, root), use_vec=self.config.index.sqlite_vec)
            index.open()
            syncer = Syncer(
                index,
                root,
                config=self.config.index,
                embedder=self.embedder,
                cache=self.cache,
                extra_paths=extra_paths,
                protect=self.protect,
                sessions_dir=Path(sessions_dir).expanduser() if sessions_dir else None,
                sessions=self.config.sessions,
                batches=self.batches,
            )
            ws = Workspace(
                name,
                root,
                extra_paths,
                index,
                syncer,
                sessions_dir=syncer.sessions_dir,
                agent_id=agent_id or name,
                identity=identity or DirIdentity.of(root),
                dreams=DreamPlace(root, dreams_folder(self.config, root)),
            )
            try:
                ws.dream_place.prepare()
            except OSError as exc:  # dreaming says so when it runs; searching goes on
                logger.warning("%s: cannot prepare its dreaming folder: %s", name, exc)
            self._workspaces[root] = ws
            self._names[name] = root
            logger.info("workspace %s at %s (index %s)", name, root, index.path)
            return ws

    def find_root(self, path: str | Path) -> Workspace | None:
        """The registered workspace at directory ``path`` (resolved), if there is one."""
        root = directory(path)
        if root is None:
            return None
        with self._lock:
            return self._workspaces.get(root)

    def update(
        self,
        ws: Workspace,
        *,
        name: str = "",
        extra_paths: tuple[str, ...] | None = None,
        sessions_dir: str = "",
        agent_id: str = "",
    ) -> list[str]:
        """Change the settings of a registered workspace (those given; the rest stay) and
        return which changed. A new syncer takes over when what is indexed changes: the
        caller queues a full sync. Refused while a rebuild runs (it holds the old settings)."""
        new_name = check_name(name) if name else ws.name
        check_walked(ws.root, extra_paths or (), sessions_dir)
        new_extra = ws.extra_paths if extra_paths is None else extra_paths
        new_sessions = Path(sessions_dir).expanduser() if sessions_dir else ws.sessions_dir
        new_agent = agent_id or ws.agent_id
        changed = [
            field
            for field, old, new in (
                ("name", ws.name, new_name),
                ("extra_paths", ws.extra_paths, new_extra),
                ("sessions_dir", ws.sessions_dir, new_sessions),
                ("agent_id", ws.agent_id, new_agent),
            )
            if old != new
        ]
        if not changed:
            return []
        with self._lock:
            if new_name != ws.name and self._names.get(new_name, ws.root) != ws.root:
                raise BadRequest(
                    f"workspace name {new_name!r} is already used by {self._names[new_name]}"
                )
            if {"extra_paths", "sessions_dir"} & set(changed):
                old = ws.syncer
                with old.lock:
                    if old.status.rebuilding:
                        raise BadRequest(f"{ws.name} is being rebuilt; change its settings after")
                    ws.syncer = Syncer(
                        ws.index,
                        ws.root,
                        config=self.config.index,
                        embedder=self.embedder,
                        cache=self.cache,
                        extra_paths=new_extra,
                        protect=self.protect,
                        sessions_dir=new_sessions,
                        sessions=self.config.sessions,
                        batches=self.batches,
                    )
            self._names.pop(ws.name, None)
            self._names[new_name] = ws.root
            ws.name, ws.extra_paths, ws.sessions_dir, ws.agent_id = (
                new_name,
                new_extra,
                new_sessions,
                new_agent,
            )
        logger.info("workspace %s at %s: changed %s", ws.name, ws.root, ", ".join(changed))
        return changed

    def open_registered(self, entry: dict[str, Any]) -> Workspace | None:
        """Open a workspace from the registry or the config file; one whose directory is
        missing is remembered in ``missing`` (with a warning) instead of failing the start."""
        path = str(entry.get("path", ""))
        extra = tuple(str(e) for e in entry.get("extra_paths") or ())
        refused = [e for e in extra if refused_extra_path(Path(path).expanduser(), e)]
        if refused:  # written by a memd that allowed them: the workspace opens without them
            logger.warning("workspace %s: extra paths %s left out (too broad)", path, refused)
            extra = tuple(e for e in extra if e not in refused)
        try:
            ws = self.add(
                path,
                name=entry.get("name") or "",
                extra_paths=extra,
                sessions_dir=entry.get("sessions_dir") or "",
                agent_id=entry.get("agent_id") or "",
                identity=DirIdentity.from_entry(entry),
            )
        except UnknownWorkspace:
            if path not in self.missing:
                logger.warning("workspace %s is not there (yet); kept, and opened when it is", path)
            self.missing[path] = dict(entry)
            return None
        except BadRequest as exc:
            if not entry.get("name"):
                logger.warning("registered workspace %s skipped: %s", path, exc)
                return None
            logger.warning("registered workspace %s: %s; using its directory's name", path, exc)
            return self.open_registered({**entry, "name": ""})
        self.missing.pop(path, None)
        return ws

    def open_missing(self) -> list[Workspace]:
        """Open the missing workspaces whose directories have appeared; return them."""
        opened = []
        for entry in list(self.missing.values()):
            if Path(str(entry["path"])).expanduser().is_dir():
                ws = self.open_registered(entry)
                if ws is not None:
                    opened.append(ws)
        return opened

    def forget_missing(self, ref: str) -> bool:
        """Drop a missing workspace from the registry by its name or path."""
        for path, entry in list(self.missing.items()):
            if ref in (path, entry.get("name")):
                del self.missing[path]
                return True
        return False

    def remove(self, ref: str) -> bool:
        """Forget a workspace and delete its index (the Markdown is untouched)."""
        ws = self.get(ref)
        with self._lock:
            self._workspaces.pop(ws.root, None)
            self._names.pop(ws.name, None)
        with ws.syncer.lock:
            ws.index.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(ws.index.path) + suffix).unlink(missing_ok=True)
        logger.info("workspace %s removed", ws.name)
        return True

    def get(self, ref: str) -> Workspace:
        """Find a registered workspace by name or by path; nothing is registered here (a
        search, get or current directory never registers a workspace on its own)."""
        if not isinstance(ref, str) or not ref:
            raise BadRequest("workspace must be a non-empty string")
        with self._lock:
            if ref in self._names:
                return self._workspaces[self._names[ref]]
        # Only absolute paths: a "~user" reference would be expanded against the daemon's
        # passwd database (and raises for unknown users); clients send absolute paths.
        candidate = Path(ref)
        if "\x00" not in ref and candidate.is_absolute():
            with self._lock:
                found = self._workspaces.get(candidate)
                if found is None and candidate.is_dir():
                    found = self._workspaces.get(candidate.resolve())
            if found is not None:
                return found
            if candidate.is_dir():
                raise UnknownWorkspace(
                    f"{ref} is not a registered workspace; add it with: memctl workspace add {ref}"
                )
        raise UnknownWorkspace(f"unknown workspace {ref!r} (not a registered name or a directory)")

    def use_embedder(self, embedder: Embedder | None, *, protect: bool) -> None:
        """Embed every workspace (and those added later) with ``embedder`` from now on."""
        with self._lock:
            self.embedder, self.protect = embedder, protect
            for ws in self._workspaces.values():
                ws.syncer.use_embedder(embedder, protect=protect)

    def all(self) -> list[Workspace]:
        with self._lock:
            return list(self._workspaces.values())

    def close(self) -> None:
        with self._lock:
            for ws in self._workspaces.values():
                with ws.syncer.lock:
                    ws.index.close()
            self._workspaces.clear()
            self._names.clear()
