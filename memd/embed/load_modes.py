"""The load modes a local model is tried in, and which of them works on this CPU, remembered.

A worker that dies loading a model, or on its first embedding, is started again in a safer
mode (memd/embed/process.py). Which modes there are, in which order, and the small file that
remembers per model file and CPU the mode that worked, are what the supervisor consults; they
are their own module so the state machine reads alone.
"""

from __future__ import annotations

import hashlib
import json
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic

__all__ = ["MODES", "LoadMode", "ModeMemory", "cpu_signature"]


@dataclass(frozen=True)
class LoadMode:
    name: str
    extra_bufts: bool
    one_thread: bool
    label: str


# Tried in this order while the worker keeps dying on load or on its first embedding.
MODES = (
    LoadMode("default", True, False, "default settings"),
    LoadMode("safe", False, False, "safe mode: extra buffer types off"),
    LoadMode("safe-1-thread", False, True, "safe mode: extra buffer types off, one thread"),
)
_MODE_INDEX = {m.name: i for i, m in enumerate(MODES)}


def cpu_signature() -> str:
    """A short hash naming this CPU: the kernels llama.cpp picks depend on its model and flags."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("vendor_id", "model name", "flags", "Features", "CPU part"):
                    parts.append(value.strip())
                elif not line.strip() and len(parts) > 2:
                    break  # the first processor is enough
    except OSError:
        pass
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class ModeMemory:
    """Which load mode works for which model file on which CPU, kept in one small JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._read().get(key)
        return entry if isinstance(entry, dict) and entry.get("mode") in _MODE_INDEX else None

    def put(self, key: str, mode: str, reason: str) -> None:
        with self._lock:
            data = self._read()
            data[key] = {"mode": mode, "reason": reason, "at": int(time.time())}
            write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True).encode())

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
