"""What memd sets around llama.cpp in the model worker: the cores it may use, the load
parameters ``Llama()`` takes no argument for, and the model file's pages given back
(memd/embed/llama.py says why each matters)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memd_client.errors import ProviderUnavailable

__all__ = ["drop_mapped_pages", "model_params", "usable_cores"]

logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def drop_mapped_pages(path: Path) -> None:
    """Let go of this process's resident pages of ``path``'s read-only mappings (llama.cpp maps
    the model file); they are read again, from the page cache, when touched. Linux only: a
    no-op elsewhere, and on any error."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return
    import ctypes

    try:
        target = str(path.resolve())
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for line in maps.read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5] == target and "w" not in fields[1]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                libc.madvise(start, end - start, 4)  # MADV_DONTNEED
    except (OSError, ValueError, AttributeError) as exc:
        logger.debug("could not drop the pages of %s: %s", path.name, exc)


@contextlib.contextmanager
def model_params(llama_cpp: Any, *, extra_bufts: bool, sequences: int) -> Iterator[None]:
    """Load with llama.cpp's ``use_extra_bufts`` as asked and at most ``sequences`` texts a
    decode.

    ``Llama()`` has no argument for either: it fills its model parameters from
    ``llama_model_default_params()`` and, for embeddings, sets ``n_seq_max`` to
    ``llama_max_parallel_sequences()``; those two calls are wrapped while the model loads (the
    worker process loads one model, on one thread).
    """
    low = llama_cpp.llama_cpp
    original = low.llama_model_default_params
    original_sequences = getattr(low, "llama_max_parallel_sequences", None)
    if not extra_bufts and not hasattr(original(), "use_extra_bufts"):
        raise ProviderUnavailable(
            "this llama-cpp-python cannot turn off extra buffer types (needs >= 0.3.16)"
        )

    def safe_params() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    if not extra_bufts:
        low.llama_model_default_params = safe_params
    if original_sequences is not None:  # older releases decode one text at a time anyway
        low.llama_max_parallel_sequences = lambda: min(sequences, original_sequences())
    try:
        yield
    finally:
        low.llama_model_default_params = original
        if original_sequences is not None:
            low.llama_max_parallel_sequences = original_sequences
