"""memd and the service manager that runs it (systemd, launchd, or a client that started it
on demand): the notices it is sent (READY, STOPPING, WATCHDOG), the signals it sends (stop,
reload), how this memd was started, and when a socket-activated memd has been idle long
enough to stop.

Its own module: what the lifecycle (memd/daemon/__init__.py) tells or asks the outside world
about itself, apart from how it runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, MutableMapping
from types import FrameType
from typing import Any

from memd.daemon.parts import Parts
from memd.ipc.activation import Activation

__all__ = ["Idle", "capture_signals", "how_started", "sd_notify"]

logger = logging.getLogger(__name__)


def sd_notify(message: str) -> bool:
    """Send ``message`` to systemd's notify socket, if there is one (a datagram, no dependency)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError as exc:
            logger.warning("sd_notify failed: %s", exc)
            return False
    return True


def how_started(activation: Activation | None, env: MutableMapping[str, str]) -> dict[str, Any]:
    """How this memd was started, as status says it: ``how`` (socket activation, service, on
    demand, by hand) and ``by`` (the manager, or the client that started it)."""
    by_client = env.pop("MEMD_STARTED_BY", None)  # set by memd_client.autostart
    if activation is not None:
        return {"how": "socket activation", "by": activation.manager}
    if by_client:
        return {"how": "on demand", "by": by_client}
    if env.get("INVOCATION_ID"):  # systemd sets it for every unit it runs
        return {"how": "service", "by": "systemd"}
    if env.get("XPC_SERVICE_NAME", "0") != "0":  # launchd's label of the job
        return {"how": "service", "by": f"launchd ({env['XPC_SERVICE_NAME']})"}
    return {"how": "by hand", "by": None}


class Idle:
    """When a socket-activated memd has been idle long enough to stop: no connection, no
    request and no indexing work (pending files, vectors, a rebuild) for ``seconds``."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._calls = -1
        self._since = time.monotonic()

    def expired(self, parts: Parts, now: float) -> bool:
        if not self.seconds:
            return False
        calls = parts.dispatcher.calls
        busy = (
            calls != self._calls
            or parts.server.connections > 0
            or (parts.ctx.model_pull is not None and parts.ctx.model_pull.busy)
            or any(
                parts.writer.pending(ws) or ws.syncer.status.rebuilding or ws.syncer.has_pending()
                for ws in parts.registry.all()
            )
        )
        self._calls = calls
        if busy:
            self._since = now
        return now - self._since >= self.seconds


@contextlib.contextmanager
def capture_signals(
    should_exit: threading.Event, reload_requested: threading.Event
) -> Iterator[None]:
    """Install handlers that only set flags (SIGTERM and SIGINT: ``should_exit``, SIGHUP:
    ``reload_requested``); restore the previous ones afterwards."""
    previous: dict[int, Any] = {}

    def on_exit(signum: int, frame: FrameType | None) -> None:
        if should_exit.is_set() and signum == signal.SIGINT:
            os._exit(1)  # a second Ctrl-C: stop now
        should_exit.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        reload_requested.set()

    for sig, handler in (
        (signal.SIGTERM, on_exit),
        (signal.SIGINT, on_exit),
        (signal.SIGHUP, on_hup),
    ):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
