"""Replies on their way out: what each connection has not yet sent, and a bound on all of it.

A client that pipelines requests and never reads its replies must cost a bounded amount and
then nothing. Each connection's kernel send buffer is set to SEND_BUFFER_BYTES; once it is full
the connection's thread waits in :meth:`Outbox.send` and reads none of its further requests, so
a connection holds at most that buffer and one reply. A reply that makes no progress for
``write_timeout`` seconds closes its connection. The replies packed and not yet taken by the
kernel, over all connections, are kept near ``max_unsent`` bytes: above it no connection starts
on its next request, and connections whose reply has been stuck for STALL_GRACE_SECONDS are
closed to make room. A new client that finds every slot taken gets the slot of such a stuck
connection (:meth:`Outbox.shed_stalled`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

__all__ = [
    "MAX_UNSENT_BYTES",
    "SEND_BUFFER_BYTES",
    "STALL_GRACE_SECONDS",
    "Outbox",
    "Outgoing",
    "Shed",
]

logger = logging.getLogger(__name__)

# The kernel's buffer for one connection's replies (Linux doubles what is asked): a client that
# reads slowly still gets its replies at full speed, and a client that never reads holds this.
SEND_BUFFER_BYTES = 256 << 10
# Replies packed but not yet taken by the kernel, over all connections (a `get` reply may be
# up to the protocol's 16 MiB: 256 stuck clients would otherwise hold gigabytes).
MAX_UNSENT_BYTES = 64 << 20
# A reply stuck this long marks a client that does not read: its connection may be closed when
# another needs the room (the budget, or a connection slot).
STALL_GRACE_SECONDS = 1.0
# The longest a waiting send sleeps between looks at its deadline. Shedding and stopping shut
# the socket down, which wakes it at once: 256 stuck threads waking often would each take the
# GIL that the clients being served need.
SEND_WAKE_SECONDS = 5.0


class Shed(Exception):
    """The connection was closed because its client does not read its replies."""


class Outgoing:
    """One connection's side of the ledger."""

    __slots__ = ("since", "sock", "shed", "unsent")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.unsent = 0  # bytes of the reply being sent that the kernel has not taken
        self.since: float | None = None  # when its reply last made progress (None: no reply)
        self.shed: str | None = None  # why it was closed to make room


class Outbox:
    """The replies of all connections: their unsent bytes, the budget, who gives way."""

    def __init__(
        self,
        *,
        max_unsent: int = MAX_UNSENT_BYTES,
        write_timeout: float = 30.0,
        stall_grace: float = STALL_GRACE_SECONDS,
    ) -> None:
        self.max_unsent = max_unsent
        self.write_timeout = write_timeout
        self.stall_grace = stall_grace
        self._lock = threading.Lock()
        self._open: set[Outgoing] = set()
        self.unsent = 0  # over all connections
        self.peak_unsent = 0
        self.shed_count = 0  # connections closed because their client did not read

    def open(self, sock: socket.socket) -> Outgoing:
        """Enter a new connection and bound its kernel send buffer."""
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        entry = Outgoing(sock)
        with self._lock:
            self._open.add(entry)
        return entry

    def close(self, entry: Outgoing) -> None:
        """Leave the ledger; call before the socket is closed (shedding shuts it down under the
        same lock, so never a descriptor number reused by a newer connection)."""
        with self._lock:
            self._open.discard(entry)
            self.unsent -= entry.unsent
            entry.unsent, entry.since = 0, None

    def send(self, entry: Outgoing, data: bytes, stopping: Callable[[], bool]) -> None:
        """Send one reply whole; raise Shed when the client stops taking it."""
        view = memoryview(data)
        now = time.monotonic()
        with self._lock:
            entry.unsent, entry.since = len(data), now
            self.unsent += len(data)
            self.peak_unsent = max(self.peak_unsent, self.unsent)
        try:
            while view:
                if entry.shed is not None:
                    raise Shed(entry.shed)
                if stopping():
                    raise Shed("the daemon is stopping")
                left = self.write_timeout - (time.monotonic() - (entry.since or now))
                if left <= 0:
                    self._count_shed()
                    raise Shed(f"the client read none of its reply for {self.write_timeout:g} s")
                entry.sock.settimeout(min(left, SEND_WAKE_SECONDS))
                try:
                    sent = entry.sock.send(view)
                except TimeoutError:
                    continue
                view = view[sent:]
                with self._lock:
                    entry.unsent -= sent
                    self.unsent -= sent
                    entry.since = time.monotonic()
        finally:
            with self._lock:
                self.unsent -= entry.unsent
                entry.unsent, entry.since = 0, None

    def wait_for_room(self, entry: Outgoing, stopping: Callable[[], bool]) -> None:
        """Before a connection starts on its next request: while all unsent replies are over
        the budget, close stuck connections, else wait for the others' clients to read."""
        deadline = time.monotonic() + self.write_timeout
        while self.unsent > self.max_unsent and not stopping():
            if entry.shed is not None:
                raise Shed(entry.shed)
            if not self._shed(over_budget=True) and time.monotonic() > deadline:
                raise Shed("the replies of other clients filled the output budget")
            time.sleep(0.05)

    def stalled(self) -> int:
        """How many connections have had a reply stuck for the grace or longer."""
        now = time.monotonic()
        with self._lock:
            return sum(
                1
                for e in self._open
                if e.shed is None and e.since is not None and now - e.since >= self.stall_grace
            )

    def shed_stalled(self) -> bool:
        """Close the connection whose reply has been stuck longest (at least the grace), to
        give its slot to a new client; False when no connection is stuck."""
        return self._shed(over_budget=False)

    def _shed(self, *, over_budget: bool) -> bool:
        now = time.monotonic()
        with self._lock:
            stuck = [
                e
                for e in self._open
                if e.shed is None and e.since is not None and now - e.since >= self.stall_grace
            ]
            # Over the budget the largest stuck replies go first; for a slot, the oldest.
            stuck.sort(key=(lambda e: -e.unsent) if over_budget else (lambda e: e.since or now))
            shed = False
            # A shed reply leaves the ledger as its thread ends: count it gone already.
            left = self.unsent - sum(e.unsent for e in self._open if e.shed is not None)
            for entry in stuck:
                if over_budget and left <= self.max_unsent:
                    break
                waited = now - (entry.since or now)
                entry.shed = f"the client read none of its reply for {waited:.1f} s"
                left -= entry.unsent
                self.shed_count += 1
                shed = True
                with contextlib.suppress(OSError):  # wakes its thread out of send()
                    entry.sock.shutdown(socket.SHUT_RDWR)
                if not over_budget:
                    break
        if shed:
            logger.info("closed a connection whose client does not read its replies")
        return shed

    def _count_shed(self) -> None:
        with self._lock:
            self.shed_count += 1
