"""What memd sends to each remote embedding provider: texts, tokens and requests, today and in
total, kept across restarts in a small JSON file in memd's private state.

Tokens are the provider's own count where its reply has one (OpenAI, Mistral and Voyage send
``usage``, Ollama ``prompt_eval_count``), memd's estimate otherwise (Gemini). Texts sent through
a Batch API are counted under ``"<provider> batch"``: they are billed at the batch price.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic

__all__ = ["FIELDS", "Usage"]

logger = logging.getLogger(__name__)

FIELDS = ("texts", "tokens", "requests")
DAYS_KEPT = 31
# The file is written at most this often while texts are sent, and when memd stops.
WRITE_EVERY_S = 10.0


def _zero() -> dict[str, int]:
    return dict.fromkeys(FIELDS, 0)


class Usage:
    """Thread-safe counters per provider; ``path`` None keeps them in memory only."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        today: Callable[[], date] = lambda: datetime.now().astimezone().date(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._today = today
        self._clock = clock
        self._totals: dict[str, dict[str, int]] = {}
        self._days: dict[str, dict[str, dict[str, int]]] = {}  # day -> provider -> counts
        self._dirty = False
        self._written = 0.0
        self.path: Path | None = None
        if path is not None:
            self.attach(path)

    def attach(self, path: Path) -> None:
        """Keep the counters in ``path`` from now on, adding what it already holds."""
        loaded = _load(path)
        with self._lock:
            self.path = path
            for provider, counts in loaded.get("total", {}).items():
                _add(self._totals.setdefault(provider, _zero()), counts)
            for day, providers in loaded.get("days", {}).items():
                for provider, counts in providers.items():
                    _add(self._days.setdefault(day, {}).setdefault(provider, _zero()), counts)

    def record(self, provider: str, *, texts: int = 0, tokens: int = 0, requests: int = 0) -> None:
        counts = {"texts": texts, "tokens": tokens, "requests": requests}
        day = self._today().isoformat()
        with self._lock:
            _add(self._totals.setdefault(provider, _zero()), counts)
            _add(self._days.setdefault(day, {}).setdefault(provider, _zero()), counts)
            self._dirty = True
            due = self.path is not None and self._clock() - self._written >= WRITE_EVERY_S
        if due:
            self.flush()

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{provider: {"today": counts, "total": counts}}``, providers in name order."""
        day = self._today().isoformat()
        with self._lock:
            return {
                p: {"today": dict(self._days.get(day, {}).get(p, _zero())), "total": dict(t)}
                for p, t in sorted(self._totals.items())
            }

    def flush(self) -> None:
        """Write the counters to the file now (when they changed)."""
        with self._write_lock:  # snapshots are written in the order they were taken
            with self._lock:
                if self.path is None or not self._dirty:
                    return
                for old in sorted(self._days)[:-DAYS_KEPT]:
                    del self._days[old]
                data = {"total": self._totals, "days": self._days}
                blob = json.dumps(data, sort_keys=True).encode()
                path = self.path
                self._dirty = False
                self._written = self._clock()
            try:
                write_atomic(path, blob)
            except OSError as exc:  # counting is not worth failing an embedding for
                logger.warning("cannot write %s: %s", path, exc)


def _add(into: dict[str, int], counts: dict[str, Any]) -> None:
    for name in FIELDS:
        value = counts.get(name, 0)
        if isinstance(value, int) and value > 0:
            into[name] = into.get(name, 0) + value


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring %s (%s): the counts start again", path, exc)
        return {}
    if not isinstance(data, dict):
        return {}
    total = data.get("total")
    days = data.get("days")
    total = total if isinstance(total, dict) else {}
    days = days if isinstance(days, dict) else {}
    return {
        "total": {p: c for p, c in total.items() if isinstance(c, dict)},
        "days": {
            d: {p: c for p, c in ps.items() if isinstance(c, dict)}
            for d, ps in days.items()
            if isinstance(ps, dict)
        },
    }
