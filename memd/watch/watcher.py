"""Watch one workspace's memory files, report changed paths (debounced), and keep watching alive:
restart dead observers, and fall back to polling on watch limits or network filesystems.

Over 400 lines: the observer, its restarts and the polling fallback hand one debounce
buffer to each other.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from watchdog.observers.api import BaseObserver

from memd.changes import Changes
from memd.watch.debounce import Debouncer
from memd.watch.fstype import network_filesystem
from memd.watch.handler import WATCH_PRESSURE, ObserverHandler
from memd.watch.layout import WatchLayout
from memd.watch.observers import backend_name, dispose, make_observer, reader_alive
from memd.watch.probe import ChangeProbe, ProbeView

__all__ = ["ObserverFactory", "WatcherState", "Watchers", "WorkspaceWatcher"]

logger = logging.getLogger(__name__)

WatcherState = Literal["watching", "polling", "failed", "stopped"]
ObserverFactory = Callable[[bool], BaseObserver]
"""Make an unstarted observer; the argument says whether a polling one is wanted."""

_MAX_RESTARTS = 3  # more restarts than this within the window: native watching is given up
_RESTART_WINDOW_S = 60.0


class WorkspaceWatcher:
    """Watch MEMORY.md/memory.md, memory/ and the extra paths of one workspace.

    ``on_change`` receives Changes: workspace-relative paths ("memory/x.md", "../notes/y.md" for
    an extra path outside the workspace), and a rescan of the whole workspace when a directory
    changed or events may have been lost. It runs in the debouncer thread, and may run once more during
    ``stop()`` with the keys still pending. Events are hints: the daemon's periodic rescan
    stays the source of truth (watchdog drops inotify overflows silently, #654).
    """

    def __init__(
        self,
        root: Path,
        extra_paths: Sequence[str],
        on_change: Callable[[Changes], None],
        *,
        debounce_ms: int = 1500,
        max_wait_ms: int | None = 10_000,
        polling: bool = False,
        poll_interval_s: float = 2.0,
        observer_factory: ObserverFactory | None = None,
    ) -> None:
        """Prepare the watcher; nothing runs until ``start()``.

        Args:
            max_wait_ms: deliver at the latest this long after the first pending event, even if
                events keep coming (None: only after a quiet period).
            observer_factory: a seam for tests to inject failures (e.g. ENOSPC) that cannot be
                triggered for real; the default makes a native Observer or a PollingObserver.
        """
        self._layout = WatchLayout.build(root, extra_paths)
        self._debouncer = Debouncer(
            on_change,
            debounce_ms / 1000,
            max_wait_s=None if max_wait_ms is None else max_wait_ms / 1000,
            name="memd-watch-debounce",
        )
        self._poll_interval_s = poll_interval_s
        self._factory = observer_factory or self._make_observer
        self._lock = threading.Lock()  # start/stop/check_health; the event handler never takes it
        self._observer: BaseObserver | None = None
        self._handler: ObserverHandler | None = None
        self._use_polling = polling
        self._started = False
        self._stopped = False
        self._warned = False
        self._restart_times: collections.deque[float] = collections.deque()
        self._state: WatcherState = "stopped"
        self._backend: str | None = None
        self._poll_reason: str | None = "polling requested" if polling else None
        self._reason: str | None = None
        self._restarts = 0
        self._last_event_at: float | None = None
        # Read by replies that claim freshness (memd/watch/probe.py); None while polling.
        self._probe: ChangeProbe | None = None
        self._probe_warned = False
        self._probe_failure: str | None = None
        self._rescan_at: float | None = None

    @property
    def state(self) -> WatcherState:
        return self._state

    @property
    def backend(self) -> str | None:
        """The observer in use: "inotify", "fsevents", "kqueue", "windowsapi" or "polling"."""
        return self._backend

    @property
    def reason(self) -> str | None:
        """Why the watcher polls or failed (None while watching natively)."""
        return self._reason

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def last_event_at(self) -> float | None:
        """Wall-clock time of the last create/modify/delete/move event, reported or not."""
        return self._last_event_at

    @property
    def observer(self) -> BaseObserver | None:
        """The current watchdog observer, for diagnostics and tests."""
        return self._observer

    def pending(self) -> int:
        """Return how many keys wait for the debounce."""
        return self._debouncer.pending()

    def pending_keys(self) -> Changes:
        """The changes waiting for the debounce."""
        return self._debouncer.pending_keys()

    def flush(self) -> None:
        """Deliver the pending keys now instead of after the debounce delay."""
        self._debouncer.flush()

    def probe(self) -> ProbeView | None:
        """Every change made so far that is not known indexed, read from the change probe now;
        None when nothing can vouch for the workspace (polling, no inotify, the probe lost)."""
        probe = self._probe
        if probe is None or self._state != "watching":
            return None
        return probe.view()

    def settle(self, clean: set[str]) -> None:
        """Tell the probe that ``clean`` (keys it reported) are indexed as they are on disk."""
        probe = self._probe
        if probe is not None:
            probe.settle(clean)

    def start(self) -> None:
        """Start watching; on watch limits or a network filesystem, poll instead. Never raises."""
        with self._lock:
            if self._started or self._stopped:
                return
            self._started = True
            self._debouncer.start()
            if not self._use_polling:
                fstype = network_filesystem(self._layout.root)
                if fstype is not None:
                    self._use_polling = True
                    self._poll_reason = (
                        f"network filesystem ({fstype}): native events miss remote changes"
                    )
                    logger.warning(
                        "workspace %s: %s; polling", self._layout.root, self._poll_reason
                    )
            self._launch_or_fall_back()
            self._tend_probe(first=True)
            logger.info(
                "watching %s: %s (%s)", self._layout.root, self._state, self._backend or "none"
            )

    def stop(self) -> None:
        """Stop and join the observer and the debouncer (pending keys are delivered). Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            observer, self._observer, self._handler = self._observer, None, None
            self._state = "stopped"
            probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()
        if observer is not None:
            dispose(observer)
        # Outside the lock: on_change may still run here and may read this watcher.
        self._debouncer.stop()

    def check_health(self) -> bool:
        """Restart a dead observer or emitter, or fall back to polling; True if all was well.

        Called periodically by the daemon. After any restart the whole workspace is rescanned
        (a rescan is pushed), since events may have been lost. Never raises.
        """
        try:
            with self._lock:
                try:
                    return self._check()
                finally:
                    self._tend_probe()
        except Exception:
            logger.exception("file watcher health check failed")
            return False

    def _check(self) -> bool:
        if not self._started or self._stopped:
            return True
        observer, handler = self._observer, self._handler
        if not os.path.isdir(self._layout.root):
            if observer is not None:
                self._observer = self._handler = None
                dispose(observer)
                self._fail("workspace directory is missing")
                self._push(Changes.everything())
            return False
        if observer is None or handler is None:  # failed earlier: try again
            self._launch_or_fall_back()
            if self._observer is not None:
                logger.info("file watcher recovered: %s", self._state)
                self._push(Changes.everything())
            return False
        problem: str | None = None
        if not observer.is_alive():
            problem = "the observer thread died"
        elif not reader_alive(observer):
            problem = "the inotify reader thread died"
        elif crashed := handler.crashed_emitters():
            problem = f"the emitter thread for {crashed[0]} died"
        elif handler.failure is not None:
            problem = handler.failure
        if problem is None:
            if handler.sync_watches():
                self._push(Changes.everything())
            return True
        self._restart(observer, problem)
        return False

    def _restart(self, observer: BaseObserver, problem: str) -> None:
        logger.error("file watcher (%s): %s; restarting it and rescanning", self._backend, problem)
        self._observer = self._handler = None
        dispose(observer)
        self._restarts += 1
        now = time.monotonic()
        self._restart_times.append(now)
        while self._restart_times and now - self._restart_times[0] > _RESTART_WINDOW_S:
            self._restart_times.popleft()
        if not self._use_polling and len(self._restart_times) > _MAX_RESTARTS:
            count = len(self._restart_times)
            self._fall_back(f"observer restarted {count} times within 60 s ({problem})")
        else:
            self._launch_or_fall_back()
        self._push(Changes.everything())

    def _launch_or_fall_back(self) -> None:
        try:
            self._launch(polling=self._use_polling)
        except OSError as exc:
            if not self._use_polling and exc.errno in WATCH_PRESSURE:
                self._fall_back(WATCH_PRESSURE[exc.errno])
            else:
                self._fail(_describe(exc))
        except Exception as exc:
            self._fail(_describe(exc))

    def _fall_back(self, reason: str) -> None:
        self._use_polling = True
        self._poll_reason = reason
        if not self._warned:
            self._warned = True
            logger.warning("file watcher for %s: %s; polling instead", self._layout.root, reason)
        else:
            logger.info("file watcher for %s: %s; polling instead", self._layout.root, reason)
        try:
            self._launch(polling=True)
        except Exception as exc:
            self._fail(f"{reason}; polling failed too: {_describe(exc)}")

    def _fail(self, reason: str) -> None:
        again = self._state == "failed" and self._reason == reason
        self._state = "failed"
        self._reason = reason
        # Retried on every health check: say it once, not every few seconds.
        logger.log(
            logging.DEBUG if again else logging.WARNING,
            "file watcher for %s failed: %s",
            self._layout.root,
            reason,
        )

    def _launch(self, *, polling: bool) -> None:
        """Make, schedule and start an observer, or clean it up and raise."""
        if not os.path.isdir(self._layout.root):
            raise FileNotFoundError(f"workspace directory is missing: {self._layout.root}")
        observer = self._factory(polling)
        handler = ObserverHandler(self._layout, observer, self._push, self._touch)
        try:
            handler.schedule_initial()
            observer.start()
        except BaseException:
            dispose(observer)
            raise
        self._observer, self._handler = observer, handler
        self._backend = backend_name(observer)
        if self._backend == "polling":
            self._state = "polling"
            self._reason = self._poll_reason or "no native file watcher on this platform"
        else:
            self._state = "watching"
            self._reason = None

    def _tend_probe(self, *, first: bool = False) -> None:
        """Read the probe (its queue stays short between replies), start one where the watcher
        watches natively and none runs, and close it where the watcher does not."""
        native = self._state == "watching" and self._backend == "inotify" and not self._stopped
        probe = self._probe
        if probe is not None and probe.dead is None and native:
            probe.view()
            if probe.dead is None:
                return
        if probe is not None:
            probe.close()
            self._probe = None
        if not native or not os.path.isdir(self._layout.root):
            return
        probe = ChangeProbe(self._layout, self._probed)
        if probe.start():
            self._probe, self._probe_failure = probe, None
            if not first:
                self._push(Changes.everything())  # what changed while no probe ran
            return
        self._probe_failure = probe.dead
        if not self._probe_warned:  # retried at each health check, said once
            self._probe_warned = True
            logger.warning(
                "workspace %s: %s; replies are fresh only after a rescan (wait_ms)",
                self._layout.root,
                probe.dead,
            )

    def _probed(self, keys: Changes) -> None:
        # What the probe saw goes to the writer too: watchdog may have dropped it.
        self._push(keys)

    def _push(self, changes: Changes) -> None:
        if changes.rescan_all:
            self._rescan_at = time.time()  # before the push: a rescan that starts later sees it
        self._debouncer.push(changes)

    @property
    def rescan_at(self) -> float | None:
        """Wall-clock time of the last rescan asked for (a folder changed, events lost)."""
        return self._rescan_at

    @property
    def probe_error(self) -> str | None:
        """Why no change probe runs while the watcher watches natively, if none does."""
        probe = self._probe
        return self._probe_failure if probe is None else probe.dead

    def _make_observer(self, polling: bool) -> BaseObserver:
        return make_observer(polling=polling, poll_interval_s=self._poll_interval_s)

    def _touch(self) -> None:
        self._last_event_at = time.time()


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Watchers:
    """One WorkspaceWatcher per watched workspace root, started and stopped together."""

    def __init__(self, *, debounce_ms: int) -> None:
        self.debounce_ms = debounce_ms
        self._watchers: dict[Path, WorkspaceWatcher] = {}
        self._lock = threading.Lock()

    def watch(
        self, root: Path, extra_paths: Sequence[str], changed: Callable[[Changes], None]
    ) -> None:
        """Watch ``root`` (and its extra paths), reporting changed keys to ``changed``; a root
        already watched is left as it is."""
        with self._lock:
            if root in self._watchers:
                return
            watcher = WorkspaceWatcher(root, extra_paths, changed, debounce_ms=self.debounce_ms)
            self._watchers[root] = watcher
        watcher.start()

    def unwatch(self, root: Path) -> None:
        with self._lock:
            watcher = self._watchers.pop(root, None)
        if watcher is not None:
            watcher.stop()

    def check_health(self) -> None:
        """Restart or fall back the watchers whose native watching failed."""
        with self._lock:
            watchers = list(self._watchers.values())
        for watcher in watchers:
            watcher.check_health()

    def probe(self, root: Path) -> ProbeView | None:
        """The change probe of the watcher of ``root``, read now (None: none can vouch)."""
        with self._lock:
            watcher = self._watchers.get(root)
        return watcher.probe() if watcher is not None else None

    def settle(self, root: Path, clean: set[str]) -> None:
        with self._lock:
            watcher = self._watchers.get(root)
        if watcher is not None:
            watcher.settle(clean)

    def state(self, root: Path) -> dict[str, Any]:
        """What status shows of the watcher of ``root``."""
        with self._lock:
            watcher = self._watchers.get(root)
        if watcher is None:
            return {"state": "stopped", "backend": None, "reason": None, "pending": 0}
        return {
            "state": watcher.state,
            "backend": watcher.backend,
            "reason": watcher.reason,
            "restarts": watcher.restarts,
            "pending": watcher.pending(),
            "pending_keys": watcher.pending_keys(),
            "last_event_at": watcher.last_event_at,
            "rescan_at": watcher.rescan_at,
            "probe_error": watcher.probe_error,
        }

    def stop(self) -> None:
        with self._lock:
            watchers = list(self._watchers.values())
            self._watchers.clear()
        for watcher in watchers:
            watcher.stop()
