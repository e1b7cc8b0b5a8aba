"""memd under launchd: a LaunchAgent with a socket, rendered, installed, removed, inspected.

The plist's ``Sockets`` entry makes launchd listen on memd's socket and start memd on the first
connection (memd takes the socket with ``launch_activate_socket``, memd/ipc/activation.py), so
memd is there whenever a client asks; ``RunAtLoad`` starts it at login too. The copy shipped in
``launchd/`` is this rendering for default paths, and a test keeps them identical.
"""

from __future__ import annotations

import os
import plistlib
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memd.ctl.servicebase import (
    Runner,
    ServiceError,
    file_state,
    home,
    prepare,
    run,
    secrets_left_out,
    service_socket,
    why,
    would,
    write,
)

__all__ = [
    "LAUNCHD_LABEL",
    "install",
    "launchd_log_path",
    "launchd_plist",
    "launchd_plist_path",
    "status",
    "uninstall",
]

LAUNCHD_LABEL = "dev.memd.memd"
SOCKET_NAME = "Listeners"  # memd/ipc/activation.py asks launchd for the sockets of this name

_DEFAULT_LAUNCHD_PATH = (
    "/usr/local/bin",
    "/opt/homebrew/bin",
    "/usr/bin",
    "/bin",
    "/usr/sbin",
    "/sbin",
)


def launchd_plist(
    executable: Path,
    *,
    log_path: Path,
    socket: Path,
    environment: Mapping[str, str] | None = None,
) -> bytes:
    """The LaunchAgent running ``<executable> run``, started by launchd on a connection to
    ``socket`` as well as at login; launchd expands no ``~``, so paths are absolute."""
    if not all(p.is_absolute() for p in (executable, log_path, socket)):
        raise ServiceError(
            f"launchd needs absolute paths, got {executable}, {log_path} and {socket}"
        )
    search_path: list[str] = []
    for entry in (str(executable.parent), *_DEFAULT_LAUNCHD_PATH):
        if entry not in search_path:
            search_path.append(entry)
    env = {"PATH": ":".join(search_path), "PYTHONUNBUFFERED": "1", **(environment or {})}
    plist: dict[str, Any] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": [str(executable), "run"],
        "RunAtLoad": True,
        # launchd listens on memd's socket and starts memd on a connection while it is not
        # running (after an idle exit, a crash); memd serves on the socket launchd hands it.
        "Sockets": {
            SOCKET_NAME: {
                "SockPathName": str(socket),
                "SockPathMode": 0o600,
                "SockType": "stream",
                "SockFamily": "Unix",
            }
        },
        # Restart after a crash, stay down after a clean exit (`memctl service uninstall`, SIGTERM).
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Background",
        "ThrottleInterval": 10,
        "ExitTimeOut": 30,
        "SoftResourceLimits": {"NumberOfFiles": 4096},
        # 0077: what memd creates (indexes, WAL, the cache) is readable by its user only.
        "Umask": 0o077,
        "StandardOutPath": str(log_path),
        "StandardErrorPath": str(log_path),
        "EnvironmentVariables": env,
    }
    return plistlib.dumps(plist, sort_keys=True)


def launchd_plist_path() -> Path:
    return home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def launchd_log_path() -> Path:
    return home() / "Library" / "Logs" / "memd.log"


def _gui_domain() -> str:
    return f"gui/{os.getuid()}"


def _expected(exe: Path, env: dict[str, str]) -> bytes:
    return launchd_plist(
        exe, log_path=launchd_log_path(), socket=service_socket(os.environ), environment=env
    )


# --- install -----------------------------------------------------------------------------------


def install(
    exe: Path, env: dict[str, str], *, dry_run: bool, force: bool, runner: Runner
) -> list[str]:
    """Write the LaunchAgent and bootstrap it (booting out a loaded copy first)."""
    path, log, sock = launchd_plist_path(), launchd_log_path(), service_socket(os.environ)
    data = _expected(exe, env)
    action = prepare(path, data, force=force)
    domain = _gui_domain()
    service = f"{domain}/{LAUNCHD_LABEL}"
    notes = secrets_left_out(os.environ)
    if dry_run:
        commands = [
            f"launchctl bootout {service} (if loaded)",
            f"launchctl enable {service}",
            f"launchctl bootstrap {domain} {path}",
        ]
        return would([(action, f"{path} (logs to {log})", data)], commands, notes)
    lines: list[str] = list(notes)
    if action == "same":
        lines.append(f"{path} is up to date")
    else:
        write(path, data)
        lines.append(f"{'replaced' if action == 'replace' else 'wrote'} {path} (logs to {log})")
    log.parent.mkdir(parents=True, exist_ok=True)  # launchd creates the file, not its folder
    sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # nor the socket's
    loaded = run(runner, ["launchctl", "print", service])
    if loaded is None:
        raise ServiceError(
            f"launchctl not available: the plist was written to {path}; start memd with "
            "`memd run` (or let a client start it)",
            lines,
        )
    if loaded.returncode == 0:
        cmd = ["launchctl", "bootout", service]
        run(runner, cmd)  # "not loaded" races are fine: bootstrap below reports real trouble
        lines.append("ran: " + " ".join(cmd))
    enable = ["launchctl", "enable", service]  # a disabled label refuses to bootstrap
    run(runner, enable)
    lines.append("ran: " + " ".join(enable))
    bootstrap = ["launchctl", "bootstrap", domain, str(path)]
    result = run(runner, bootstrap)
    for _ in range(4):  # bootout finishes asynchronously; bootstrap fails (EIO) until it has
        if result is None or result.returncode == 0 or loaded.returncode != 0:
            break
        time.sleep(0.5)
        result = run(runner, bootstrap)
    if result is None or result.returncode != 0:
        raise ServiceError(
            f"`{' '.join(bootstrap)}` failed: {why(result, 'launchctl')}; see {log}", lines
        )
    lines.append("ran: " + " ".join(bootstrap))
    lines.append(f"memd is running under launchd, which also listens on {sock} (logs: {log})")
    return lines


# --- uninstall ---------------------------------------------------------------------------------


def uninstall(*, dry_run: bool, runner: Runner) -> list[str]:
    """Boot memd's LaunchAgent out and remove its plist."""
    path = launchd_plist_path()
    service = f"{_gui_domain()}/{LAUNCHD_LABEL}"
    bootout = ["launchctl", "bootout", service]
    if dry_run:
        return [f"would run: {' '.join(bootout)}", f"would remove {path}"]
    lines: list[str] = []
    result = run(runner, bootout)
    if result is None:
        lines.append("launchctl not available; stop a running `memd run` yourself")
    elif result.returncode == 0:
        lines.append("ran: " + " ".join(bootout))
    else:
        lines.append(f"{LAUNCHD_LABEL} was not loaded")
    if path.exists():
        path.unlink()
        lines.append(f"removed {path}")
    else:
        lines.append(f"{path} was not installed")
    return lines


# --- status ------------------------------------------------------------------------------------


def status(exe: Path | None, env: dict[str, str], *, runner: Runner) -> dict[str, Any]:
    """What launchd says about memd's LaunchAgent, and whether the plist is memd's."""
    path = launchd_plist_path()
    expected = _expected(exe, env) if exe else None
    info: dict[str, Any] = {
        "manager": "launchd",
        "label": LAUNCHD_LABEL,
        "log": str(launchd_log_path()),
    }
    info.update(file_state(path, expected))
    printed = run(runner, ["launchctl", "print", f"{_gui_domain()}/{LAUNCHD_LABEL}"])
    info["available"] = printed is not None
    info["loaded"] = printed is not None and printed.returncode == 0
    fields = _launchctl_fields(printed.stdout or "") if info["loaded"] and printed else {}
    info["state"] = fields.get("state")
    pid = fields.get("pid")
    info["pid"] = int(pid) if pid and pid.isdigit() else None
    info["last_exit"] = fields.get("last exit code")
    info["running"] = info["state"] == "running"
    if not info["available"]:
        info["reason"] = "launchctl not available"
    return info


def _launchctl_fields(text: str) -> dict[str, str]:
    """The top-level ``key = value`` lines of ``launchctl print`` (one tab of indentation)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\t([a-z][a-z ]*?) = (.*)$", line)
        if match and match.group(1) not in fields:
            fields[match.group(1)] = match.group(2).strip()
    return fields
