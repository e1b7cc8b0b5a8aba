"""The registered workspaces, kept in workspaces.json in the state directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = json.dumps({"version": 1, "workspaces": entries}, indent=2) + "\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
