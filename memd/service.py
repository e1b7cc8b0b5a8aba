"""The operations memd offers (search, get, sync, status), as plain Python over the index.

The daemon's socket layer calls these; so does the ``memd`` command for one-shot use. Each
workspace has one Index and one Syncer; writes to a workspace are serialised by its lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.config import Config
from memd.embed.base import Embedder
from memd.embed.select import Choice, choose_embedder
from memd.embed.worker import WorkerEmbedder
from memd.files import GetResult, MemoryPath, locate, read_located
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.store import DumpRow
from memd.index.sync import Progress, Syncer, SyncReport
from memd.redact import redact
from memd.search import SearchOptions, SearchOutcome, search
from memd.sessions import is_transcript_name, read_jsonl_lines
from memd.text import first_control
from memd.workspace import discover
from memd_client.errors import BadRequest, PathRefused, ProviderUnavailable, UnknownWorkspace

__all__ = ["MemoryService", "Workspace"]

logger = logging.getLogger(__name__)


@dataclass
class Workspace:
    """A workspace memd serves, with its index and its syncer (whose lock serialises writes)."""

    name: str
    root: Path
    extra_paths: tuple[str, ...]
    index: Index
    syncer: Syncer
    last_report: SyncReport | None = None
    sessions_dir: Path | None = None
    agent_id: str = ""


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


def _slug(root: Path) -> str:
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", root.name).strip("-.") or "workspace"
    return f"{name[:40]}-{digest}"


class MemoryService:
    """Every workspace memd knows, one embedder, one shared embedding cache."""

    def __init__(self, config: Config, *, choice: Choice | None = None) -> None:
        self.config = config
        self.choice = choice or choose_embedder(
            config.embedding, models_dir=config.dirs.models, state_dir=config.state_dir, probe=True
        )
        inner = self.choice.embedder
        if inner is not None and not isinstance(inner, WorkerEmbedder):
            # One thread owns the model; searches' query embeddings jump the indexing queue.
            try:
                self.choice.embedder = WorkerEmbedder(
                    inner, query_timeout=config.embedding.timeout_seconds
                )
            except ProviderUnavailable as exc:
                # A provider that must be asked for its vector size and does not answer: serve
                # keyword search (an index with vectors is kept) rather than not start at all.
                logger.warning("embedding provider %s unavailable: %s", inner.provider, exc)
                self.choice = Choice(
                    None,
                    self.choice.requested,
                    protect=True,
                    skipped=[*self.choice.skipped, (inner.provider, str(exc))],
                )
        self.cache = EmbeddingCache(
            config.cache_path, max_entries=config.embedding.cache_max_entries
        )
        self._workspaces: dict[Path, Workspace] = {}
        self._names: dict[str, Path] = {}
        # Registered workspaces whose directory is not there (an unmounted drive): kept, shown
        # in status, and opened when the directory appears.
        self.missing: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        for ws in config.workspaces:
            self.open_registered(
                {
                    "path": ws.path,
                    "name": ws.name,
                    "extra_paths": list(ws.extra_paths),
                    "sessions_dir": ws.sessions_dir,
                    "agent_id": ws.agent_id,
                }
            )

    @property
    def embedder(self) -> Embedder | None:
        return self.choice.embedder

    def close(self) -> None:
        with self._lock:
            for ws in self._workspaces.values():
                with ws.syncer.lock:
                    ws.index.close()
            self._workspaces.clear()
            self._names.clear()
        self.cache.close()
        if self.embedder is not None:
            self.embedder.close()

    # -- workspaces -----------------------------------------------------------------------------

    def add_workspace(
        self,
        path: str | Path,
        *,
        name: str = "",
        extra_paths: tuple[str, ...] = (),
        sessions_dir: str = "",
        agent_id: str = "",
    ) -> Workspace:
        """Register a workspace directory (idempotent) and open its index.

        ``sessions_dir`` adds the agent's transcripts as a second source; they belong to
        ``agent_id`` (default: the workspace name).
        """
        try:
            root = Path(path).expanduser()
        except RuntimeError:  # "~someone" for an unknown user
            raise UnknownWorkspace(f"workspace {str(path)!r} is not a directory") from None
        if "\x00" in str(root) or not root.is_dir():
            raise UnknownWorkspace(f"workspace {str(path)!r} is not a directory")
        root = root.resolve()
        if root == Path(root.anchor):
            raise BadRequest(f"{root} cannot be a workspace: choose the agent's own directory")
        name = check_name(name or root.name)
        with self._lock:
            if root in self._workspaces:
                return self._workspaces[root]
            if name in self._names and self._names[name] != root:
                raise BadRequest(f"workspace name {name!r} is already used by {self._names[name]}")
            index = Index(
                self.config.index_dir / f"{_slug(root)}.sqlite",
                use_vec=self.config.index.sqlite_vec,
            )
            index.open()
            syncer = Syncer(
                index,
                root,
                config=self.config.index,
                embedder=self.embedder,
                cache=self.cache,
                extra_paths=extra_paths,
                protect=self.choice.protect,
                sessions_dir=Path(sessions_dir).expanduser() if sessions_dir else None,
                sessions=self.config.sessions,
            )
            ws = Workspace(
                name,
                root,
                extra_paths,
                index,
                syncer,
                sessions_dir=syncer.sessions_dir,
                agent_id=agent_id or name,
            )
            self._workspaces[root] = ws
            self._names[name] = root
            logger.info("workspace %s at %s (index %s)", name, root, index.path)
            return ws

    def open_registered(self, entry: dict[str, Any]) -> Workspace | None:
        """Open a workspace from the registry or the config file; one whose directory is
        missing is remembered in ``missing`` (with a warning) instead of failing the start."""
        path = str(entry.get("path", ""))
        try:
            ws = self.add_workspace(
                path,
                name=entry.get("name") or "",
                extra_paths=tuple(entry.get("extra_paths") or ()),
                sessions_dir=entry.get("sessions_dir") or "",
                agent_id=entry.get("agent_id") or "",
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

    def remove_workspace(self, ref: str) -> bool:
        """Forget a workspace and delete its index (the Markdown is untouched)."""
        ws = self.workspace(ref)
        with self._lock:
            self._workspaces.pop(ws.root, None)
            self._names.pop(ws.name, None)
        with ws.syncer.lock:
            ws.index.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(ws.index.path) + suffix).unlink(missing_ok=True)
        logger.info("workspace %s removed", ws.name)
        return True

    def workspace(self, ref: str) -> Workspace:
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

    def workspaces(self) -> list[Workspace]:
        with self._lock:
            return list(self._workspaces.values())

    # -- operations -----------------------------------------------------------------------------

    def sync(
        self, ref: str, *, force: bool = False, embed: bool = True, progress: Progress | None = None
    ) -> SyncReport:
        ws = self.workspace(ref)
        report = ws.syncer.sync(force=force, embed=embed, progress=progress)
        ws.last_report = report
        return report

    def search(
        self, ref: str, query: str, *, index_first: bool = True, **overrides: Any
    ) -> SearchOutcome:
        """Search one workspace. A never-indexed workspace gets its keyword rows first, here
        (``index_first``, for a service used without a daemon), or by the daemon's writer
        before it calls this (``index_first=False``)."""
        if not isinstance(query, str):
            raise BadRequest("query must be a string")
        ws = self.workspace(ref)
        if index_first and ws.syncer.last_sync is None and self.never_indexed(ws):
            self.sync(ref, embed=False)
        options = SearchOptions.from_config(self.config.search, **overrides)
        try:
            return search(ws.index, query, options, embedder=self.embedder)
        except ProviderUnavailable as exc:
            if options.mode == "keyword":
                raise
            # The query could not be embedded (the provider fails or hangs): keyword results,
            # and the reply says why.
            keyword = dataclasses.replace(options, mode="keyword")
            outcome = search(ws.index, query, keyword, embedder=self.embedder)
            outcome.note = f"the embedding provider failed ({exc}): keyword search only"
            return outcome

    @staticmethod
    def never_indexed(ws: Workspace) -> bool:
        with ws.index.reader() as store:
            return store.identity() is None

    def get(
        self,
        ref: str,
        path: str,
        from_line: int = 1,
        lines: int | None = None,
        *,
        check: Callable[[MemoryPath | str], None] | None = None,
    ) -> GetResult:
        """Lines of a memory file or transcript of a workspace.

        ``check`` is the caller's access decision, given the resolved target (or a transcript's
        name): it is made once, on what will really be opened, and raises to refuse.
        """
        ws = self.workspace(ref)
        if not isinstance(path, str):
            raise BadRequest("path must be a string")
        if path.strip().startswith("sessions/"):
            if check is not None:
                check(path.strip())
            return self._get_transcript(ws, path.strip(), from_line, lines)
        target = locate(ws.root, path, ws.extra_paths)
        if check is not None:
            check(target)
        return read_located(
            target, from_line, lines or self.config.get.default_lines, self.config.get.max_chars
        )

    def _get_transcript(
        self, ws: Workspace, path: str, from_line: int, lines: int | None
    ) -> GetResult:
        """Raw JSONL lines of a transcript (search hits on transcripts cite JSONL lines)."""
        name = path[len("sessions/") :]
        if ws.sessions_dir is None or "/" in name or not is_transcript_name(name):
            raise PathRefused(
                f"path refused: {path!r} is not a session transcript of this workspace"
            )
        target = ws.sessions_dir / name
        if not target.is_file() or target.is_symlink():
            return GetResult(path, "", from_line, 0, False, None, True)
        text, count, truncated, next_from = read_jsonl_lines(
            target, from_line, lines or self.config.get.default_lines, self.config.get.max_chars
        )
        if self.config.index.redact:  # transcripts hold what tools printed: keys, tokens
            text = redact(text)
        return GetResult(path, text, from_line, count, truncated, next_from, False)

    def status(self, ref: str) -> dict[str, Any]:
        """Everything a person needs to trust (or distrust) one workspace's index."""
        ws = self.workspace(ref)
        found = discover(ws.root, ws.extra_paths, self.config.index.max_file_bytes)
        state, reason = ws.syncer.state()
        with ws.index.reader() as store:
            counts = store.counts()
            identity = store.identity() or {}
            generation = store.generation()
            vector_store = store.vector_store
            files = store.files()
            by_source = store.source_counts()
        files = {p: r for p, r in files.items() if r.source == "memory"}
        on_disk = {f.rel for f in found.files}
        stale = sorted(
            f.rel
            for f in found.files
            if f.rel not in files or not files[f.rel].same_stat(f.size, f.mtime_ns)
        )
        removed = sorted(p for p, r in files.items() if p not in on_disk and r.source == "memory")
        errors = {p: r.error for p, r in files.items() if r.error}
        vec = ws.index.vec
        return {
            "workspace": ws.name,
            "root": str(ws.root),
            "index_path": str(ws.index.path),
            "index_bytes": ws.index.path.stat().st_size if ws.index.path.exists() else 0,
            "generation": generation,
            "identity": {"state": state, "reason": reason, **identity},
            "files_on_disk": len(found.files),
            "files_indexed": counts["files"],
            "files_stale": len(stale) + len(removed),
            "files_pending": counts["pending_files"],
            "files_skipped": [{"path": p, "reason": r} for p, r in found.skipped],
            "file_errors": errors,
            "chunks": counts["chunks"],
            "sources": by_source,
            "vectors": counts["vectors"],
            "vectors_match_chunks": counts["vectors"] == counts["embedded_chunks"],
            # Skipped files are not searchable, and a vanished directory cannot be followed:
            # neither is a clean index.
            "dirty": bool(
                stale
                or removed
                or counts["pending_files"]
                or state == "mismatched"
                or found.skipped
                or not ws.root.is_dir()
            ),
            "provider": {
                "requested": self.choice.requested,
                "active": self.embedder.provider if self.embedder else "none",
                "model": self.embedder.model if self.embedder else "fts-only",
                "dims": self.embedder.dims if self.embedder else 0,
                "worker": self.embedder.health() if self.embedder else None,
                "skipped": [{"provider": p, "reason": r} for p, r in self.choice.skipped],
                "last_error": ws.syncer.last_error,
            },
            "vector_store": {
                "kind": vector_store,
                "sqlite_vec": vec.available,
                "sqlite_vec_version": vec.version,
                "reason": vec.error or None,
            },
            "fts": {"available": True, "tokenizer": identity.get("fts")},
            "last_sync": ws.syncer.last_sync,
            "cache_entries": self.cache.count(),
            "checked_at": time.time(),
        }

    def dump(self, ref: str) -> list[DumpRow]:
        """The logical content of a workspace index (the oracle of rebuild tests)."""
        ws = self.workspace(ref)
        with ws.index.reader() as store:
            return store.dump()
