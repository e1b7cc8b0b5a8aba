"""The listening socket a service manager opened for memd: systemd's (``LISTEN_FDS``) or
launchd's (``Sockets``).

With socket activation the manager listens on memd's socket before memd runs and starts memd
on the first connection (connections wait in the socket's queue meanwhile). memd then takes
that socket instead of binding one, never unlinks its file (the manager owns it), and may stop
when idle: the next connection starts it again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import socket
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from memd.ipc.server import StartupError

__all__ = ["Activation", "ActivationError", "inherited_socket"]

logger = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): the first passed descriptor
LAUNCHD_SOCKET_NAME = "Listeners"  # the key under Sockets in memd's LaunchAgent
_SYSTEMD_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(StartupError):
    """The manager passed something memd cannot serve on (not a listening Unix stream socket)."""


@dataclass(frozen=True)
class Activation:
    """A listening socket memd was given: by which manager, and where its file is."""

    sock: socket.socket
    manager: str
    path: Path | None


def inherited_socket(env: MutableMapping[str, str] | None = None) -> Activation | None:
    """The listening socket systemd or launchd passed to this process, or None.

    systemd's variables are removed from ``env`` (default ``os.environ``), as
    ``sd_listen_fds(1)`` does, so the processes memd starts do not take them for their own.
    """
    env = os.environ if env is None else env
    found = _systemd(env)
    if found is None and sys.platform == "darwin":  # pragma: no cover - macOS only
        found = _launchd()
    return found


def _systemd(env: MutableMapping[str, str]) -> Activation | None:
    pid, count = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    for name in _SYSTEMD_VARIABLES:
        env.pop(name, None)
    if not pid or not count:
        return None
    if not pid.isdigit() or int(pid) != os.getpid():
        return None  # meant for another process (the one that started memd)
    if not count.isdigit() or int(count) < 1:
        raise ActivationError(f"systemd passed LISTEN_FDS={count!r}: not a number of sockets")
    fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count))
    if len(fds) > 1:
        logger.warning(
            "systemd passed %d sockets; memd serves on the first (memd.socket has one "
            "ListenStream=) and closes the others",
            len(fds),
        )
        for fd in fds[1:]:
            os.close(fd)
    sock = _listening(fds[0], "systemd")
    return Activation(sock, "systemd", _path_of(sock))


def _listening(fd: int, manager: str) -> socket.socket:
    """The descriptor ``fd`` as a socket, if it is a listening Unix stream socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ActivationError(
            f"{manager} passed descriptor {fd}, which is not a socket: {exc}"
        ) from None
    sock.set_inheritable(False)
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.detach()  # the descriptor stays the manager's business
        raise ActivationError(
            f"{manager} passed a socket memd cannot serve on ({sock.family.name}, "
            f"{sock.type.name}, {'listening' if listening else 'not listening'}): memd's socket "
            "unit must listen on a path (ListenStream=%t/memd/memd.sock)"
        )
    return sock


def _launchd() -> Activation | None:  # pragma: no cover - macOS only
    """launchd's ``launch_activate_socket``: the sockets of the plist's ``Sockets`` entry."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    fds = ctypes.POINTER(ctypes.c_int)()
    count = ctypes.c_size_t(0)
    error = libc.launch_activate_socket(
        LAUNCHD_SOCKET_NAME.encode(), ctypes.byref(fds), ctypes.byref(count)
    )
    if error:  # ESRCH: not started by launchd; ENOENT: no such socket in the plist
        return None
    try:
        given = [fds[i] for i in range(count.value)]
    finally:
        libc.free(fds)
    if not given:
        return None
    for fd in given[1:]:
        os.close(fd)
    sock = _listening(given[0], "launchd")
    return Activation(sock, "launchd", _path_of(sock))


def _path_of(sock: socket.socket) -> Path | None:
    name = sock.getsockname()
    if isinstance(name, bytes):
        name = name.decode(errors="surrogateescape")
    # An abstract address (leading NUL) has no file: nothing for clients to find by path.
    return Path(name) if name and not name.startswith("\0") else None
