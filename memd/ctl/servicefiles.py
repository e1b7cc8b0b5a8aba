"""Service-manager integration: install, remove and inspect memd's service on this platform.

systemd (Linux: memd/ctl/systemd.py) and launchd (macOS: memd/ctl/launchd.py) each render their
files from embedded templates and run their manager's commands; what they share is in
memd/ctl/servicebase.py. Both listen on memd's socket for it (socket activation), so a client
that connects while memd is not running starts it. Stdlib only: ``memctl`` imports this.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from memd.ctl import launchd, systemd
from memd.ctl.launchd import LAUNCHD_LABEL, launchd_log_path, launchd_plist
from memd.ctl.servicebase import (
    Runner,
    ServiceError,
    memd_executable,
    secrets_left_out,
    service_environment,
)
from memd.ctl.systemd import SYSTEMD_SOCKET_NAME, SYSTEMD_UNIT_NAME, systemd_socket, systemd_unit

__all__ = [
    "LAUNCHD_LABEL",
    "SYSTEMD_SOCKET_NAME",
    "SYSTEMD_UNIT_NAME",
    "ServiceError",
    "install",
    "launchd_log_path",
    "launchd_plist",
    "memd_executable",
    "secrets_left_out",
    "status",
    "systemd_socket",
    "systemd_unit",
    "uninstall",
]


def _platform(platform: str | None) -> str:
    name = sys.platform if platform is None else platform
    if name.startswith("linux"):
        return "linux"
    if name == "darwin":
        return "darwin"
    raise ServiceError(
        f"no service-manager support on {name}; run `memd run` under your own supervisor"
    )


def install(
    platform: str | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
    executable: Path | None = None,
    runner: Runner = subprocess.run,
) -> list[str]:
    """Write the service files for this platform and start memd under the service manager.

    Returns human-readable lines of what was done (or, with ``dry_run``, would be done). Raises
    :class:`ServiceError` (with the lines done so far) when a file differs from ours and
    ``force`` is not set, or when the service manager is missing or fails.
    """
    system = _platform(platform)
    exe = executable if executable is not None else memd_executable()
    env = service_environment(os.environ)
    if system == "linux":
        return systemd.install(exe, env, dry_run=dry_run, force=force, runner=runner)
    return launchd.install(exe, env, dry_run=dry_run, force=force, runner=runner)


def uninstall(
    platform: str | None = None, *, dry_run: bool = False, runner: Runner = subprocess.run
) -> list[str]:
    """Stop memd, disable it and remove the service files; returns what was done."""
    if _platform(platform) == "linux":
        return systemd.uninstall(dry_run=dry_run, runner=runner)
    return launchd.uninstall(dry_run=dry_run, runner=runner)


def status(
    platform: str | None = None,
    *,
    executable: Path | None = None,
    runner: Runner = subprocess.run,
) -> dict[str, Any]:
    """What the service manager says about memd, plus whether the files are the ones we would
    write.

    Keys: ``manager``, ``available`` (the manager answered), ``path``, ``installed``,
    ``up_to_date`` (None when the memd executable cannot be found), ``running`` and the manager's
    own words (``active``/``enabled``/``socket_unit`` for systemd; ``loaded``/``state``/``pid``
    for launchd).
    """
    system = _platform(platform)
    try:
        exe = executable if executable is not None else memd_executable()
    except ServiceError:
        exe = None
    env = service_environment(os.environ)
    if system == "linux":
        return systemd.status(exe, env, runner=runner)
    return launchd.status(exe, env, runner=runner)
