"""The checks of the machine and of the running memd: private state, the socket directory, the
daemon and its workspaces, inotify limits, disk space, and the service.

Its own module: these look at files, limits and processes, while memd.ctl.doctor.embedding
checks what memd embeds with.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memd.config import Config
from memd.ctl.doctor.check import Check

LOW_DISK_BYTES = 500 * 1024 * 1024
LOW_DISK_FRACTION = 0.05
FULL_DISK_BYTES = 50 * 1024 * 1024
_INOTIFY = Path("/proc/sys/fs/inotify")


# -- the socket directory ---------------------------------------------------------------------


def check_private_state(config: Config) -> Check:
    """Indexes and their WAL hold the text of every memory file: no other user may read them."""
    from memd.private import not_private

    name = "private state"
    state = config.state_dir
    if not state.exists():
        return Check(name, "ok", f"{state} does not exist yet (memd creates it 0700)")
    exposed = not_private(state)
    if not exposed:
        return Check(name, "ok", f"{state}: directories 0700, files 0600")
    shown = ", ".join(
        f"{p.relative_to(state) if p != state else '.'} {stat.S_IMODE(os.lstat(p).st_mode):04o}"
        for p in exposed[:5]
    )
    more = f" and {len(exposed) - 5} more" if len(exposed) > 5 else ""
    return Check(
        name,
        "fail",
        f"{len(exposed)} item(s) in {state} are open to other users: {shown}{more}",
        f"start memd (it tightens them), or: chmod -R go-rwx {state}",
    )


def check_socket_dir(socket: Path | None) -> Check:
    """The socket's directory must be a real directory, owned by the user, mode 0700."""
    name = "socket directory"
    if socket is None:
        return Check(
            name, "fail", "cannot tell where the socket is", "set MEMD_SOCKET or MEMD_HOME"
        )
    directory = socket.parent
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return Check(name, "ok", f"{directory} does not exist yet; memd run creates it 0700")
    if stat.S_ISLNK(st.st_mode):
        return Check(
            name, "fail", f"{directory} is a symlink", f"rm {directory}; memd run creates it 0700"
        )
    if not stat.S_ISDIR(st.st_mode):
        return Check(name, "fail", f"{directory} is not a directory", f"remove {directory}")
    if st.st_uid != os.getuid():
        return Check(
            name,
            "fail",
            f"socket directory {directory} belongs to uid {st.st_uid}, not to you",
            "set MEMD_SOCKET to a path in a directory of your own",
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return Check(
            name,
            "fail",
            f"socket directory {directory} is not private (mode {mode:04o})",
            f"chmod 700 {directory}",
        )
    return Check(name, "ok", f"{directory} is yours, mode {mode:04o}")


# -- the daemon -------------------------------------------------------------------------------


def check_daemon(socket: Path | None) -> tuple[Check, dict[str, Any] | None]:
    """Ask the daemon for its status; not running is a warning, not a failure."""
    from memd_client.connection import Client, DaemonNotRunning
    from memd_client.errors import MemdError

    name = "daemon"
    try:
        with Client(socket, 10.0, autostart=False) as client:  # the doctor looks, never starts
            status = client.status()
    except DaemonNotRunning as exc:
        from memd_client.autostart import enabled

        if enabled():
            fix = "nothing to do: the next client starts it (or `memctl start` now)"
        else:
            fix = "memd run, or `memctl service install` (MEMD_AUTOSTART is off: clients do not start it)"
        return Check(name, "warn", str(exc) or "memd is not running", fix), None
    except (MemdError, OSError) as exc:
        return Check(
            name, "fail", f"memd does not answer: {exc}", "check `journalctl --user -u memd`"
        ), None
    daemon = status.get("daemon") or {}
    workspaces = status.get("workspaces") or []
    names = ", ".join(str(w.get("workspace")) for w in workspaces) or "none"
    from memd.ctl.display_status import started_text

    started = f", started {started_text(daemon['started'])}" if daemon.get("started") else ""
    detail = (
        f"running, pid {daemon.get('pid')}, version {daemon.get('version')}{started}; "
        f"{len(workspaces)} workspace(s): {names}"
    )
    errors = [
        f"{w.get('workspace')}: {(w.get('provider') or {}).get('last_error')}"
        for w in workspaces
        if (w.get("provider") or {}).get("last_error")
    ]
    if errors:
        warn = Check(name, "warn", f"{detail}; embedding errors: {'; '.join(errors)}", None)
        return warn, dict(status)
    return Check(name, "ok", detail), dict(status)


def check_workspaces(status: Mapping[str, Any] | None) -> Check:
    """What each workspace's index cannot follow: its directory gone or replaced, the watcher,
    files found but not indexed (too large, transcripts in a format memd does not read)."""
    name = "workspaces"
    if status is None:
        return Check(name, "skip", "memd is not running")
    findings = []
    for w in status.get("workspaces") or []:
        ws = w.get("workspace")
        findings += [f"{ws}: {p}" for p in (w.get("freshness") or {}).get("problems") or []]
        findings += [
            f"{ws}: {s.get('path')} not indexed ({s.get('reason')})"
            for s in w.get("files_skipped") or []
        ]
    if not findings:
        return Check(name, "ok", f"{len(status.get('workspaces') or [])} workspace(s) followed")
    return Check(
        name,
        "warn",
        "; ".join(findings),
        "a transcript must be OpenClaw JSONL (README: Session transcripts); split a file over "
        "index.max_file_bytes or raise the limit; mount or re-add a directory that moved",
    )


# -- inotify ----------------------------------------------------------------------------------


def check_inotify(config: Config, status: Mapping[str, Any] | None, proc: Path = _INOTIFY) -> Check:
    """Compare the directories memd watches with the kernel's per-user inotify limits."""
    name = "inotify"
    if not sys.platform.startswith("linux") or not proc.is_dir():
        return Check(name, "skip", "not Linux (no inotify limits to check)")
    max_watches = int((proc / "max_user_watches").read_text().strip())
    max_instances = int((proc / "max_user_instances").read_text().strip())
    roots = _watched_workspaces(config, status)
    dirs = sum(_count_watches(root, extras) for root, extras in roots.items())
    # Two watches a directory: the watcher's and its change probe's (memd/watch/probe.py),
    # which is an inotify instance of its own per workspace.
    watches = 2 * dirs
    detail = (
        f"{dirs} director{'y' if dirs == 1 else 'ies'} in {len(roots)} workspace(s) "
        f"({watches} watches); "
        f"limits: max_user_watches {max_watches}, max_user_instances {max_instances}"
    )
    watcher_errors = [
        str((w.get("watcher") or {}).get("reason"))
        for w in (status or {}).get("workspaces") or []
        if "inotify" in str((w.get("watcher") or {}).get("reason") or "")
    ]
    want = max(524288, 2 * watches)
    fix_watches = (
        f"sudo sysctl fs.inotify.max_user_watches={want} (persist it in /etc/sysctl.d/60-memd.conf)"
    )
    if watcher_errors:
        return Check(name, "fail", f"{detail}; watcher: {'; '.join(watcher_errors)}", fix_watches)
    if watches >= max_watches:
        return Check(name, "fail", f"{detail}: more directories than watches", fix_watches)
    if len(roots) + 1 >= max_instances:
        return Check(
            name,
            "fail",
            f"{detail}: more workspaces than inotify instances",
            f"sudo sysctl fs.inotify.max_user_instances={max(1024, 2 * len(roots))}",
        )
    if watches > max_watches // 2:
        return Check(
            name,
            "warn",
            f"{detail}: over half the watches (other programs share them)",
            fix_watches,
        )
    return Check(name, "ok", detail)


def _watched_workspaces(
    config: Config, status: Mapping[str, Any] | None
) -> dict[str, tuple[str, ...]]:
    """Workspace roots -> extra paths: the daemon's, the registry's and the config file's."""
    from memd.registry import load_registry

    roots: dict[str, tuple[str, ...]] = {}
    for entry in load_registry(config.state_dir / "workspaces.json"):
        extras = entry.get("extra_paths") or []
        roots[os.path.abspath(entry["path"])] = tuple(str(e) for e in extras)
    for ws in config.workspaces:
        root = os.path.abspath(os.path.expanduser(ws.path))
        roots.setdefault(root, ws.extra_paths)
    for w in (status or {}).get("workspaces") or []:
        if isinstance(w.get("root"), str):
            roots.setdefault(os.path.abspath(w["root"]), ())
    return roots


def _count_watches(root: str, extras: Iterable[str]) -> int:
    """The inotify watches one workspace takes: one per directory watched (recursively)."""
    from memd.watch.layout import WatchLayout

    if not os.path.isdir(root):
        return 0
    total = 0
    for path, recursive in WatchLayout.build(Path(root), list(extras)).desired().items():
        if not recursive:
            total += 1
            continue
        for _dirpath, _dirnames, _files in os.walk(path, followlinks=False):
            total += 1
    return total


# -- disk space -------------------------------------------------------------------------------


def check_disk(config: Config) -> Check:
    """Free space where the indexes live: warn below 500 MB or 5 %, fail below 50 MB."""
    name = "disk space"
    where = config.index_dir
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    used = _tree_bytes(where)
    fraction = usage.free / usage.total if usage.total else 0.0
    detail = (
        f"{_size(usage.free)} free of {_size(usage.total)} ({fraction:.0%}) at {probe}; "
        f"indexes use {_size(used)}"
    )
    fix = f"free space on the file system of {probe} (or move MEMD_HOME / XDG_STATE_HOME)"
    if usage.free < FULL_DISK_BYTES:
        return Check(name, "fail", f"{detail}: index writes will fail", fix)
    if usage.free < LOW_DISK_BYTES or fraction < LOW_DISK_FRACTION:
        return Check(name, "warn", f"{detail}: running low", fix)
    return Check(name, "ok", detail)


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


# -- the service ------------------------------------------------------------------------------


def check_service() -> Check:
    """The systemd user unit's state (informational: not installed is not a failure)."""
    name = "service"
    systemctl = shutil.which("systemctl")
    if not sys.platform.startswith("linux") or systemctl is None:
        return Check(name, "skip", "no systemctl here; run memd yourself or under launchd")
    try:
        proc = subprocess.run(
            [systemctl, "--user", "show", "memd", "--property=LoadState,ActiveState,SubState"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, "skip", f"systemctl --user did not answer: {exc}")
    props = dict(line.partition("=")[::2] for line in proc.stdout.splitlines() if "=" in line)
    if proc.returncode != 0 or "LoadState" not in props:
        why = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()
        return Check(name, "skip", f"no systemd user manager: {why[0] if why else '?'}")
    load, active = props.get("LoadState", ""), props.get("ActiveState", "")
    sub = props.get("SubState", "")
    if load == "not-found":
        return Check(name, "skip", "memd.service is not installed", "memctl service install")
    if active == "failed":
        return Check(
            name,
            "fail",
            f"memd.service has failed ({sub})",
            "journalctl --user -u memd -e; then systemctl --user restart memd",
        )
    if active == "active":
        return Check(name, "ok", f"memd.service is active ({sub})")
    return Check(
        name, "ok", f"memd.service is installed, {active or 'unknown'} ({sub or load})", None
    )
