"""Service-manager integration: render, install, remove and inspect memd's systemd/launchd service.

The unit and plist are rendered here from embedded templates; the copies shipped in ``systemd/``
and ``launchd/`` are these renderings for a default path, and a test keeps them identical.
Every external command goes through an injected ``runner`` (``subprocess.run`` by default), so
tests can record the commands instead of running them. Stdlib only: ``memctl`` imports this.
Over 400 lines: two service managers, each with its template, install, removal and status.
"""

from __future__ import annotations

import difflib
import os
import plistlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memd.atomicfile import write_atomic
from memd.config import setting_variables
from memd.dist import install_hint
from memd.embed.secrets import KEY_VARIABLES

__all__ = [
    "LAUNCHD_LABEL",
    "SYSTEMD_UNIT_NAME",
    "ServiceError",
    "install",
    "launchd_plist",
    "memd_executable",
    "status",
    "systemd_unit",
    "uninstall",
]

SYSTEMD_UNIT_NAME = "memd.service"
LAUNCHD_LABEL = "dev.memd.memd"

# Variables that move memd's state or socket: copied from the installing shell into the service,
# so memctl and the service agree on where memd lives. Secrets (API keys) are never written.
PROPAGATED_ENV = ("MEMD_HOME", "MEMD_CONFIG", "MEMD_SOCKET")

Runner = Callable[..., subprocess.CompletedProcess[str]]

_COMMAND_TIMEOUT_S = 120.0  # `systemctl start` of a Type=notify unit waits for READY=1
_DIFF_LINES = 40

SYSTEMD_UNIT_TEMPLATE = """\
# memd: the local memory daemon for AI agents, as a systemd user service.
#
# `memctl service install` writes this unit to ~/.config/systemd/user/memd.service with ExecStart
# pointing at the memd it is installed beside, then enables and starts it. The copy shipped in the
# repository assumes pipx or `pip install --user` (%h/.local/bin/memd).
# Change settings with a drop-in (`systemctl --user edit memd`), not by editing this file.
# Stronger, opt-in sandboxing that needs user namespaces: systemd/hardening.conf.

[Unit]
Description=memd local memory daemon for AI agents
# At most 5 starts in 60 s; a crash loop then stops until `systemctl --user reset-failed memd`.
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
# memd stays in the foreground and sends READY=1 once its socket accepts, WATCHDOG=1 every
# WATCHDOG_USEC/2 from its main loop, and STOPPING=1 when it shuts down on SIGTERM.
Type=notify
NotifyAccess=main
ExecStart=@EXEC_START@
Environment=PYTHONUNBUFFERED=1
@ENVIRONMENT@\
# Restart after a crash or a missed watchdog ping, not after a clean exit or when another memd
# already runs (exit status 4).
Restart=on-failure
RestartSec=2s
RestartPreventExitStatus=4
WatchdogSec=60
# Time to drain requests and flush the index writer before SIGKILL.
TimeoutStopSec=30
# The socket directory $XDG_RUNTIME_DIR/memd, private to the user, removed when memd stops.
RuntimeDirectory=memd
RuntimeDirectoryMode=0700

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
"""

_DEFAULT_LAUNCHD_PATH = (
    "/usr/local/bin",
    "/opt/homebrew/bin",
    "/usr/bin",
    "/bin",
    "/usr/sbin",
    "/sbin",
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ServiceError(Exception):
    """Installing, removing or inspecting the service failed; ``lines`` says what was done first."""

    def __init__(self, message: str, lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.lines: list[str] = list(lines or [])


# --- rendering ---------------------------------------------------------------------------------


def memd_executable() -> Path:
    """The ``memd`` script: next to the running Python (a virtualenv or pipx), else on ``PATH``."""
    beside = Path(sys.executable).parent / "memd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside.absolute()
    found = shutil.which("memd")
    if found:
        return Path(found).absolute()
    raise ServiceError(
        f"cannot find the memd executable (not beside {sys.executable}, not on PATH); "
        f"install it first: {install_hint()}"
    )


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


def launchd_plist(
    executable: Path, *, log_path: Path, environment: Mapping[str, str] | None = None
) -> bytes:
    """The LaunchAgent running ``<executable> run``; launchd expands no ``~``, so paths are absolute."""
    if not executable.is_absolute() or not log_path.is_absolute():
        raise ServiceError(f"launchd needs absolute paths, got {executable} and {log_path}")
    search_path: list[str] = []
    for entry in (str(executable.parent), *_DEFAULT_LAUNCHD_PATH):
        if entry not in search_path:
            search_path.append(entry)
    env = {"PATH": ":".join(search_path), "PYTHONUNBUFFERED": "1", **(environment or {})}
    plist: dict[str, Any] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": [str(executable), "run"],
        "RunAtLoad": True,
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


def _service_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What the service is started with: where memd keeps its files and every ``MEMD_*``
    setting of this shell (a local model, a provider), so it runs as ``memd run`` here would.
    Never a key: those stay in key files (see :func:`secrets_left_out`)."""
    out = {name: env[name] for name in PROPAGATED_ENV if env.get(name)}
    out.update(setting_variables(env))
    return dict(sorted(out.items()))


def secrets_left_out(env: Mapping[str, str]) -> list[str]:
    """Lines about API keys set in this shell that the service will not see, and what to do."""
    lines: list[str] = []
    for provider, names in KEY_VARIABLES.items():
        for name in names:
            if env.get(name) and not any(name in line for line in lines):
                lines.append(
                    f"note: {name} is set here but not given to the service (a unit file is no "
                    f"place for a key): write it to a file only you can read (chmod 600) and "
                    f'set api_key_file = "<that file>" under [embedding] in the config '
                    f"(provider {provider})"
                )
    return lines


# --- platforms ---------------------------------------------------------------------------------


def _platform(platform: str | None) -> str:
    name = sys.platform if platform is None else platform
    if name.startswith("linux"):
        return "linux"
    if name == "darwin":
        return "darwin"
    raise ServiceError(
        f"no service-manager support on {name}; run `memd run` under your own supervisor"
    )


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def systemd_unit_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/systemd/user/memd.service`` (default ``~/.config``)."""
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(_home() / ".config")
    return Path(config) / "systemd" / "user" / SYSTEMD_UNIT_NAME


def launchd_plist_path() -> Path:
    return _home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def launchd_log_path() -> Path:
    return _home() / "Library" / "Logs" / "memd.log"


def _run(runner: Runner, cmd: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run ``cmd``; None when the program does not exist or does not answer in time."""
    try:
        return runner(cmd, capture_output=True, text=True, check=False, timeout=_COMMAND_TIMEOUT_S)
    except (FileNotFoundError, PermissionError, subprocess.TimeoutExpired):
        return None


def _why(result: subprocess.CompletedProcess[str] | None, program: str) -> str:
    if result is None:
        return f"{program} not found or not answering"
    detail = (result.stderr or result.stdout or "").strip().splitlines()
    return detail[-1] if detail else f"exit status {result.returncode}"


def _diff(old: str, new: str, path: Path) -> str:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), str(path), "memctl service install", lineterm=""
        )
    )
    if len(lines) > _DIFF_LINES:
        lines = [*lines[:_DIFF_LINES], f"... ({len(lines) - _DIFF_LINES} more lines)"]
    return "\n".join(lines)


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, mode 0644 (the service manager reads it)."""
    write_atomic(path, data, mode=0o644)


def _prepare(path: Path, data: bytes, *, force: bool) -> str:
    """``new``, ``same`` or ``replace`` for writing ``data`` at ``path``; refuses a foreign file."""
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        return "new"
    if old == data:
        return "same"
    if not force:
        diff = _diff(old.decode(errors="replace"), data.decode(errors="replace"), path)
        raise ServiceError(
            f"{path} exists and differs from the file memd would write; keeping it.\n"
            f"{diff}\nRerun with --force to replace it (local settings belong in a drop-in)."
        )
    return "replace"


# --- install -----------------------------------------------------------------------------------


def install(
    platform: str | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
    executable: Path | None = None,
    runner: Runner = subprocess.run,
) -> list[str]:
    """Write the service file for this platform and start memd under the service manager.

    Returns human-readable lines of what was done (or, with ``dry_run``, would be done). Raises
    :class:`ServiceError` (with the lines done so far) when the file differs from ours and
    ``force`` is not set, or when the service manager is missing or fails.
    """
    system = _platform(platform)
    exe = executable if executable is not None else memd_executable()
    env = _service_environment(os.environ)
    if system == "linux":
        return _install_systemd(exe, env, dry_run=dry_run, force=force, runner=runner)
    return _install_launchd(exe, env, dry_run=dry_run, force=force, runner=runner)


def _would(action: str, what: str, data: bytes, commands: list[str], notes: list[str]) -> list[str]:
    """What a dry run says: the file it would write (shown whole), the commands, the notes."""
    verb = {"new": "write", "same": "keep (unchanged)", "replace": "replace"}[action]
    return [
        f"would {verb} {what}:",
        *(f"    {line}" for line in data.decode().splitlines()),
        *(f"would run: {c}" for c in commands),
        *notes,
    ]


_SYSTEMCTL = ["systemctl", "--user"]


def _no_user_manager(path: Path, why: str, lines: list[str]) -> ServiceError:
    return ServiceError(
        f"systemd user manager not available ({why}): the unit was written to {path}; "
        "start memd with `memd run`",
        lines,
    )


def _install_systemd(
    exe: Path, env: dict[str, str], *, dry_run: bool, force: bool, runner: Runner
) -> list[str]:
    path = systemd_unit_path()
    data = systemd_unit(exe, environment=env).encode()
    action = _prepare(path, data, force=force)
    start = [*_SYSTEMCTL, "enable", "--now", SYSTEMD_UNIT_NAME]
    commands = [[*_SYSTEMCTL, "daemon-reload"], start]
    if action == "replace":  # a running memd keeps its old unit until restarted
        commands.append([*_SYSTEMCTL, "restart", SYSTEMD_UNIT_NAME])
    notes = secrets_left_out(os.environ)
    if dry_run:
        return _would(action, str(path), data, [" ".join(c) for c in commands], notes)
    lines: list[str] = list(notes)
    if action == "same":
        lines.append(f"{path} is up to date")
    else:
        _write(path, data)
        lines.append(
            f"{'replaced' if action == 'replace' else 'wrote'} {path} (ExecStart={exe} run)"
        )
    reload = _run(runner, commands[0])
    if reload is None or reload.returncode != 0:
        raise _no_user_manager(path, _why(reload, "systemctl"), lines)
    lines.append("ran: " + " ".join(commands[0]))
    for cmd in commands[1:]:
        result = _run(runner, cmd)
        if result is None or result.returncode != 0:
            raise ServiceError(
                f"`{' '.join(cmd)}` failed: {_why(result, 'systemctl')}; "
                "see `journalctl --user -u memd` and `systemctl --user status memd`",
                lines,
            )
        lines.append("ran: " + " ".join(cmd))
    lines.append("memd is running under systemd (`memctl service status` to check)")
    return lines


def _gui_domain() -> str:
    return f"gui/{os.getuid()}"


def _install_launchd(
    exe: Path, env: dict[str, str], *, dry_run: bool, force: bool, runner: Runner
) -> list[str]:
    path, log = launchd_plist_path(), launchd_log_path()
    data = launchd_plist(exe, log_path=log, environment=env)
    action = _prepare(path, data, force=force)
    domain = _gui_domain()
    service = f"{domain}/{LAUNCHD_LABEL}"
    notes = secrets_left_out(os.environ)
    if dry_run:
        commands = [
            f"launchctl bootout {service} (if loaded)",
            f"launchctl enable {service}",
            f"launchctl bootstrap {domain} {path}",
        ]
        return _would(action, f"{path} (logs to {log})", data, commands, notes)
    lines: list[str] = list(notes)
    if action == "same":
        lines.append(f"{path} is up to date")
    else:
        _write(path, data)
        lines.append(f"{'replaced' if action == 'replace' else 'wrote'} {path} (logs to {log})")
    log.parent.mkdir(parents=True, exist_ok=True)  # launchd creates the file, not its folder
    loaded = _run(runner, ["launchctl", "print", service])
    if loaded is None:
        raise ServiceError(
            f"launchctl not available: the plist was written to {path}; start memd with `memd run`",
            lines,
        )
    if loaded.returncode == 0:
        cmd = ["launchctl", "bootout", service]
        _run(runner, cmd)  # "not loaded" races are fine: bootstrap below reports real trouble
        lines.append("ran: " + " ".join(cmd))
    enable = ["launchctl", "enable", service]  # a disabled label refuses to bootstrap
    _run(runner, enable)
    lines.append("ran: " + " ".join(enable))
    bootstrap = ["launchctl", "bootstrap", domain, str(path)]
    result = _run(runner, bootstrap)
    for _ in range(4):  # bootout finishes asynchronously; bootstrap fails (EIO) until it has
        if result is None or result.returncode == 0 or loaded.returncode != 0:
            break
        time.sleep(0.5)
        result = _run(runner, bootstrap)
    if result is None or result.returncode != 0:
        raise ServiceError(
            f"`{' '.join(bootstrap)}` failed: {_why(result, 'launchctl')}; see {log}", lines
        )
    lines.append("ran: " + " ".join(bootstrap))
    lines.append(f"memd is running under launchd (logs: {log})")
    return lines


# --- uninstall ---------------------------------------------------------------------------------


def uninstall(
    platform: str | None = None, *, dry_run: bool = False, runner: Runner = subprocess.run
) -> list[str]:
    """Stop memd, disable it and remove the service file; returns what was done."""
    if _platform(platform) == "linux":
        return _uninstall_systemd(dry_run=dry_run, runner=runner)
    return _uninstall_launchd(dry_run=dry_run, runner=runner)


def _uninstall_systemd(*, dry_run: bool, runner: Runner) -> list[str]:
    path = systemd_unit_path()
    stop = [*_SYSTEMCTL, "disable", "--now", SYSTEMD_UNIT_NAME]
    reload = [*_SYSTEMCTL, "daemon-reload"]
    if dry_run:
        return [
            f"would run: {' '.join(stop)}",
            f"would remove {path}",
            f"would run: {' '.join(reload)}",
        ]
    lines: list[str] = []
    result = _run(runner, stop)
    manager = result is not None and not _bus_failure(result)
    if manager:
        lines.append("ran: " + " ".join(stop))
    if path.exists():
        path.unlink()
        lines.append(f"removed {path}")
    else:
        lines.append(f"{path} was not installed")
    if not manager:
        lines.append(
            f"systemd user manager not available ({_why(result, 'systemctl')}); "
            "stop a running `memd run` yourself"
        )
        return lines
    if _run(runner, reload) is not None:
        lines.append("ran: " + " ".join(reload))
    return lines


def _bus_failure(result: subprocess.CompletedProcess[str]) -> bool:
    """systemctl could not talk to a user manager (as opposed to: the unit does not exist)."""
    text = (result.stderr or "") + (result.stdout or "")
    return result.returncode != 0 and bool(
        re.search(r"Failed to connect to bus|not been booted with systemd|No medium found", text)
    )


def _uninstall_launchd(*, dry_run: bool, runner: Runner) -> list[str]:
    path = launchd_plist_path()
    service = f"{_gui_domain()}/{LAUNCHD_LABEL}"
    bootout = ["launchctl", "bootout", service]
    if dry_run:
        return [f"would run: {' '.join(bootout)}", f"would remove {path}"]
    lines: list[str] = []
    result = _run(runner, bootout)
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


def status(
    platform: str | None = None,
    *,
    executable: Path | None = None,
    runner: Runner = subprocess.run,
) -> dict[str, Any]:
    """What the service manager says about memd, plus whether the file is the one we would write.

    Keys: ``manager``, ``available`` (the manager answered), ``path``, ``installed``,
    ``up_to_date`` (None when the memd executable cannot be found), ``running`` and the manager's
    own words (``active``/``enabled`` for systemd; ``loaded``/``state``/``pid`` for launchd).
    """
    system = _platform(platform)
    try:
        exe = executable if executable is not None else memd_executable()
    except ServiceError:
        exe = None
    env = _service_environment(os.environ)
    if system == "linux":
        path = systemd_unit_path()
        expected = systemd_unit(exe, environment=env).encode() if exe else None
        info: dict[str, Any] = {"manager": "systemd", "unit": SYSTEMD_UNIT_NAME}
        info.update(_file_state(path, expected))
        active = _run(runner, [*_SYSTEMCTL, "is-active", SYSTEMD_UNIT_NAME])
        enabled = _run(runner, [*_SYSTEMCTL, "is-enabled", SYSTEMD_UNIT_NAME])
        answer = (active.stdout or "").strip() if active is not None else ""
        info["available"] = bool(answer) and not _bus_failure_text(answer)
        info["active"] = answer if info["available"] else None
        info["enabled"] = (
            ((enabled.stdout or "").strip() or None) if info["available"] and enabled else None
        )
        info["running"] = info["active"] in ("active", "reloading")
        if not info["available"]:
            info["reason"] = "systemd user manager not available: " + _why(active, "systemctl")
        return info
    path = launchd_plist_path()
    expected = launchd_plist(exe, log_path=launchd_log_path(), environment=env) if exe else None
    info = {"manager": "launchd", "label": LAUNCHD_LABEL, "log": str(launchd_log_path())}
    info.update(_file_state(path, expected))
    printed = _run(runner, ["launchctl", "print", f"{_gui_domain()}/{LAUNCHD_LABEL}"])
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


def _bus_failure_text(text: str) -> bool:
    return bool(re.search(r"Failed to connect|not been booted|No medium found", text))


def _file_state(path: Path, expected: bytes | None) -> dict[str, Any]:
    try:
        current = path.read_bytes()
    except FileNotFoundError:
        return {"path": str(path), "installed": False, "up_to_date": None}
    return {
        "path": str(path),
        "installed": True,
        "up_to_date": None if expected is None else current == expected,
    }


def _launchctl_fields(text: str) -> dict[str, str]:
    """The top-level ``key = value`` lines of ``launchctl print`` (one tab of indentation)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\t([a-z][a-z ]*?) = (.*)$", line)
        if match and match.group(1) not in fields:
            fields[match.group(1)] = match.group(2).strip()
    return fields
