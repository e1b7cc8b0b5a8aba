"""Small operations on watchdog observers: make, stop and join, name, lock, liveness."""

from __future__ import annotations

import contextlib
import logging
import threading
from contextlib import AbstractContextManager
from typing import Any

from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

__all__ = ["backend_name", "dispose", "make_observer", "observer_lock", "reader_alive"]

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 10.0


def make_observer(*, polling: bool, poll_interval_s: float) -> BaseObserver:
    """Make an unstarted native observer, or a polling one."""
    if polling:
        return PollingObserver(timeout=poll_interval_s)
    return Observer()


def dispose(observer: BaseObserver) -> None:
    """Stop an observer, started or not, with its emitters, and join its thread."""
    try:
        observer.stop()  # also stops the emitters (and inotify's reader thread), started or not
        if observer.ident is not None:
            observer.join(_JOIN_TIMEOUT_S)
            if observer.is_alive():
                logger.warning("watchdog observer did not stop within %ss", _JOIN_TIMEOUT_S)
    except Exception:
        logger.exception("could not stop a watchdog observer")


def reader_alive(observer: BaseObserver) -> bool:
    """Say whether inotify's reader thread runs: if it dies, emitters wait forever, alive."""
    reader = getattr(observer, "_inotify_fd", None)  # InotifyObserver internals (watchdog >= 2)
    return not isinstance(reader, threading.Thread) or reader.is_alive()


def backend_name(observer: BaseObserver) -> str:
    """Name the backend from the observer class: InotifyObserver -> "inotify"."""
    if isinstance(observer, PollingObserver):
        return "polling"
    return type(observer).__name__.removesuffix("Observer").lower()


def observer_lock(observer: BaseObserver) -> AbstractContextManager[Any]:
    """Return the RLock a watchdog observer holds while scheduling and dispatching."""
    lock = getattr(observer, "_lock", None)  # BaseObserver internals, stable since watchdog 0.x
    if isinstance(lock, AbstractContextManager):
        return lock
    return contextlib.nullcontext()
