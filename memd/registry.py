"""The registered workspaces, kept in workspaces.json in the state directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic

__all__ = ["load_registry", "save_registry"]


def load_registry(path: Path) -> list[dict[str, Any]]:
    """Registered workspaces from ``workspaces.json`` ([] when absent or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return []
    return [
        e
        for e in data.get("workspaces", [])
        if isinstance(e, dict) and isinstance(e.get("path"), str)
    ]


def save_registry(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write the registry atomically (temp file, fsync, rename, fsync of the directory)."""
    data = json.dumps({"version": 1, "workspaces": entries}, indent=2) + "\n"
    write_atomic(path, data.encode())
