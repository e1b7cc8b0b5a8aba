"""One BLAS thread in the daemon.

numpy's OpenBLAS starts a thread per core and, after each product, keeps them spinning for a
while in case another follows. The daemon's products are small (a query against the vector
sketch, a few hundred stored vectors) and its parallelism comes from serving many requests at
once; the spinning threads only took CPU from those requests and from the model worker. On two
cores at 9,751 chunks a single-client hybrid search cost the daemon 49 ms of CPU with the
default pool and 21 ms with one thread, and 16 clients got 40 % more searches through.

OpenBLAS reads its thread count once, when it loads, so the limit is set through threadpoolctl
(which finds the loaded BLAS library and calls its own setter) rather than the environment.
"""

from __future__ import annotations

import logging

__all__ = ["blas_threads", "limit_blas_threads"]

logger = logging.getLogger(__name__)


def limit_blas_threads() -> int | None:
    """Limit the BLAS libraries loaded in this process to one thread; returns the largest
    thread count left (1), or None when no BLAS library is loaded or the limit cannot be set."""
    import numpy  # noqa: F401  - loads numpy's BLAS, so that the limit reaches it
    from threadpoolctl import threadpool_limits

    try:
        threadpool_limits(limits=1, user_api="blas")
    except Exception as exc:  # an unknown BLAS build: the default pool only costs CPU
        logger.warning("could not limit the BLAS thread pool: %s", exc)
        return None
    return blas_threads()


def blas_threads() -> int | None:
    """The largest thread count of the BLAS libraries loaded in this process (None: none)."""
    from threadpoolctl import threadpool_info

    counts = [int(p["num_threads"]) for p in threadpool_info() if p.get("user_api") == "blas"]
    return max(counts) if counts else None
