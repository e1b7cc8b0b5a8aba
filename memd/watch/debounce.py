"""Coalesce bursts of changes into one callback after a quiet period (with a maximum wait)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from memd.changes import Changes

__all__ = ["Debouncer"]

logger = logging.getLogger(__name__)


class Debouncer:
    """Collect changes and hand them, merged, to ``callback`` once none came for ``delay_s``.

    Every ``push`` restarts the quiet-period timer. With ``max_wait_s`` the batch is delivered
    at the latest that long after its first key, so a file that is written constantly is still
    indexed. The callback always runs in the debouncer's own thread, one batch at a time; an
    exception in it is logged and the thread goes on. ``stop()`` delivers the keys still pending
    (in the debouncer thread, or in the caller when the thread was never started), so a change
    seen just before shutdown is never silently dropped.
    """

    def __init__(
        self,
        callback: Callable[[Changes], None],
        delay_s: float = 1.5,
        *,
        max_wait_s: float | None = None,
        name: str = "memd-debounce",
    ) -> None:
        if delay_s < 0 or (max_wait_s is not None and max_wait_s < 0):
            raise ValueError("delay_s and max_wait_s must not be negative")
        self._callback = callback
        self._delay_s = delay_s
        self._max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._keys = Changes()
        # The batch the callback is being given: still pending until it returns, so a reply that
        # asks in between finds it here or in the callback's own queue, never in neither.
        self._delivering = Changes()
        self._first_at = 0.0  # monotonic time of the first key of the pending batch
        self._last_at = 0.0  # monotonic time of the latest key
        self._flush = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Debouncer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the delivery thread."""
        self._thread.start()

    def should_keep_running(self) -> bool:
        """Say whether the thread should go on (False once ``stop()`` was called)."""
        return not self._stopping.is_set()

    def push(self, changes: Changes) -> None:
        """Add ``changes`` to the pending batch and restart the quiet-period timer."""
        now = time.monotonic()
        with self._cond:
            if not self._keys:
                self._first_at = now
            self._keys |= changes
            self._last_at = now
            self._cond.notify()

    def flush(self) -> None:
        """Ask for the pending keys to be delivered now, without waiting for the quiet period."""
        with self._cond:
            self._flush = True
            self._cond.notify()

    def pending(self) -> int:
        """Return how many distinct changes wait for delivery (each path, each rescan; a batch
        being delivered not counted)."""
        with self._cond:
            return len(self._keys)

    def pending_keys(self) -> Changes:
        """The changes waiting for delivery, with the batch being delivered."""
        with self._cond:
            return self._keys | self._delivering

    def stop(self, timeout: float | None = 10.0) -> None:
        """Deliver what is pending, stop the thread and join it."""
        with self._cond:
            self._stopping.set()
            self._cond.notify()
        if self._thread.ident is None:  # never started: deliver here
            self._deliver(self._take())
        elif self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning(
                    "debouncer thread %s did not stop in %ss", self._thread.name, timeout
                )

    def _due(self) -> float:
        due = self._last_at + self._delay_s
        if self._max_wait_s is not None:
            due = min(due, self._first_at + self._max_wait_s)
        return due

    def _take(self) -> Changes:
        with self._cond:
            keys, self._keys = self._keys, Changes()
            self._delivering = keys
            self._flush = False
            return keys

    def _run(self) -> None:
        while True:
            with self._cond:
                # Checked under the condition: stop() sets the flag under it too, so a stop can
                # never slip in between this check and the wait below.
                if not self.should_keep_running():
                    break
                if not self._keys:
                    self._flush = False
                    self._cond.wait()
                    continue
                wait = 0.0 if self._flush else self._due() - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
            self._deliver(self._take())
        self._deliver(self._take())

    def _deliver(self, keys: Changes) -> None:
        try:
            if keys:
                self._callback(keys)
        except Exception:
            logger.exception("debounced callback failed for %d key(s)", len(keys))
        finally:
            with self._cond:
                self._delivering = Changes()
