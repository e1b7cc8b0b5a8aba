"""Which directories memd refuses to index: the root, system directories, pseudo file systems, and
(for extra paths) the home directory and its parents.

Its own module because the registry and the workspace check paths given at run time with the
same rules the configuration file is checked with.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from memd.config.errors import _show

# Directories that hold the system, not anyone's notes (Linux and macOS): a workspace or an
# extra path there would have memd walk and watch the system (status took 32 s with "/").
SYSTEM_DIRS = frozenset(
    {
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/media",
        "/mnt",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/snap",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/local",
        "/usr/share",
        "/var",
        "/var/tmp",
        "/Applications",
        "/Library",
        "/System",
        "/Users",
        "/Volumes",
        "/private",
        "/private/tmp",
        "/private/var",
    }
)
# Pseudo file systems: nothing under them is a note, and some of their walks never end.
_PSEUDO_FS = ("/proc", "/sys", "/dev")


@functools.lru_cache(maxsize=1)
def _system_dirs() -> frozenset[str]:
    """SYSTEM_DIRS and where they lead (``/bin`` is ``/usr/bin`` on most systems now)."""
    return SYSTEM_DIRS | {os.path.realpath(d) for d in SYSTEM_DIRS}


def refused_directory(path: str | Path) -> str | None:
    """Why ``path`` (a directory, symlinks followed) cannot be a workspace or an extra path,
    or None: the root of the file system, a system directory, or a pseudo file system."""
    real = os.path.realpath(os.path.expanduser(path))
    if real == os.path.dirname(real):
        return "it is the root of the file system"
    if real in _system_dirs():
        return "it is a system directory"
    if any(real == fs or real.startswith(fs + "/") for fs in _PSEUDO_FS):
        return "it is on a pseudo file system"
    return None


def refused_extra_path(root: Path, entry: str, what: str = "an extra path") -> str | None:
    """Why the extra path ``entry`` of the workspace at ``root`` (resolved against it, as
    discovery does) cannot be indexed, or None. Extra paths (and transcript folders) are walked
    whole: besides what no workspace may be, the home directory and its parents are refused."""
    full = os.path.normpath(os.path.join(os.path.abspath(root), os.path.expanduser(entry)))
    why = refused_directory(full)
    if why is None:
        real = os.path.realpath(full)
        home = os.path.realpath(os.path.expanduser("~"))
        if real == home or home.startswith(real.rstrip("/") + "/"):
            why = "it is the home directory or holds it"
    if why is None:
        return None
    return f"{_show(entry)} cannot be {what}: {why} (name a folder of notes instead)"
