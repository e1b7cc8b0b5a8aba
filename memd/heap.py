"""Handing freed heap back to the operating system.

glibc keeps a process at its high-water mark: after a burst (a first index, loading the vector
sketch) the memory is free inside the process but still counted against it. ``release_memory``
collects garbage and asks glibc to return what it can (malloc_trim); elsewhere it only collects.

Under held load the daemon is never quiet for long, and its footprint crept up for minutes: one
thread per client, each allocating in one of glibc's per-thread arenas, leaves free pages spread
over all of them. ``trim_heap`` hands those back without a garbage collection, and the daemon
calls it on a timer.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import sys
from typing import Any

__all__ = ["configure_allocator", "release_memory", "trim_heap"]

logger = logging.getLogger(__name__)


# glibc serves an allocation this large or larger with a mapping of its own, returned to the OS
# when it is freed. Its default (128 KB) rises to the largest block freed, up to 32 MB, after
# which the vector sketch's load batches and the recall store's JSON land in the arenas and
# keep them at their high-water mark: at 10,000 chunks the idle daemon held 91 MB, 71 with the
# threshold fixed at 1 MiB.
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # malloc.h


def configure_allocator() -> bool:
    """Fix glibc's mmap threshold (Linux; elsewhere nothing). Called once at start, before the
    daemon's threads; returns whether the setting took."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_memory() -> None:
    """Collect garbage and return the freed heap to the OS (glibc's malloc_trim, on Linux)."""
    gc.collect()
    trim_heap()
    logger.debug("released memory after a burst of work")


def trim_heap() -> None:
    """Return the free pages of every malloc arena to the OS (Linux with glibc; else nothing)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _glibc() -> Any:
    """glibc with the two calls memd makes, or None (another C library or platform)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None
