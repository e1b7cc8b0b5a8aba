"""``memctl doctor``: check what memd needs and name the cause (and the fix) of each problem.

Every check runs on its own and turns any exception into a ``fail`` naming it, so the doctor
itself never crashes. API keys are only ever reported as "set" or "missing", never printed.
This module runs the checks in order; what one finds is memd.ctl.doctor.check's ``Check``, and
the checks themselves are in memd.ctl.doctor.embedding and memd.ctl.doctor.system.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memd.config import Config
from memd.ctl.doctor.check import Check
from memd.ctl.doctor.embedding import SQLITE_VEC_ENV, check_keys, check_model, check_sqlite_vec
from memd.ctl.doctor.system import (
    check_daemon,
    check_disk,
    check_inotify,
    check_private_state,
    check_service,
    check_socket_dir,
    check_workspaces,
)
from memd_client.errors import ConfigError

__all__ = ["diagnose", "run_checks"]


def diagnose(
    *,
    socket: Path | None = None,
    sqlite_vec_path: str | None = None,
    load_model: bool = True,
    env: Mapping[str, str] | None = None,
) -> list[Check]:
    """Load the configuration (reporting a bad one as a check of its own) and run every check."""
    from memd_client.paths import user_dirs

    env = os.environ if env is None else env
    try:
        config = Config.load(env=env)
        if "is not read" in config.source:
            first = Check("config", "warn", config.source, f"move it to {config.config_file}")
        else:
            first = Check("config", "ok", config.source)
    except ConfigError as exc:
        config = Config(dirs=user_dirs(env))
        first = Check(
            "config",
            "fail",
            f"{exc}; the other checks use the defaults",
            "correct the file or the MEMD_* variable named above",
        )
    except Exception as exc:  # never crash: a broken config is one more finding
        config = Config(dirs=user_dirs(env))
        first = Check("config", "fail", _describe(exc), None)
    return [
        first,
        *run_checks(config, socket=socket, sqlite_vec_path=sqlite_vec_path, load_model=load_model),
    ]


def run_checks(
    config: Config,
    *,
    socket: Path | None = None,
    sqlite_vec_path: str | None = None,
    load_model: bool = True,
) -> list[Check]:
    """Run every check against ``config``; each failure names its cause, nothing raises."""
    if sqlite_vec_path is None:
        sqlite_vec_path = os.environ.get(SQLITE_VEC_ENV) or None
    if socket is None:
        socket = _guarded_socket_path()
    asked: dict[str, tuple[Check, dict[str, Any] | None]] = {}

    def ask() -> tuple[Check, dict[str, Any] | None]:
        """The running daemon's answer, asked once: the model check says what it serves."""
        if "daemon" not in asked:
            asked["daemon"] = check_daemon(socket)
        return asked["daemon"]

    status_box: list[dict[str, Any] | None] = [None]

    def daemon() -> Check:
        check, status_box[0] = ask()
        return check

    def model() -> Check:
        try:
            status = ask()[1]
        except Exception:  # the daemon check reports it; judge the model from here
            status = None
        return check_model(config, load_model=load_model, status=status)

    checks: list[tuple[str, Callable[[], Check]]] = [
        ("sqlite-vec", lambda: check_sqlite_vec(config, sqlite_vec_path)),
        ("model", model),
        ("api keys", lambda: check_keys(config)),
        ("socket directory", lambda: check_socket_dir(socket)),
        ("private state", lambda: check_private_state(config)),
        ("daemon", daemon),
        ("workspaces", lambda: check_workspaces(status_box[0])),
        ("inotify", lambda: check_inotify(config, status_box[0])),
        ("disk space", lambda: check_disk(config)),
        ("service", check_service),
    ]
    return [_guard(name, fn) for name, fn in checks]


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:
        detail = _describe(exc)
        if name == "api keys":  # belt and braces: mask anything shaped like a token
            from memd.embed.secrets import redact

            detail = redact(detail)
        return Check(name, "fail", f"the check itself failed: {detail}", None)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _guarded_socket_path() -> Path | None:
    from memd_client.paths import socket_path

    try:
        return socket_path()
    except Exception:  # reported by the socket check as "unknown"
        return None
