"""The blocking client of the memd daemon: one Unix socket, msgpack-RPC calls, typed errors.

A :class:`Client` is meant for one thread at a time (open one per thread); a lock serialises
calls anyway, so sharing one is safe, only not concurrent. What it shares with the asyncio
client (:mod:`memd_client.aio`) lives in :class:`Wire`: msgids, request encoding and the size
check, reply decoding, and what a failed connect means.
"""

from __future__ import annotations

import errno
import select
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from memd_client.autostart import enabled as _autostart_default
from memd_client.errors import Code, MemdError, Timeout, TooLarge, from_wire
from memd_client.log import get_logger
from memd_client.methods import BlockingMethods, WorkspaceRef
from memd_client.paths import socket_path
from memd_client.protocol import (
    MAX_MSGID,
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    REQUEST,
    ProtocolError,
    Response,
    make_unpacker,
    pack,
    parse,
)

__all__ = ["Client", "DaemonNotRunning", "DaemonUnavailable", "WorkspaceRef", "connect"]

logger = get_logger(__name__)

CHUNK = 1 << 16
_HINT = "start it with `memd run` or `memctl service install`"
_OFF_HINT = f"{_HINT} (clients do not start it: MEMD_AUTOSTART is off)"


class DaemonUnavailable(MemdError):
    """The connection to the daemon failed or dropped mid-call; the next call reconnects.

    A request whose connection dropped may or may not have been carried out, so it is not
    retried automatically.
    """

    code = Code.INTERNAL


class DaemonNotRunning(DaemonUnavailable):
    """Nothing listens on the socket (no file, or a stale one); the message says how to start it."""

    code = Code.INTERNAL


class Broken(Exception):
    """The connection is unusable; ``sent`` says whether any request byte left this process."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class Wire:
    """The protocol state of a client, whatever carries its bytes: the socket path and timeout,
    msgids (kept across reconnects), request encoding and reply decoding."""

    identity: Mapping[str, str] | None

    def __init__(
        self,
        path: Path | str | None,
        timeout: float | None,
        identity: Mapping[str, str] | None,
        autostart: bool | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else socket_path()
        self.timeout = timeout
        self.identity = dict(identity) if identity else None
        # Start memd when nothing listens (memd_client.autostart); default: MEMD_AUTOSTART.
        self.autostart = _autostart_default() if autostart is None else autostart
        self._msgid = 0
        self._unpacker: Any = None  # one per connection: an Unpacker that raised is not reused

    def _connect_error(self, exc: OSError) -> MemdError:
        """What a failed connect means: not running, too slow, or otherwise unavailable."""
        where = str(self.path)
        hint = _HINT if self.autostart or _autostart_default() else _OFF_HINT
        if isinstance(exc, FileNotFoundError):
            return DaemonNotRunning(f"memd is not running (no socket at {where}); {hint}")
        if isinstance(exc, ConnectionRefusedError):
            return DaemonNotRunning(f"memd is not running (nothing listens on {where}); {hint}")
        if isinstance(exc, TimeoutError):
            return Timeout(f"connecting to memd at {where} timed out")
        if isinstance(exc, BlockingIOError):  # EAGAIN: the listen backlog is full
            return DaemonUnavailable(f"memd at {where} is not accepting connections")
        return DaemonUnavailable(f"cannot connect to memd at {where}: {exc.strerror or exc}")

    def _start(self) -> None:
        """Start memd for this socket and wait until it answers (one starter wins; the others
        wait for it); DaemonNotRunning says why it could not be started."""
        from memd_client.autostart import StartFailed, ensure_running

        try:
            ensure_running(self.path)
        except StartFailed as exc:
            raise DaemonNotRunning(f"memd is not running at {self.path}, and {exc}") from None

    def _encode(self, calls: Iterable[tuple[str, dict[str, Any]]]) -> tuple[bytes, list[int]]:
        parts, ids = [], []
        for method, params in calls:
            self._msgid = self._msgid + 1 if self._msgid < MAX_MSGID else 1
            named = {k: v for k, v in params.items() if v is not None}
            data = pack([REQUEST, self._msgid, method, [named] if named else []])
            if len(data) > MAX_REQUEST_BYTES:
                raise TooLarge(
                    f"{method} request is {len(data)} bytes; the limit is {MAX_REQUEST_BYTES}"
                )
            parts.append(data)
            ids.append(self._msgid)
        return b"".join(parts), ids

    def _absorb(
        self, data: bytes, pending: set[int], replies: dict[int, Response], *, sent: bool
    ) -> None:
        """Decode what arrived; a reply to a pending msgid moves from ``pending`` to ``replies``."""
        if not data:
            raise Broken("memd closed the connection", sent=sent)
        try:
            self._unpacker.feed(data)
            for obj in self._unpacker:
                message = parse(obj)
                if not isinstance(message, Response):
                    logger.debug("ignoring a %s from memd", type(message).__name__)
                elif message.msgid in pending:
                    pending.discard(message.msgid)
                    replies[message.msgid] = message
                else:
                    logger.debug("ignoring a reply to msgid %s", message.msgid)
        except (ValueError, TypeError) as exc:  # msgpack's errors and ProtocolError are ValueErrors
            kind = "malformed" if isinstance(exc, ProtocolError) else "undecodable"
            raise Broken(f"{kind} reply from memd: {exc}", sent=True) from None

    @staticmethod
    def _new_unpacker() -> Any:
        return make_unpacker(MAX_RESPONSE_BYTES)

    @staticmethod
    def _what(calls: Sequence[tuple[str, Any]]) -> str:
        return calls[0][0] if len(calls) == 1 else f"{len(calls)} pipelined calls"

    @staticmethod
    def _result(response: Response) -> Any:
        if response.error is not None:
            raise from_wire(response.error)
        return response.result

    @staticmethod
    def _in_order(
        responses: dict[int, Response], ids: list[int], return_exceptions: bool
    ) -> list[Any]:
        """A pipeline's results in call order; an error raises (the first) once all are read,
        or with ``return_exceptions`` takes its result's place."""
        results: list[Any] = []
        for msgid in ids:
            response = responses[msgid]
            if response.error is None:
                results.append(response.result)
            elif return_exceptions:
                results.append(from_wire(response.error))
            else:
                raise from_wire(response.error)
        return results

    @staticmethod
    def _why(exc: OSError) -> str:
        if exc.errno in (errno.EPIPE, errno.ECONNRESET):
            return "memd closed the connection"
        return f"connection to memd failed: {exc.strerror or exc}"


class Client(Wire, BlockingMethods):
    """A blocking connection to memd; it connects on first use and reconnects after a failure.

    Args:
        path: the daemon's socket; default ``$MEMD_SOCKET`` or the per-user runtime directory.
        timeout: seconds a call may take from sending to the whole reply; None waits forever.
        autostart: start memd when nothing listens on ``path`` (default: on, unless
            ``MEMD_AUTOSTART=0``).
    """

    def __init__(
        self,
        path: Path | str | None = None,
        timeout: float | None = 30.0,
        *,
        identity: Mapping[str, str] | None = None,
        autostart: bool | None = None,
    ) -> None:
        super().__init__(path, timeout, identity, autostart)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    # -- connection -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a socket is open (it may still turn out to be dropped by the daemon)."""
        return self._sock is not None

    def connect(self) -> Client:
        """Open the socket now, if it is not open; raise DaemonNotRunning if nothing listens."""
        with self._lock:
            if self._sock is None:
                self._open()
        return self

    def close(self) -> None:
        """Close the socket; a later call opens a new one."""
        with self._lock:
            self._drop()

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"<Client {str(self.path)!r} {state}>"

    def _open(self) -> None:
        try:
            self._open_socket()
        except DaemonNotRunning:
            if not self.autostart:
                raise
            self._start()
            self._open_socket()

    def _open_socket(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self.path))
        except OSError as exc:
            sock.close()
            raise self._connect_error(exc) from None
        sock.setblocking(False)
        self._sock = sock
        self._unpacker = self._new_unpacker()
        logger.debug("connected to %s", self.path)

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            logger.debug("closed connection to %s", self.path)
        self._sock = None
        self._unpacker = None

    # -- calls ----------------------------------------------------------------------------------

    def call(self, method: str, /, **params: Any) -> Any:
        """Call ``method`` with named params (None values are left out) and return its result."""
        return self._call(method, params, self.timeout)

    def pipeline(
        self, calls: Sequence[tuple[str, Mapping[str, Any]]], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Send every call before reading any reply, and return the results in call order.

        An error reply raises its exception (the first, in call order) once all replies are
        read; with ``return_exceptions`` the exception takes the result's place instead.
        """
        if not calls:
            return []
        with self._lock:
            responses, ids = self._exchange([(m, dict(p)) for m, p in calls], self.timeout)
        return self._in_order(responses, ids, return_exceptions)

    def _call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        with self._lock:
            responses, (msgid,) = self._exchange([(method, params)], timeout)
        return self._result(responses[msgid])

    def _exchange(
        self, calls: list[tuple[str, dict[str, Any]]], timeout: float | None
    ) -> tuple[dict[int, Response], list[int]]:
        """Send the requests and read until each has its reply; the caller holds the lock."""
        payload, ids = self._encode(calls)
        what = self._what(calls)
        deadline = None if timeout is None else time.monotonic() + timeout
        # A connection the daemon closed while idle (or a daemon restart) shows up as EPIPE before
        # any byte is sent: the request surely did not run, so one fresh connection may retry it.
        for attempt in (1, 2):
            fresh = self._sock is None
            if fresh:
                self._open()
            try:
                return self._transfer(payload, set(ids), deadline), ids
            except Broken as exc:
                self._drop()
                if exc.sent or fresh or attempt == 2:
                    raise DaemonUnavailable(f"{exc} (during {what})") from None
                logger.debug("connection was closed while idle; reconnecting")
            except TimeoutError:
                self._drop()  # a late reply must not be read as the next call's
                assert timeout is not None
                raise Timeout(f"no reply from memd to {what} within {timeout:g} s") from None
            except BaseException:  # KeyboardInterrupt mid-reply: the stream is out of step
                self._drop()
                raise
        raise AssertionError("unreachable")

    def _transfer(
        self, payload: bytes, pending: set[int], deadline: float | None
    ) -> dict[int, Response]:
        sock = self._sock
        assert sock is not None
        view, sent = memoryview(payload), 0
        replies: dict[int, Response] = {}
        poller = select.poll()
        # Writing and reading interleave so that a long pipeline cannot deadlock against a daemon
        # that blocks writing replies nobody reads.
        while pending:
            events = select.POLLIN | (select.POLLOUT if sent < len(view) else 0)
            poller.register(sock, events)
            if deadline is None:
                ready = poller.poll()
            else:
                left = deadline - time.monotonic()
                ready = poller.poll(max(0, int(left * 1000) + 1)) if left > 0 else []
                if not ready:
                    raise TimeoutError
            flags = ready[0][1] if ready else 0
            if flags & select.POLLOUT and sent < len(view):
                try:
                    sent += sock.send(view[sent : sent + CHUNK])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    raise Broken(self._why(exc), sent=sent > 0) from None
            if flags & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    data = sock.recv(CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    raise Broken(self._why(exc), sent=sent > 0) from None
                self._absorb(data, pending, replies, sent=sent > 0)
        return replies


def connect(
    path: Path | str | None = None,
    timeout: float | None = 30.0,
    *,
    identity: Mapping[str, str] | None = None,
    autostart: bool | None = None,
) -> Client:
    """Connect to the memd daemon now, starting it if nothing listens (unless ``autostart``
    is False or ``MEMD_AUTOSTART=0``); raise DaemonNotRunning if it is not running then.

    ``identity`` (agent_id, session_key, chat_type, channel) says whom the client speaks for.
    The client is a context manager that closes the socket on exit.
    """
    return Client(path, timeout, identity=identity, autostart=autostart).connect()
