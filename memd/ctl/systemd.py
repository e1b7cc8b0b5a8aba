"""memd under systemd: a user service and its socket, rendered, installed, removed, inspected.

``memd.socket`` makes systemd listen on memd's socket and start ``memd.service`` on the first
connection (socket activation: memd takes the listening socket, memd/ipc/activation.py), so
memd is there whenever a client asks, after a crash, a stop or an idle exit; the service also
starts at login. The copies shipped in ``systemd/`` are these renderings for a default path, and
a test keeps them identical.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memd.ctl.servicebase import (
    Runner,
    ServiceError,
    file_state,
    prepare,
    run,
    secrets_left_out,
    service_socket,
    why,
    would,
    write,
)

__all__ = [
    "SYSTEMD_SOCKET_NAME",
    "SYSTEMD_UNIT_NAME",
    "install",
    "socket_unit_path",
    "status",
    "systemd_socket",
    "systemd_unit",
    "systemd_unit_path",
    "uninstall",
]

SYSTEMD_UNIT_NAME = "memd.service"
SYSTEMD_SOCKET_NAME = "memd.socket"
DEFAULT_LISTEN = "%t/memd/memd.sock"  # $XDG_RUNTIME_DIR/memd/memd.sock, where memd looks

SYSTEMD_UNIT_TEMPLATE = """\
# memd: the local memory daemon for AI agents, as a systemd user service.
#
# `memctl service install` writes this unit to ~/.config/systemd/user/memd.service with ExecStart
# pointing at the memd it is installed beside, and memd.socket beside it, then enables and starts
# both. The copy shipped in the repository assumes pipx or `pip install --user`
# (%h/.local/bin/memd).
# Change settings with a drop-in (`systemctl --user edit memd`), not by editing this file.
# Stronger, opt-in sandboxing that needs user namespaces: systemd/hardening.conf.

[Unit]
Description=memd local memory daemon for AI agents
# systemd listens on memd's socket (memd.socket) and hands it to memd: a client that connects
# while memd is stopped starts it, and its request waits in the socket's queue meanwhile.
Requires=memd.socket
After=memd.socket
# At most 5 starts in 60 s; a crash loop then stops until `systemctl --user reset-failed memd`.
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
# memd stays in the foreground and sends READY=1 once it serves the socket, WATCHDOG=1 every
# WATCHDOG_USEC/2 from its main loop, and STOPPING=1 when it shuts down on SIGTERM.
Type=notify
NotifyAccess=main
ExecStart=@EXEC_START@
Environment=PYTHONUNBUFFERED=1
@ENVIRONMENT@\
# To let memd stop after a quiet spell (the socket starts it again on the next connection; the
# watcher and scheduled dreaming stop with it), add Environment=MEMD_IDLE_EXIT=<seconds> in a
# drop-in.
# Restart after a crash or a missed watchdog ping, not after a clean exit or when another memd
# already runs (exit status 4).
Restart=on-failure
RestartSec=2s
RestartPreventExitStatus=4
WatchdogSec=60
# Time to drain requests and flush the index writer before SIGKILL.
TimeoutStopSec=30
# SIGTERM goes to memd alone, which stops its model worker and readers itself; the default
# (every process of the service) killed them first, and a clean stop logged them as crashes.
# SIGKILL, if the time runs out, still goes to all.
KillMode=mixed

# A local embedding model (llama.cpp) needs memory: above MemoryHigh the kernel reclaims and
# throttles, at MemoryMax memd is killed and restarted. Both apply only where the user manager has
# the memory controller delegated; elsewhere they are ignored.
MemoryHigh=1G
MemoryMax=2G
# Hundreds of idle client connections.
LimitNOFILE=4096
# Yield CPU and disk to interactive work, but only when they are contended. Nice= is left at 0:
# one process both indexes and answers searches, and a nice value would slow the answers as much
# as the indexing.
CPUWeight=20
IOWeight=20

# Hardening that works everywhere, including systems without unprivileged user namespaces.
NoNewPrivileges=yes
UMask=0077
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
LockPersonality=yes
RestrictRealtime=yes
SystemCallArchitectures=native

[Install]
WantedBy=default.target
Also=memd.socket
"""

SYSTEMD_SOCKET_TEMPLATE = """\
# memd's socket: systemd listens on it and starts memd.service on the first connection, so memd
# is there whenever a client asks (after a crash, a stop, or an idle exit).
#
# `memctl service install` writes this unit to ~/.config/systemd/user/memd.socket, listening
# where memd and its clients look; the copy shipped in the repository listens at the default
# place, $XDG_RUNTIME_DIR/memd/memd.sock.

[Unit]
Description=memd local memory daemon for AI agents (its socket)

[Socket]
ListenStream=@LISTEN@
# The socket is yours alone, in a directory only you can enter: memd refuses anything else.
SocketMode=0600
DirectoryMode=0700
RemoveOnStop=yes
# Agents that start at once wait in the queue rather than being refused.
Backlog=1024

[Install]
WantedBy=sockets.target
"""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYSTEMCTL = ["systemctl", "--user"]
_UNITS = [SYSTEMD_UNIT_NAME, SYSTEMD_SOCKET_NAME]


# --- rendering ---------------------------------------------------------------------------------


def _systemd_escape(value: str) -> str:
    """Escape ``%`` specifiers; reject what a unit line cannot hold."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ServiceError(f"cannot put {value!r} in a systemd unit (newline or NUL)")
    return value.replace("%", "%%")


def _systemd_quote(value: str) -> str:
    """Double-quote a word for ExecStart=/Environment= when it needs it."""
    if value and not re.search(r'[\s"\'\\]', value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(executable: Path, *, environment: Mapping[str, str] | None = None) -> str:
    """The user unit running ``<executable> run``, with extra ``Environment=`` lines if given.

    A leading ``%h/`` in ``executable`` is kept as systemd's home-directory specifier (the shipped
    unit uses ``%h/.local/bin/memd``); any other ``%`` is escaped, ``$`` too.
    """
    raw = str(executable)
    if raw.startswith("%h/"):
        exe = "%h/" + _systemd_escape(raw[3:])
    else:
        exe = _systemd_escape(raw)
    exe = exe.replace("$", "$$")
    env_lines = ""
    for name, value in (environment or {}).items():
        if not _ENV_NAME.match(name):
            raise ServiceError(f"not an environment variable name: {name!r}")
        env_lines += f"Environment={_systemd_quote(f'{name}={_systemd_escape(value)}')}\n"
    return SYSTEMD_UNIT_TEMPLATE.replace("@EXEC_START@", f"{_systemd_quote(exe)} run").replace(
        "@ENVIRONMENT@", env_lines
    )


def systemd_socket(listen: str = DEFAULT_LISTEN) -> str:
    """The socket unit listening on ``listen``: a path, where a leading ``%t/`` is systemd's
    runtime directory ($XDG_RUNTIME_DIR); any other ``%`` is escaped."""
    if listen.startswith("%t/"):
        path = "%t/" + _systemd_escape(listen[3:])
    else:
        if not listen.startswith("/"):
            raise ServiceError(f"memd's socket must be an absolute path, not {listen!r}")
        path = _systemd_escape(listen)
    if re.search(r"\s", path):
        raise ServiceError(f"systemd cannot listen on a path with white space: {listen!r}")
    return SYSTEMD_SOCKET_TEMPLATE.replace("@LISTEN@", path)


def listen_path(env: Mapping[str, str]) -> str:
    """Where memd.socket listens: memd's socket as this shell resolves it, under ``%t`` when it
    is in the runtime directory (so the unit stays right if that moves)."""
    path = service_socket(env)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            return "%t/" + str(path.relative_to(runtime))
        except ValueError:
            pass
    return str(path)


def systemd_unit_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/systemd/user/memd.service`` (default ``~/.config``)."""
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(Path(os.path.expanduser("~")) / ".config")
    return Path(config) / "systemd" / "user" / SYSTEMD_UNIT_NAME


def socket_unit_path(env: Mapping[str, str] | None = None) -> Path:
    """``memd.socket`` beside ``memd.service``."""
    return systemd_unit_path(env).with_name(SYSTEMD_SOCKET_NAME)


def _files(exe: Path | None, env: dict[str, str]) -> list[tuple[Path, bytes | None]]:
    """The two units and what memd would write in each (None for the service when memd's
    executable cannot be found)."""
    unit = systemd_unit(exe, environment=env).encode() if exe else None
    return [
        (systemd_unit_path(), unit),
        (socket_unit_path(), systemd_socket(listen_path(os.environ)).encode()),
    ]


# --- install -----------------------------------------------------------------------------------


def _no_user_manager(paths: list[Path], reason: str, lines: list[str]) -> ServiceError:
    written = " and ".join(str(p) for p in paths)
    return ServiceError(
        f"systemd user manager not available ({reason}): {written} written; "
        "start memd with `memd run` (or let a client start it)",
        lines,
    )


def install(
    exe: Path, env: dict[str, str], *, dry_run: bool, force: bool, runner: Runner
) -> list[str]:
    """Write memd.service and memd.socket, then enable and start both."""
    files = [(path, data) for path, data in _files(exe, env) if data is not None]
    actions = [prepare(path, data, force=force) for path, data in files]
    commands = [[*_SYSTEMCTL, "daemon-reload"]]
    if "replace" in actions:
        # A memd started from the old unit serves a socket of its own: stop it, so the one
        # started next takes the socket systemd listens on.
        commands.append([*_SYSTEMCTL, "stop", SYSTEMD_UNIT_NAME])
    commands.append([*_SYSTEMCTL, "enable", "--now", SYSTEMD_SOCKET_NAME, SYSTEMD_UNIT_NAME])
    notes = secrets_left_out(os.environ)
    if dry_run:
        shown = [(a, str(p), d) for a, (p, d) in zip(actions, files)]
        return would(shown, [" ".join(c) for c in commands], notes)
    lines: list[str] = list(notes)
    for action, (path, data) in zip(actions, files):
        if action == "same":
            lines.append(f"{path} is up to date")
            continue
        write(path, data)
        verb = "replaced" if action == "replace" else "wrote"
        what = f"ExecStart={exe} run" if path.name == SYSTEMD_UNIT_NAME else "socket activation"
        lines.append(f"{verb} {path} ({what})")
    reload = run(runner, commands[0])
    if reload is None or reload.returncode != 0:
        raise _no_user_manager([p for p, _ in files], why(reload, "systemctl"), lines)
    lines.append("ran: " + " ".join(commands[0]))
    for cmd in commands[1:]:
        result = run(runner, cmd)
        if result is None or result.returncode != 0:
            raise ServiceError(
                f"`{' '.join(cmd)}` failed: {why(result, 'systemctl')}; "
                "see `journalctl --user -u memd` and `systemctl --user status memd`",
                lines,
            )
        lines.append("ran: " + " ".join(cmd))
    lines.append(
        "memd is running under systemd, and starts again on the next connection whenever it "
        "is not (`memctl service status` to check)"
    )
    return lines


# --- uninstall ---------------------------------------------------------------------------------


def uninstall(*, dry_run: bool, runner: Runner) -> list[str]:
    """Stop and disable memd.service and memd.socket, and remove both files."""
    paths = [systemd_unit_path(), socket_unit_path()]
    stop = [*_SYSTEMCTL, "disable", "--now", *_UNITS]
    reload = [*_SYSTEMCTL, "daemon-reload"]
    if dry_run:
        return [
            f"would run: {' '.join(stop)}",
            *(f"would remove {p}" for p in paths),
            f"would run: {' '.join(reload)}",
        ]
    lines: list[str] = []
    result = run(runner, stop)
    manager = result is not None and not _bus_failure(result)
    if manager:
        lines.append("ran: " + " ".join(stop))
    for path in paths:
        if path.exists():
            path.unlink()
            lines.append(f"removed {path}")
        else:
            lines.append(f"{path} was not installed")
    if not manager:
        lines.append(
            f"systemd user manager not available ({why(result, 'systemctl')}); "
            "stop a running `memd run` yourself"
        )
        return lines
    if run(runner, reload) is not None:
        lines.append("ran: " + " ".join(reload))
    return lines


_BUS_FAILURE = re.compile(r"Failed to connect to bus|not been booted with systemd|No medium found")


def _bus_failure(result: Any) -> bool:
    """systemctl could not talk to a user manager (as opposed to: the unit does not exist)."""
    text = (result.stderr or "") + (result.stdout or "")
    return result.returncode != 0 and bool(_BUS_FAILURE.search(text))


# --- status ------------------------------------------------------------------------------------


def status(exe: Path | None, env: dict[str, str], *, runner: Runner) -> dict[str, Any]:
    """What systemd says about memd.service and memd.socket, and whether the files are the
    ones memd would write."""
    (unit, expected_unit), (sock, expected_sock) = _files(exe, env)
    info: dict[str, Any] = {"manager": "systemd", "unit": SYSTEMD_UNIT_NAME}
    info.update(file_state(unit, expected_unit))
    socket_file = file_state(sock, expected_sock)
    info["socket_unit"] = {"name": SYSTEMD_SOCKET_NAME, **socket_file}
    if info["installed"] and not socket_file["installed"]:
        info["up_to_date"] = False  # installed before memd.socket existed: install again
    elif info["up_to_date"] and socket_file["up_to_date"] is False:
        info["up_to_date"] = False
    active = run(runner, [*_SYSTEMCTL, "is-active", SYSTEMD_UNIT_NAME])
    enabled = run(runner, [*_SYSTEMCTL, "is-enabled", SYSTEMD_UNIT_NAME])
    answer = (active.stdout or "").strip() if active is not None else ""
    info["available"] = bool(answer) and not _BUS_FAILURE.search(answer)
    info["active"] = answer if info["available"] else None
    info["enabled"] = (
        ((enabled.stdout or "").strip() or None) if info["available"] and enabled else None
    )
    info["running"] = info["active"] in ("active", "reloading")
    if info["available"]:
        listening = run(runner, [*_SYSTEMCTL, "is-active", SYSTEMD_SOCKET_NAME])
        info["socket_unit"]["active"] = (listening.stdout or "").strip() if listening else None
    else:
        info["reason"] = "systemd user manager not available: " + why(active, "systemctl")
    return info
