"""The blocking client of the memd daemon: one Unix socket, msgpack-RPC calls, typed errors.

A :class:`Client` is meant for one thread at a time (open one per thread); a lock serialises
calls anyway, so sharing one is safe, only not concurrent.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from memd_client.errors import Code, Internal, MemdError, Timeout, TooLarge, from_wire
from memd_client.methods import Methods, WorkspaceRef
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

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16
_HINT = "start it with `memd run` or `memctl service install`"


class DaemonUnavailable(MemdError):
    """The connection to the daemon failed or dropped mid-call; the next call reconnects.

    A request whose connection dropped may or may not have been carried out, so it is not
    retried automatically.
    """

    code = Code.INTERNAL


class DaemonNotRunning(DaemonUnavailable):
    """Nothing listens on the socket (no file, or a stale one); the message says how to start it."""

    code = Code.INTERNAL


class _Broken(Exception):
    """The connection is unusable; ``sent`` says whether any request byte left this process."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class Client(Methods):
    """A blocking connection to memd; it connects on first use and reconnects after a failure.

    Args:
        path: the daemon's socket; default ``$MEMD_SOCKET`` or the per-user runtime directory.
        timeout: seconds a call may take from sending to the whole reply; None waits forever.
    """

    def __init__(
        self,
        path: Path | str | None = None,
        timeout: float | None = 30.0,
        *,
        identity: Mapping[str, str] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else socket_path()
        self.timeout = timeout
        self.identity = dict(identity) if identity else None
        self._sock: socket.socket | None = None
        self._unpacker: Any = None
        self._msgid = 0
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
        where = str(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(where)
        except FileNotFoundError:
            sock.close()
            raise DaemonNotRunning(f"memd is not running (no socket at {where}); {_HINT}") from None
        except ConnectionRefusedError:
            sock.close()
            raise DaemonNotRunning(
                f"memd is not running (nothing listens on {where}); {_HINT}"
            ) from None
        except TimeoutError:
            sock.close()
            raise Timeout(f"connecting to memd at {where} timed out") from None
        except BlockingIOError:  # EAGAIN: the listen backlog is full
            sock.close()
            raise DaemonUnavailable(f"memd at {where} is not accepting connections") from None
        except OSError as exc:
            sock.close()
            raise DaemonUnavailable(
                f"cannot connect to memd at {where}: {exc.strerror or exc}"
            ) from None
        sock.setblocking(False)
        self._sock = sock
        self._unpacker = make_unpacker(MAX_RESPONSE_BYTES)
        logger.debug("connected to %s", where)

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            logger.debug("closed connection to %s", self.path)
        self._sock = None
        self._unpacker = None  # an Unpacker that raised must not be used again

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

    def _call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        with self._lock:
            responses, (msgid,) = self._exchange([(method, params)], timeout)
        response = responses[msgid]
        if response.error is not None:
            raise from_wire(response.error)
        return response.result

    def _map(self, method: str, params: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        result = self._call(method, params, timeout)
        if not isinstance(result, dict):
            raise Internal(f"memd answered {method} with a {type(result).__name__}, not a map")
        return result

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

    def _exchange(
        self, calls: list[tuple[str, dict[str, Any]]], timeout: float | None
    ) -> tuple[dict[int, Response], list[int]]:
        """Send the requests and read until each has its reply; the caller holds the lock."""
        payload, ids = self._encode(calls)
        what = calls[0][0] if len(calls) == 1 else f"{len(calls)} pipelined calls"
        deadline = None if timeout is None else time.monotonic() + timeout
        # A connection the daemon closed while idle (or a daemon restart) shows up as EPIPE before
        # any byte is sent: the request surely did not run, so one fresh connection may retry it.
        for attempt in (1, 2):
            fresh = self._sock is None
            if fresh:
                self._open()
            try:
                return self._transfer(payload, set(ids), deadline), ids
            except _Broken as exc:
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
        sock, unpacker = self._sock, self._unpacker
        assert sock is not None and unpacker is not None
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
                    sent += sock.send(view[sent : sent + _CHUNK])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    raise _Broken(self._why(exc), sent=sent > 0) from None
            if flags & (select.POLLIN | select.POLLHUP | select.POLLERR):
                self._receive(sock, unpacker, pending, replies, sent > 0)
        return replies

    def _receive(
        self,
        sock: socket.socket,
        unpacker: Any,
        pending: set[int],
        replies: dict[int, Response],
        sent: bool,
    ) -> None:
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise _Broken(self._why(exc), sent=sent) from None
        if not data:
            raise _Broken("memd closed the connection", sent=sent)
        try:
            unpacker.feed(data)
            for obj in unpacker:
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
            raise _Broken(f"{kind} reply from memd: {exc}", sent=True) from None

    @staticmethod
    def _why(exc: OSError) -> str:
        if exc.errno in (errno.EPIPE, errno.ECONNRESET):
            return "memd closed the connection"
        return f"connection to memd failed: {exc.strerror or exc}"


def connect(
    path: Path | str | None = None,
    timeout: float | None = 30.0,
    *,
    identity: Mapping[str, str] | None = None,
) -> Client:
    """Connect to the memd daemon now; raise DaemonNotRunning if it is not running.

    ``identity`` (agent_id, session_key, chat_type, channel) says whom the client speaks for.
    The client is a context manager that closes the socket on exit.
    """
    return Client(path, timeout, identity=identity).connect()
