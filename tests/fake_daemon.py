"""A scripted msgpack-RPC server on a real Unix socket, standing in for memd in client tests.

The handler gets each decoded request and returns a plain value (sent as the result), one
action (``Reply``, ``Raw``, ``Hang``, ``Drop``, ``Hold``, ``Release``) or a tuple of actions.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd_client.protocol import RESPONSE, Request, make_unpacker, pack, parse

__all__ = ["Drop", "FakeDaemon", "Hang", "Hold", "Raw", "Release", "Reply", "routes"]


@dataclass
class Reply:
    """A response to the request (or to ``msgid``), with a result or an error."""

    result: Any = None
    error: Any = None
    msgid: int | None = None


@dataclass
class Raw:
    """Bytes sent as they are."""

    data: bytes


@dataclass
class Hang:
    """Wait (the server stops waiting when it is stopped)."""

    seconds: float


@dataclass
class Drop:
    """Close the connection."""


@dataclass
class Hold:
    """Keep this result's response back until a Release."""

    result: Any = None


@dataclass
class Release:
    """Send this result's response, then the held ones, last first."""

    result: Any = None


Handler = Callable[[Request], Any]
_ACTIONS = (Reply, Raw, Hang, Drop, Hold, Release)


def routes(table: Mapping[str, Any]) -> Handler:
    """A handler answering by method name: a value, or a function of the request; else error 3."""

    def handle(req: Request) -> Any:
        if req.method not in table:
            return Reply(error=[3, f"unknown method {req.method!r}"])
        answer = table[req.method]
        return answer(req) if callable(answer) else answer

    return handle


def echo(req: Request) -> Any:
    return {"method": req.method, "params": req.params}


class FakeDaemon:
    """A server thread accepting on a short socket path, one thread per connection."""

    def __init__(self, handler: Handler = echo) -> None:
        self.dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="memd-t"))
        self.path = self.dir / "s.sock"
        self.handler = handler
        self.received: list[Any] = []  # every decoded message, in arrival order
        self.connections = 0
        self.disconnects = 0
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(16)
        self._listener.settimeout(0.05)
        self._acceptor = threading.Thread(target=self._accept, name="fake-memd")

    def __enter__(self) -> FakeDaemon:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._acceptor.join()
        for thread in self._threads:
            thread.join()
        self._listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def methods(self) -> list[str]:
        return [m[2] for m in self.received]

    def wait_for_disconnects(self, n: int, timeout: float = 5.0) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.disconnects >= n, timeout)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._changed:
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), name="fake-memd-conn")
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(0.05)
            unpacker = make_unpacker()
            held: list[bytes] = []
            while not self._stop.is_set():
                try:
                    data = conn.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    return
                unpacker.feed(data)
                for obj in unpacker:
                    self.received.append(obj)
                    if not self._answer(conn, parse(obj), held):
                        return
        except OSError:
            return
        finally:
            conn.close()
            with self._changed:
                self.disconnects += 1
                self._changed.notify_all()

    def _answer(self, conn: socket.socket, req: Any, held: list[bytes]) -> bool:
        """Carry out the handler's actions; False once the connection is to be closed."""
        assert isinstance(req, Request)
        answer = self.handler(req)
        if isinstance(answer, _ACTIONS):
            actions: tuple[Any, ...] = (answer,)
        elif isinstance(answer, tuple):
            actions = answer
        else:
            actions = (Reply(answer),)
        for action in actions:
            if isinstance(action, Reply):
                msgid = req.msgid if action.msgid is None else action.msgid
                conn.sendall(pack([RESPONSE, msgid, action.error, action.result]))
            elif isinstance(action, Raw):
                conn.sendall(action.data)
            elif isinstance(action, Hang):
                self._stop.wait(action.seconds)
            elif isinstance(action, Drop):
                return False
            elif isinstance(action, Hold):
                held.append(pack([RESPONSE, req.msgid, None, action.result]))
            elif isinstance(action, Release):
                conn.sendall(pack([RESPONSE, req.msgid, None, action.result]))
                conn.sendall(b"".join(reversed(held)))
                held.clear()
        return True
