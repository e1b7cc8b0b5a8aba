"""The asyncio client of the memd daemon: the same methods, errors and connection rules as the
blocking :class:`memd_client.Client`, awaited.

    async with memd_client.aio.connect() as c:
        hits = (await c.search("agent", "when is the launch?"))["results"]

One client holds one connection, opened on first use and again after a failure. Calls from
many tasks are safe: they take turns on the connection (for parallel calls, open several
clients; the daemon serves each connection on its own thread). A client belongs to the event
loop it first connected in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from memd_client.connection import CHUNK, Broken, DaemonNotRunning, DaemonUnavailable, Wire
from memd_client.errors import Timeout
from memd_client.log import get_logger
from memd_client.methods import AsyncMethods
from memd_client.protocol import Response

__all__ = ["AsyncClient", "connect"]

logger = get_logger(__name__)


class AsyncClient(Wire, AsyncMethods):
    """An asyncio connection to memd; it connects on first use and reconnects after a failure.

    Args:
        path: the daemon's socket; default ``$MEMD_SOCKET`` or the per-user runtime directory.
        timeout: seconds a call may take from sending to the whole reply (time spent waiting
            for another task's call is not counted); None waits forever.
        autostart: start memd when nothing listens on ``path`` (default: on, unless
            ``MEMD_AUTOSTART=0``); the start runs on a worker thread, not on the loop.

    Use it as ``async with`` (connects, and closes on exit), or ``await`` it to connect now.
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
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    # -- connection -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a connection is open (it may still turn out to be dropped by the daemon)."""
        return self._writer is not None

    async def connect(self) -> AsyncClient:
        """Open the connection now, if it is not open; raise DaemonNotRunning if nothing listens."""
        async with self._lock:
            if self._writer is None:
                await self._open()
        return self

    async def close(self) -> None:
        """Close the connection; a later call opens a new one."""
        async with self._lock:
            writer = self._writer
            self._drop()
            if writer is not None:
                try:
                    await writer.wait_closed()
                except OSError:
                    pass  # the daemon went first; closed either way

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self.connect().__await__()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"<AsyncClient {str(self.path)!r} {state}>"

    async def _open(self) -> None:
        try:
            await self._open_socket()
        except DaemonNotRunning:
            if not self.autostart:
                raise
            await asyncio.to_thread(self._start)
            await self._open_socket()

    async def _open_socket(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_unix_connection(str(self.path))
        except OSError as exc:  # TimeoutError included
            raise self._connect_error(exc) from None
        self._reader, self._writer = reader, writer
        self._unpacker = self._new_unpacker()
        logger.debug("connected to %s", self.path)

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            logger.debug("closed connection to %s", self.path)
        self._reader = self._writer = None
        self._unpacker = None

    def _closed_while_idle(self) -> bool:
        """The daemon closed the connection between calls (its idle limit, a restart): seen
        here before anything is sent, so no request can have reached it."""
        reader, writer = self._reader, self._writer
        return (
            reader is not None
            and writer is not None
            and (reader.at_eof() or reader.exception() is not None or writer.is_closing())
        )

    # -- calls ----------------------------------------------------------------------------------

    async def call(self, method: str, /, **params: Any) -> Any:
        """Call ``method`` with named params (None values are left out) and return its result."""
        return await self._call(method, params, self.timeout)

    async def pipeline(
        self, calls: Sequence[tuple[str, Mapping[str, Any]]], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Send every call before reading any reply, and return the results in call order.

        An error reply raises its exception (the first, in call order) once all replies are
        read; with ``return_exceptions`` the exception takes the result's place instead.
        """
        if not calls:
            return []
        async with self._lock:
            responses, ids = await self._exchange([(m, dict(p)) for m, p in calls], self.timeout)
        return self._in_order(responses, ids, return_exceptions)

    async def _call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        async with self._lock:
            responses, (msgid,) = await self._exchange([(method, params)], timeout)
        return self._result(responses[msgid])

    async def _exchange(
        self, calls: list[tuple[str, dict[str, Any]]], timeout: float | None
    ) -> tuple[dict[int, Response], list[int]]:
        """Send the requests and read until each has its reply; the caller holds the lock."""
        payload, ids = self._encode(calls)
        what = self._what(calls)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if self._closed_while_idle():
            self._drop()
        # A connection closed while idle that was not noticed yet fails the first write before
        # any byte is sent: the request surely did not run, so one fresh connection may retry it.
        for attempt in (1, 2):
            fresh = self._writer is None
            if fresh:
                await self._open()
            try:
                async with asyncio.timeout_at(deadline):
                    return await self._transfer(payload, set(ids)), ids
            except Broken as exc:
                self._drop()
                if exc.sent or fresh or attempt == 2:
                    raise DaemonUnavailable(f"{exc} (during {what})") from None
                logger.debug("connection was closed while idle; reconnecting")
            except TimeoutError:
                self._drop()  # a late reply must not be read as the next call's
                assert timeout is not None
                raise Timeout(f"no reply from memd to {what} within {timeout:g} s") from None
            except BaseException:  # cancelled mid-reply: the stream is out of step
                self._drop()
                raise
        raise AssertionError("unreachable")

    async def _transfer(self, payload: bytes, pending: set[int]) -> dict[int, Response]:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        # The transport sends what the socket does not take at once in the background while
        # the replies are read, so a long pipeline cannot deadlock against the daemon.
        writer.write(payload)
        if writer.is_closing():
            # Only the first, direct send can fail inside write(): no byte of it left.
            raise Broken("memd closed the connection", sent=False)
        replies: dict[int, Response] = {}
        while pending:
            try:
                data = await reader.read(CHUNK)
            except OSError as exc:
                raise Broken(self._why(exc), sent=True) from None
            self._absorb(data, pending, replies, sent=True)
        return replies


def connect(
    path: Path | str | None = None,
    timeout: float | None = 30.0,
    *,
    identity: Mapping[str, str] | None = None,
    autostart: bool | None = None,
) -> AsyncClient:
    """An asyncio client of the memd daemon: ``async with connect() as c`` connects (starting
    memd if nothing listens, unless ``autostart`` is False or ``MEMD_AUTOSTART=0``; raising
    DaemonNotRunning if it is not running then) and closes on exit; ``await connect()``
    connects.

    ``identity`` (agent_id, session_key, chat_type, channel) says whom the client speaks for.
    """
    return AsyncClient(path, timeout, identity=identity, autostart=autostart)
