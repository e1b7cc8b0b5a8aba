"""Idempotency keys: the same key twice runs the work once, and the second caller gets the
first one's result (a client retrying after a timeout, whose first request may still run)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from memd_client.errors import BadRequest

__all__ = ["Once"]


class Once:
    """Results by key, each kept for ``seconds`` and at most ``kept`` of them, oldest first.

    A key comes with the request it stands for (``fingerprint``, e.g. the text to append): the
    same key with another request is a BadRequest, not a silent duplicate. A run that fails
    forgets its key, so a retry runs again.
    """

    def __init__(self, *, kept: int = 10_000, seconds: float = 600.0) -> None:
        self.kept = kept
        self.seconds = seconds
        self._slots: OrderedDict[Hashable, tuple[float, Future[dict[str, Any]], object]]
        self._slots = OrderedDict()
        self._lock = threading.Lock()

    def run(
        self,
        key: Hashable,
        fingerprint: object,
        work: Callable[[], dict[str, Any]],
        *,
        wait: float,
    ) -> tuple[dict[str, Any], bool]:
        """(the result of ``work`` for ``key``, whether it is an earlier run's)."""
        with self._lock:
            now = time.monotonic()
            while self._slots and (
                len(self._slots) > self.kept
                or next(iter(self._slots.values()))[0] < now - self.seconds
            ):
                self._slots.popitem(last=False)
            entry = self._slots.get(key)
            if entry is None:
                slot: Future[dict[str, Any]] = Future()
                self._slots[key] = (now, slot, fingerprint)
            else:
                _, slot, seen = entry
                if seen != fingerprint:
                    raise BadRequest("idempotency_key was already used for another text")
        if entry is not None:
            return dict(slot.result(timeout=wait)), True
        try:
            result = work()
        except BaseException as exc:
            with self._lock:
                self._slots.pop(key, None)  # failed: a retry may try again
            slot.set_exception(exc)
            raise
        slot.set_result(result)
        return result, False
