"""The composition root and lifecycle of ``memd run``.

Start-up: the lock and private state directory, then :func:`~memd.daemon.parts.build` wires
every part once (stores -> writer -> recorder -> watchers -> socket, last), then READY=1 to
systemd. Shutdown runs in reverse (the parts' own stack, memd/daemon/parts.py): stop accepting,
stop watchers, let the writer finish its job, close the stores and the model. Signal handlers
only record the signal; the main loop acts. What memd tells its service manager, and when it
may stop for being idle: memd/daemon/manager.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from memd.changes import Changes
from memd.clock import Clock
from memd.config import Config
from memd.daemon.manager import Idle, capture_signals, how_started, sd_notify
from memd.daemon.parts import Parts, build
from memd.embed.autopull import ModelPull, wanted
from memd.embed.select import Choice
from memd.heap import release_memory, trim_heap
from memd.ipc import AlreadyRunning, StartupError
from memd.ipc.activation import Activation, inherited_socket
from memd.ipc.server import prepare_directory
from memd.private import make_private, open_private_file, private_directory
from memd.watch import Watchers
from memd.writer.jobs import RECONCILE
from memd_client.errors import MemdError
from memd_client.paths import socket_path

__all__ = ["EXIT_ALREADY_RUNNING", "EXIT_OK", "EXIT_STARTUP_FAILURE", "Daemon"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STARTUP_FAILURE = 3
EXIT_ALREADY_RUNNING = 4

HEALTH_EVERY_S = 5.0
# After a burst of indexing or requests, how long the daemon waits for quiet before handing
# freed memory back to the OS (glibc keeps a process at its high-water mark otherwise) and
# emptying the idle readers' page caches.
RELEASE_AFTER_S = 10.0
# Under load the writer is rarely quiet for RELEASE_AFTER_S: free heap is trimmed this often
# anyway (malloc_trim alone, no garbage collection: 3 to 20 ms on a heap of 80 MB spread over
# 16 arenas, during which other threads' allocations wait).
TRIM_EVERY_S = 30.0


def _log_dream(future: Future[dict[str, Any]], *, name: str) -> None:
    exc = future.exception()
    if exc is not None:
        logger.warning("scheduled dreaming in %s failed: %s", name, exc)
        return
    r = future.result()
    logger.info(
        "dreaming in %s: %d staged, %d candidate truths, %d promoted",
        name,
        len(r["light"]["staged"]),
        len(r["rem"]["truths"]) + len(r["rem"]["lasting"]),
        len(r["deep"]["applied"]),
    )


class Daemon:
    """One memd process: every workspace, one writer, one embedder, one socket."""

    def __init__(
        self,
        config: Config,
        *,
        choice: Choice | None = None,
        socket: Path | None = None,
        debounce_ms: int | None = None,
        clock: Clock | None = None,
        idle_exit: float | None = None,
        start_lock: int | None = None,
    ) -> None:
        self.config = config
        self.choice = choice
        self.socket_path = socket or socket_path()
        # Seconds without clients or work after which a socket-activated memd stops (its
        # manager starts it again on the next connection); None: never.
        self.idle_exit = idle_exit
        self.activation: Activation | None = None  # the socket a service manager passed
        self.started: dict[str, Any] = {}  # how this memd was started, for status
        self.model_pull: ModelPull | None = None  # the model fetched in the background
        # memd.start.lock, held until the socket accepts: clients wait rather than start a
        # second memd meanwhile (memd_client.autostart).
        self._start_lock = start_lock
        self.debounce_ms = config.watch.debounce_ms if debounce_ms is None else debounce_ms
        self.should_exit = threading.Event()
        self.reload_requested = threading.Event()
        self.ready = threading.Event()
        self.watchers = Watchers(debounce_ms=self.debounce_ms)
        # Now and the user's day, for every part (tests pass one with their own time).
        self.clock = clock or Clock(config.timezone)
        self.parts: Parts | None = None  # built by startup(), closed by shutdown()
        self._lock_fds: list[int] = []
        self._umask: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Start, serve until told to stop, shut down; return the exit code. The handlers
        cover all three: ``startup`` serves the socket, so a stop may come before the loop."""
        with (
            capture_signals(self.should_exit, self.reload_requested)
            if install_signals
            else contextlib.nullcontext()
        ):
            try:
                self.startup()
            except AlreadyRunning as exc:
                logger.error("%s", exc)
                self.shutdown()
                return EXIT_ALREADY_RUNNING
            except (StartupError, MemdError, OSError) as exc:
                logger.error("memd could not start: %s", exc)
                self.shutdown()
                return EXIT_STARTUP_FAILURE
            self.main_loop()
            self.shutdown()
        return EXIT_OK

    def startup(self) -> None:
        # Indexes and their WAL hold the text of every memory file: whatever the shell's umask,
        # what memd creates is its user's alone (0700 directories, 0600 files), and what an
        # earlier install left readable to others is tightened before anything is opened.
        self._umask = os.umask(0o077)
        self._take_socket()
        self._take_lock()
        tightened = make_private(self.config.state_dir)
        if tightened:
            logger.warning(
                "made %d file(s) in %s private (they were readable by other users)",
                tightened,
                self.config.state_dir,
            )
        self.parts = parts = build(
            self.config,
            choice=self.choice,
            socket_path=self.socket_path,
            watchers=self.watchers,
            on_count=self._count,
            clock=self.clock,
            listening=self.activation.sock if self.activation else None,
            started=self.started,
        )
        self.ready.set()
        self._release_start_lock()
        if wanted(self.config, parts.service.choice):
            self.model_pull = parts.ctx.model_pull = ModelPull(self.config, self._model_ready)
            self.model_pull.start()
        sd_notify("READY=1")
        embedder, choice = parts.service.embedder, parts.service.choice
        described = embedder.describe() if embedder else "none (keyword-only)"
        if embedder is None and choice.reason and choice.requested != "none":
            described = f"none (keyword-only: {choice.reason})"
        unmet = choice.unmet(self.config.embedding)
        logger.log(
            logging.WARNING if unmet else logging.INFO,
            "memd %d ready on %s with %d workspace(s), embedder %s",
            os.getpid(),
            self.socket_path,
            len(parts.registry.all()),
            described,
        )

    def main_loop(self) -> None:
        assert self.parts is not None
        parts = self.parts
        next_health = time.monotonic() + HEALTH_EVERY_S
        next_reconcile = time.monotonic() + self.config.watch.reconcile_seconds
        watchdog_usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        next_ping = time.monotonic()
        next_dream_check = time.monotonic()
        next_sessions_check = time.monotonic()
        next_release = time.monotonic() + RELEASE_AFTER_S
        next_trim = time.monotonic() + TRIM_EVERY_S
        work_seen = 0
        idle = Idle(self.idle_exit if self.activation is not None else None)
        while not self.should_exit.wait(0.25):
            now = time.monotonic()
            if idle.expired(parts, now):
                # Nothing is taken from the socket's queue from here on: a client that came
                # meanwhile is served now, or else by the next memd.
                parts.server.pause_accepting()
                if not idle.expired(parts, now):
                    parts.server.resume_accepting()
                    continue
                logger.info(
                    "no clients and nothing to do for %s s: stopping; %s starts memd again on "
                    "the next connection",
                    self.idle_exit,
                    self.started.get("by"),
                )
                break
            busy = (
                parts.writer.jobs_done + parts.dispatcher.calls,
                any(ws.syncer.status.rebuilding for ws in parts.registry.all()),
            )
            if busy != (work_seen, False):
                work_seen = busy[0]
                next_release = now + RELEASE_AFTER_S  # not quiet yet
            elif now >= next_release:
                next_release = float("inf")  # until the next burst of work or requests
                for ws in parts.registry.all():
                    ws.index.release_memory()
                if parts.service.readers is not None:
                    parts.service.readers.stop_idle()  # they start again when searches overlap
                release_memory()
            if now >= next_trim:
                next_trim = now + TRIM_EVERY_S
                trim_heap()
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self.reload()
            if now >= next_health:
                next_health = now + HEALTH_EVERY_S
                self.watchers.check_health()
                self._open_missing(parts)
            if now >= next_reconcile:
                next_reconcile = now + self.config.watch.reconcile_seconds
                for ws in parts.registry.all():
                    parts.writer.request_sync(ws, priority=RECONCILE)
            if now >= next_sessions_check:
                next_sessions_check = now + self.config.sessions.check_seconds
                self._check_sessions(parts)
            if parts.schedule is not None and now >= next_dream_check:
                next_dream_check = now + 30
                self._maybe_dream(parts)
            if watchdog_usec and now >= next_ping:
                next_ping = now + watchdog_usec / 2e6
                sd_notify("WATCHDOG=1")

    def shutdown(self) -> None:
        sd_notify("STOPPING=1")
        self._release_start_lock()
        if self.model_pull is not None:
            self.model_pull.stop()  # a partial download is resumed at the next start
        try:
            if self.parts is not None:
                # A rebuild is abandoned first: a reindex waiting for it is answered (BUSY)
                # before its connection is closed, and nothing waits for the rebuild to finish.
                parts, self.parts = self.parts, None
                parts.writer.abandon_rebuilds()
                parts.close()
        finally:  # whatever failed in closing, the next memd may start
            while self._lock_fds:  # the lock files stay; unlinking them would reopen the race
                os.close(self._lock_fds.pop())
            if self._umask is not None:  # a daemon run inside a program (tests) gives it back
                os.umask(self._umask)
                self._umask = None

    def request_stop(self) -> None:
        self.should_exit.set()

    def reload(self) -> None:
        """SIGHUP: re-read the config; search and get settings apply at once, others on restart.
        A reload that fails keeps the old configuration and logs one line: it never stops the
        daemon."""
        try:
            new = Config.load()
        except Exception as exc:  # Config.load raises ConfigError; anything else is a bug
            logger.error("config reload failed, keeping the old one: %s", exc)
            return
        try:
            self._apply(new)
        except Exception as exc:
            logger.error("config reload failed while applying it: %s: %s", type(exc).__name__, exc)

    def _apply(self, new: Config) -> None:
        """Put a reloaded configuration in force, as far as a running daemon can."""
        if self.parts is None:
            return
        service = self.parts.service
        if (new.index, new.embedding) != (self.config.index, self.config.embedding):
            logger.warning("[index] and [embedding] changes take effect when memd restarts")
        if new.timezone != self.config.timezone:
            # Appends and dreaming follow a new time zone at once; the schedule and the recall
            # recorder keep the one they started with.
            self.clock = self.clock.in_zone(new.timezone)
            self.parts.ctx.clock = self.parts.writer.clock = self.clock
        self.config = new
        # What the running stores and embedder were built with stays; the rest applies now.
        service.config = dataclasses.replace(
            new,
            index=service.config.index,
            embedding=service.config.embedding,
            dirs=service.config.dirs,
        )
        if service.readers is not None:
            service.readers.resize(new.search.reader_processes)
        service.registry.follow(new.workspaces)
        logger.info("configuration reloaded from %s", new.source)

    # -- parts ----------------------------------------------------------------------------------

    def _release_start_lock(self) -> None:
        if self._start_lock is not None:
            os.close(self._start_lock)
            self._start_lock = None

    def _model_ready(self, choice: Choice) -> None:
        """The model fetched in the background is loaded: embed with it, and rebuild the
        indexes built without it (keyword search answers from them meanwhile)."""
        parts = self.parts
        if parts is None:
            if choice.embedder is not None:
                choice.embedder.close()
            return
        parts.service.adopt(choice)
        for ws in parts.registry.all():
            parts.writer.request_sync(ws)

    def _take_socket(self) -> None:
        """With socket activation, serve on the socket the service manager passed (at the
        path it listens on) and say so in status."""
        self.activation = inherited_socket()
        self.started = how_started(self.activation, os.environ)
        if self.activation is None:
            if self.idle_exit:
                logger.warning(
                    "idle exit is for a socket-activated memd (nothing would start this one "
                    "again): ignored"
                )
            return
        if self.idle_exit:
            self.started["idle_exit_s"] = self.idle_exit
        given = self.activation.path
        if given is not None and given != self.socket_path:
            logger.info("serving on %s, the socket %s listens on", given, self.activation.manager)
            self.socket_path = given

    def _take_lock(self) -> None:
        """One memd per state directory and per socket directory: flocks held for the life of
        the process (released on crash). Two daemons on one MEMD_HOME with different sockets
        would both write its indexes and registry; the state directory's lock refuses the second.
        """
        prepare_directory(self.socket_path.parent)
        # Not the user's, or writable by others: someone could have put a symlink in place
        # of memd.lock (truncating whatever it points to) or of an index.
        private_directory(self.config.state_dir, "state directory")
        for where, what in (
            (self.config.state_dir, f"state directory {self.config.state_dir}"),
            (self.socket_path.parent, f"socket {self.socket_path}"),
        ):
            fd = open_private_file(where / "memd.lock")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AlreadyRunning(f"memd is already running ({what})") from None
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._lock_fds.append(fd)

    def _check_sessions(self, parts: Parts) -> None:
        """Transcripts are not watched event by event: every few seconds a cheap stat pass asks
        whether one passed its delta (or went quiet) and queues a sync when it did."""
        for ws in parts.registry.all():
            try:
                if ws.syncer.sessions_due():
                    parts.writer.request_sync(ws, Changes.sessions())
            except Exception as exc:
                logger.warning("checking transcripts of %s failed: %s", ws.name, exc)

    def _maybe_dream(self, parts: Parts) -> None:
        """The scheduled dreaming (Light, REM, Deep): once per due slot (a missed slot runs
        once, at start).
        Each workspace's is a job of the writer; this loop does not wait for them."""
        if parts.schedule is None or not parts.schedule.due():
            return
        parts.schedule.mark_ran()
        parts.recorder.wait_idle()
        for ws in parts.registry.all():
            future = parts.methods.dreams.start(ws)
            future.add_done_callback(functools.partial(_log_dream, name=ws.name))

    def _open_missing(self, parts: Parts) -> None:
        """A registered workspace whose directory appeared (a drive mounted) is picked up."""
        parts.registry.appeared()

    def _count(self, n: int) -> None:
        if self.parts is not None:
            self.parts.ctx.connections = n
