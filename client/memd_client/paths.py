"""Where memd keeps per-user state, shared by the daemon and its clients (stdlib only)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

__all__ = ["Dirs", "socket_path", "user_dirs"]


class Dirs(NamedTuple):
    """The four per-user directories; ``runtime_private`` is False when no XDG runtime dir exists."""

    config: Path
    state: Path
    runtime: Path
    models: Path
    runtime_private: bool


def user_dirs(env: Mapping[str, str] | None = None) -> Dirs:
    """Resolve memd's directories: ``MEMD_HOME`` moves them all, else XDG or macOS defaults."""
    env = os.environ if env is None else env
    home_override = env.get("MEMD_HOME")
    if home_override:
        home = Path(home_override).expanduser()
        return Dirs(
            config=home / "config",
            state=home / "state",
            runtime=home / "run",
            models=home / "models",
            runtime_private=False,
        )
    home = Path(env.get("HOME") or Path.home())
    if sys.platform == "darwin" and "XDG_CONFIG_HOME" not in env:
        base = home / "Library" / "Application Support" / "memd"
        config, state, models = base, base, base / "models"
    else:
        config = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "memd"
        state = Path(env.get("XDG_STATE_HOME") or home / ".local" / "state") / "memd"
        models = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share") / "memd" / "models"
    xdg_runtime = env.get("XDG_RUNTIME_DIR")
    if xdg_runtime:
        return Dirs(config, state, Path(xdg_runtime) / "memd", models, runtime_private=True)
    return Dirs(config, state, state / "run", models, runtime_private=False)


def socket_path(env: Mapping[str, str] | None = None) -> Path:
    """The daemon's socket: ``MEMD_SOCKET`` if set, else ``memd.sock`` in the runtime dir."""
    env = os.environ if env is None else env
    explicit = env.get("MEMD_SOCKET")
    if explicit:
        return Path(explicit).expanduser()
    return user_dirs(env).runtime / "memd.sock"
