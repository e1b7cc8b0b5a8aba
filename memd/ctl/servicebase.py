"""What memd's systemd and launchd integrations share: the error, the memd executable, the
environment and socket carried into the service, the manager's commands, and writing files.

Every external command goes through an injected ``runner`` (``subprocess.run`` by default), so
tests can record the commands instead of running them.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from memd.atomicfile import write_atomic
from memd.config.env import setting_variables
from memd.dist import install_hint
from memd.embed.secrets import KEY_VARIABLES
from memd_client.paths import socket_path

__all__ = [
    "PROPAGATED_ENV",
    "Runner",
    "ServiceError",
    "memd_executable",
    "prepare",
    "run",
    "secrets_left_out",
    "service_environment",
    "service_socket",
    "why",
    "would",
    "write",
]

# Variables that move memd's state or socket: copied from the installing shell into the service,
# so memctl and the service agree on where memd lives. Secrets (API keys) are never written.
PROPAGATED_ENV = ("MEMD_HOME", "MEMD_CONFIG", "MEMD_SOCKET")

Runner = Callable[..., subprocess.CompletedProcess[str]]

_COMMAND_TIMEOUT_S = 120.0  # `systemctl start` of a Type=notify unit waits for READY=1
_DIFF_LINES = 40


class ServiceError(Exception):
    """Installing, removing or inspecting the service failed; ``lines`` says what was done first."""

    def __init__(self, message: str, lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.lines: list[str] = list(lines or [])


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


def service_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What the service is started with: where memd keeps its files and every ``MEMD_*``
    setting of this shell (a local model, a provider), so it runs as ``memd run`` here would.
    Never a key: those stay in key files (see :func:`secrets_left_out`)."""
    out = {name: env[name] for name in PROPAGATED_ENV if env.get(name)}
    out.update(setting_variables(env))
    return dict(sorted(out.items()))


def service_socket(env: Mapping[str, str]) -> Path:
    """Where the service manager listens for memd: where memd and its clients look, given this
    shell's MEMD_SOCKET, MEMD_HOME and XDG_RUNTIME_DIR."""
    return socket_path(env)


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


def home() -> Path:
    return Path(os.path.expanduser("~"))


def run(runner: Runner, cmd: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run ``cmd``; None when the program does not exist or does not answer in time."""
    try:
        return runner(cmd, capture_output=True, text=True, check=False, timeout=_COMMAND_TIMEOUT_S)
    except (FileNotFoundError, PermissionError, subprocess.TimeoutExpired):
        return None


def why(result: subprocess.CompletedProcess[str] | None, program: str) -> str:
    """What a failed command said (its last line), for an error message."""
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


def write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, mode 0644 (the service manager reads it)."""
    write_atomic(path, data, mode=0o644)


def prepare(path: Path, data: bytes, *, force: bool) -> str:
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


def would(files: list[tuple[str, str, bytes]], commands: list[str], notes: list[str]) -> list[str]:
    """What a dry run says: each file it would write (action, what, data: shown whole), the
    commands, the notes."""
    lines: list[str] = []
    for action, what, data in files:
        verb = {"new": "write", "same": "keep (unchanged)", "replace": "replace"}[action]
        lines += [f"would {verb} {what}:", *(f"    {line}" for line in data.decode().splitlines())]
    return [*lines, *(f"would run: {c}" for c in commands), *notes]


def file_state(path: Path, expected: bytes | None) -> dict[str, object]:
    """Whether ``path`` is installed, and whether it is the file memd would write."""
    try:
        current = path.read_bytes()
    except FileNotFoundError:
        return {"path": str(path), "installed": False, "up_to_date": None}
    return {
        "path": str(path),
        "installed": True,
        "up_to_date": None if expected is None else current == expected,
    }
