"""Detect network filesystems, where inotify never sees changes made by other machines."""

from __future__ import annotations

import logging
import os
import re

__all__ = ["NETWORK_FS_TYPES", "filesystem_type", "network_filesystem"]

logger = logging.getLogger(__name__)

# watchdog #409/#504/#395: changes made through another kernel never reach inotify; poll instead.
NETWORK_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "sshfs",
        "9p",
        "afs",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "davfs",
        "fuse.davfs2",
    }
)
_MOUNTINFO = "/proc/self/mountinfo"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def filesystem_type(path: str, mountinfo: str | None = None) -> str | None:
    """Return the type of the filesystem holding ``path`` (Linux mountinfo), or None if unknown."""
    if mountinfo is None:
        try:
            with open(_MOUNTINFO, encoding="utf-8", errors="replace") as f:
                mountinfo = f.read()
        except OSError:
            return None  # not Linux, or no /proc: callers keep the native watcher
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        # "36 35 98:0 /root /mnt/point opts [optional fields...] - fstype source superopts"
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or not after:
            continue
        mount_point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[4])
        if _under(target, mount_point) and (best is None or len(mount_point) >= best[0]):
            best = (len(mount_point), after[0])
    return best[1] if best is not None else None


def network_filesystem(path: str, mountinfo: str | None = None) -> str | None:
    """Return the filesystem type when ``path`` is on a network filesystem, else None."""
    fstype = filesystem_type(path, mountinfo)
    return fstype if fstype is not None and fstype.lower() in NETWORK_FS_TYPES else None


def _under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
