"""The reads memd offers (search, get, status), as plain Python over the indexes.

The daemon's socket layer calls these; so does the ``memd`` command for one-shot use, which
also syncs through ``sync``. It chooses the embedder and holds the workspaces (memd.registry).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from memd.config import Config
from memd.embed.base import Embedder, Vectors
from memd.embed.batch import Batches
from memd.embed.providers import OpenAIEmbedder
from memd.embed.queued import QueuedEmbedder
from memd.embed.remote import RemoteEmbedder
from memd.embed.select import Choice, choose_embedder
from memd.embed.usage import Usage
from memd.index.audit import DumpRow
from memd.index.cache import EmbeddingCache
from memd.index.db import snapshot
from memd.index.files import UNCAPPED
from memd.index.report import Progress, SyncReport
from memd.markdown.discover import discover
from memd.markdown.read import GetResult, MemoryPath, locate, read_located
from memd.readers import ReaderPool
from memd.redact import redact
from memd.registry import Workspaces
from memd.search import search
from memd.search.hits import SearchOutcome
from memd.search.options import SearchOptions
from memd.sessions import is_transcript_name, list_transcripts, read_jsonl_lines
from memd.workspace import Workspace
from memd_client.errors import BadRequest, PathRefused, ProviderUnavailable

__all__ = ["MemoryService"]

logger = logging.getLogger(__name__)

USAGE_FILE = "embedding-usage.json"  # in the state directory: what was sent to each provider
BATCHES_DIR = "batches"  # in the state directory: the Batch API jobs memd waits for


class MemoryService:
    """The reads over every workspace memd knows, with one embedder and one embedding cache."""

    def __init__(self, config: Config, *, choice: Choice | None = None) -> None:
        self.choice = choice or choose_embedder(
            config.embedding, models_dir=config.dirs.models, state_dir=config.state_dir, probe=True
        )
        inner = self.choice.embedder
        # Texts, tokens and requests sent to remote providers, kept across restarts.
        self.usage = Usage(config.state_dir / USAGE_FILE)
        self.remote = inner if isinstance(inner, RemoteEmbedder) else None
        if self.remote is not None:
            self.remote.usage = self.usage
        if inner is not None and not isinstance(inner, QueuedEmbedder):
            # One thread owns the model; searches' query embeddings jump the indexing queue.
            try:
                self.choice.embedder = QueuedEmbedder(
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
                self.remote = None
        # Reader processes for overlapping searches: the daemon sets them (memd/readers).
        self.readers: ReaderPool | None = None
        self.cache = EmbeddingCache(
            config.cache_path, max_entries=config.embedding.cache_max_entries
        )
        self.batches = self._batches(config)
        self.registry = Workspaces(
            config,
            embedder=self.embedder,
            cache=self.cache,
            protect=self.choice.protect,
            batches=self.batches,
        )
        for ws in config.workspaces:
            self.registry.open_registered(
                {
                    "path": ws.path,
                    "name": ws.name,
                    "extra_paths": list(ws.extra_paths),
                    "sessions_dir": ws.sessions_dir,
                    "agent_id": ws.agent_id,
                }
            )

    @property
    def config(self) -> Config:
        """The configuration in force; the registry holds it, so a reload reaches the writer
        (which reads it there) and the workspaces added later."""
        return self.registry.config

    @config.setter
    def config(self, config: Config) -> None:
        self.registry.config = config

    @property
    def embedder(self) -> Embedder | None:
        return self.choice.embedder

    def _batches(self, config: Config) -> Batches | None:
        """The provider's Batch API, when it has one memd speaks and it is not switched off."""
        remote = self.remote
        if not isinstance(remote, OpenAIEmbedder) or not remote.batch_api:
            return None
        if config.embedding.batch_api == "off":
            return None
        cache = self.cache

        def keep(vectors: Mapping[str, Vectors]) -> None:
            cache.put_many(remote.settings_key, remote.provider, remote.model, vectors)

        return Batches(
            remote,
            config.state_dir / BATCHES_DIR,
            keep,
            min_tokens=config.embedding.batch_min_tokens,
            poll_seconds=config.embedding.batch_poll_seconds,
        )

    def provider_costs(self) -> dict[str, Any]:
        """What status shows of the remote provider: how it is asked, what was sent to it
        (today and in total), and the batches memd waits for."""
        return {
            "requests": self.remote.describe_limits() if self.remote else None,
            "usage": self.usage.snapshot(),
            "batches": self.batches.status() if self.batches else None,
        }

    def adopt(self, choice: Choice) -> None:
        """Embed with ``choice`` from now on (a model that arrived while memd ran): every
        workspace's writer embeds with it, and an index built without it is rebuilt at its next
        sync (its identity differs), keyword search answering from the old one meanwhile."""
        inner = choice.embedder
        if inner is not None and not isinstance(inner, QueuedEmbedder):
            worker = QueuedEmbedder(inner, query_timeout=self.config.embedding.timeout_seconds)
            choice = Choice(
                worker, choice.requested, protect=choice.protect, skipped=choice.skipped
            )
        old, self.choice = self.choice.embedder, choice
        self.registry.use_embedder(choice.embedder, protect=choice.protect)
        if old is not None:
            old.close()

    def close(self) -> None:
        if self.readers is not None:
            self.readers.close()
        self.registry.close()
        self.cache.close()
        if self.embedder is not None:
            self.embedder.close()
        self.usage.flush()

    # -- workspaces -----------------------------------------------------------------------------

    # -- operations -----------------------------------------------------------------------------

    def sync(
        self, ref: str, *, force: bool = False, embed: bool = True, progress: Progress | None = None
    ) -> SyncReport:
        ws = self.registry.get(ref)
        report = ws.syncer.sync(force=force, embed=embed, progress=progress)
        return report

    def search(
        self, ref: str | Workspace, query: str, *, index_first: bool = True, **overrides: Any
    ) -> SearchOutcome:
        """Search one workspace. A never-indexed workspace gets its keyword rows first, here
        (``index_first``, for a service used without a daemon), or by the daemon's writer
        before it calls this (``index_first=False``)."""
        if not isinstance(query, str):
            raise BadRequest("query must be a string")
        ws = self._workspace(ref)
        if index_first and ws.syncer.status.last_sync is None and self.never_indexed(ws):
            self.sync(ws.name, embed=False)
        options = SearchOptions.from_config(self.config.search, **overrides)
        try:
            return self._search(ws, query, options)
        except ProviderUnavailable as exc:
            if options.mode == "keyword":
                raise
            # The query could not be embedded (the provider fails or hangs): keyword results,
            # and the reply says why.
            keyword = dataclasses.replace(options, mode="keyword")
            outcome = self._search(ws, query, keyword)
            outcome.note = f"the embedding provider failed ({exc}): keyword search only"
            return outcome

    def _search(self, ws: Workspace, query: str, options: SearchOptions) -> SearchOutcome:
        embedder = self.embedder
        if embedder is None:
            return self._searched(ws, query, options, None)
        with embedder.searching():  # searches in flight decide a local model's query cores
            return self._searched(ws, query, options, embedder)

    def _searched(
        self, ws: Workspace, query: str, options: SearchOptions, embedder: Embedder | None
    ) -> SearchOutcome:
        if self.readers is not None:
            return self.readers.search(ws.index, query, options, embedder)
        return search(ws.index, query, options, embedder=embedder)

    def _workspace(self, ref: str | Workspace) -> Workspace:
        """The workspace a request found already, or the one a name or path names."""
        return ref if isinstance(ref, Workspace) else self.registry.get(ref)

    @staticmethod
    def never_indexed(ws: Workspace) -> bool:
        """No keyword rows yet, or only part of them: the first sync has not run, or runs now
        (it records the index's identity before its first file, and commits file by file)."""
        if ws.syncer.status.filling:
            return True
        with ws.index.reader() as store:
            return store.identity() is None or not store.has_files()

    def get(
        self,
        ref: str | Workspace,
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
        ws = self._workspace(ref)
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
        ws = self.registry.get(ref)
        found = discover(  # files over the size cap too: they are indexed in part
            ws.root,
            ws.extra_paths,
            UNCAPPED,
            diary=self.config.index.diary,
        )
        state, reason = ws.syncer.state()
        # One read transaction: counts, errors and files from one moment of the index, never
        # a file pending and its vectors stored, read either side of the writer's commit.
        with ws.index.reader() as store, snapshot(store.conn):
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
        syncer = ws.syncer
        activity = syncer.status.current_activity()
        # Transcripts count among the files on disk as among those indexed; one memd cannot
        # read is skipped (and says why), never indexed with nothing in it.
        sessions = syncer.transcripts
        transcripts_on_disk = len(list_transcripts(sessions.directory)[0]) if sessions else 0
        unreadable = sorted(
            (p, why) for p, (_, _, why) in (sessions.unreadable if sessions else {}).items()
        )
        skipped = [*found.skipped, *unreadable]
        return {
            "workspace": ws.name,
            # What is being done now (None: idle): files and chunks done of total, the
            # embedding rate and an ETA. A rebuild is reported before the live index's work.
            "progress": activity.to_dict() if activity is not None else None,
            "rebuilding": syncer.status.rebuilding,
            "root": str(ws.root),
            "index_path": str(ws.index.path),
            "index_bytes": ws.index.path.stat().st_size if ws.index.path.exists() else 0,
            "generation": generation,
            "identity": {"state": state, "reason": reason, **identity},
            "files_on_disk": len(found.files) + transcripts_on_disk,
            "files_indexed": counts["files"],
            "transcripts": {
                "on_disk": transcripts_on_disk,
                "indexed": by_source.get("sessions", {}).get("files", 0),
            },
            "files_stale": len(stale) + len(removed),
            "files_pending": counts["pending_files"],
            "files_skipped": [{"path": p, "reason": r} for p, r in skipped],
            "file_errors": errors,
            "chunks": counts["chunks"],
            "sources": by_source,
            "vectors": counts["vectors"],
            "vectors_match_chunks": counts["vectors"] == counts["embedded_chunks"],
            # Skipped files are not searchable, a directory gone or replaced cannot be
            # followed, and a rebuild replaces the index: none of them is a clean index.
            "dirty": bool(
                stale
                or removed
                or counts["pending_files"]
                or state == "mismatched"
                or skipped
                or syncer.status.rebuilding
                or syncer.status.partial
                or ws.root_problem()
            ),
            "provider": {
                "requested": self.choice.requested,
                "active": self.embedder.provider if self.embedder else "none",
                "model": self.embedder.model if self.embedder else "fts-only",
                "dims": self.embedder.dims if self.embedder else 0,
                "worker": self.embedder.health() if self.embedder else None,
                "skipped": [{"provider": p, "reason": r} for p, r in self.choice.skipped],
                "last_error": ws.syncer.status.last_error,
                "line_vectors": ws.syncer.line_vectors,
            },
            "vector_store": {
                "kind": vector_store,
                "sqlite_vec": vec.available,
                "sqlite_vec_version": vec.version,
                "reason": vec.error or None,
            },
            "fts": {
                "available": True,
                "tokenizer": identity.get("fts"),
                **ws.index.keywords.report(),
            },
            "last_sync": ws.syncer.status.last_sync,
            "cache_entries": self.cache.count(),
            "checked_at": time.time(),
        }

    def dump(self, ref: str) -> list[DumpRow]:
        """The logical content of a workspace index (the oracle of rebuild tests)."""
        ws = self.registry.get(ref)
        with ws.index.reader() as store, snapshot(store.conn):
            return store.dump()
