"""Handing freed heap back to the operating system.

glibc keeps a process at its high-water mark: after a burst (a first index, loading the vector
sketch) the memory is free inside the process but still counted against it. ``release_memory``
collects garbage and asks glibc to return what it can (malloc_trim); elsewhere it only collects.

Under held load the daemon is never quiet for long, and its footprint crept up for minutes: one
thread per client, each allocating in one of glibc's per-thread arenas, leaves free pages spread
over all of them. ``trim_heap`` hands those back without a garbage collection, and the daemon calls it
on a timer.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import sys

__all__ = ["release_memory", "trim_heap"]

logger = logging.getLogger(__name__)


def release_memory() -> None:
    """Collect garbage and return the freed heap to the OS (glibc's malloc_trim, on Linux)."""
    gc.collect()
    trim_heap()
    logger.debug("released memory after a burst of work")


def trim_heap() -> None:
    """Return the free pages of every malloc arena to the OS (Linux with glibc; else nothing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
