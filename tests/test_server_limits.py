"""The socket server at its limits: BUSY said properly, idle slots reclaimed, clients that never
read their replies stop being served."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memd_client
from memd.ipc import outbox as outbox_module
from memd.ipc import server as server_module
from memd.ipc.server import Server
from memd_client.errors import Busy
from memd_client.protocol import RESPONSE, Request, pack

from .daemon_fixture import short_socket_dir, wait_for


def echo(request: Request, state: dict[str, Any]) -> list[Any]:
    return [RESPONSE, request.msgid, None, {"server": "memd", "method": request.method}]


@pytest.fixture
def sock() -> Iterator[Path]:
    d = short_socket_dir()
    yield d / "memd.sock"
    shutil.rmtree(d, ignore_errors=True)


def serving(path: Path, **kwargs: Any) -> Server:
    server = Server(path, echo, **kwargs)
    server.bind()
    server.start()
    return server


def test_a_client_over_the_limit_gets_busy_as_the_reply_to_its_request(sock: Path) -> None:
    server = serving(sock, max_connections=2)
    try:
        held = [memd_client.connect(sock, timeout=5) for _ in range(2)]
        for c in held:
            assert c.call("hello")["method"] == "hello"
        extra = memd_client.Client(sock, timeout=5)
        with pytest.raises(Busy, match="too many connections"):
            extra.call("hello")
        extra.close()
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the freed slot is taken by the next client
            try:
                with memd_client.connect(sock, timeout=5) as again:
                    assert again.call("hello")["method"] == "hello"
                break
            except Busy:
                assert time.monotonic() < deadline, "the slot was never freed"
                time.sleep(0.05)
        for c in held:
            c.close()
    finally:
        server.stop()


def test_stop_ends_the_threads_answering_clients_over_the_limit(sock: Path) -> None:
    """A client over the limit that has sent nothing holds a thread waiting for its request;
    stopping the server closes that connection and joins the thread, as for served clients."""
    server = serving(sock, max_connections=1)
    held = memd_client.connect(sock, timeout=5)
    waiting: list[socket.socket] = []
    try:
        assert held.call("hello")["method"] == "hello"
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(sock))
            waiting.append(s)
        wait_for(
            lambda: sum(t.name == "memd-busy" for t in threading.enumerate()) == 3,
            "three threads for the clients over the limit",
            5,
        )
    finally:
        server.stop()
    assert not [t for t in threading.enumerate() if t.name == "memd-busy"]
    for s in waiting:
        s.settimeout(5)
        assert s.recv(16) == b"", "a turned-away client was left open"
        s.close()
    held.close()


def test_a_thread_the_system_refuses_closes_that_client_and_the_server_goes_on(
    sock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running out of threads closes the one connection it happened to and frees its slot; the
    accept loop lives on. Patched: as root, RLIMIT_NPROC cannot make the system refuse a thread."""
    server = serving(sock, max_connections=1)
    try:
        real_start = threading.Thread.start
        refused: list[str] = []

        def start(self: threading.Thread) -> None:
            if self.name == "memd-conn" and not refused:
                refused.append(self.name)
                raise RuntimeError("can't start new thread")
            real_start(self)

        monkeypatch.setattr(threading.Thread, "start", start)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
            first.settimeout(5)
            first.connect(str(sock))
            first.sendall(pack([0, 1, "hello", []]))
            try:
                reply = first.recv(1024)
            except ConnectionResetError:  # closed with its request unread
                reply = b""
            assert reply == b"", "the client with no thread got a reply"
        assert refused
        with memd_client.connect(sock, timeout=5) as c:  # the one slot was given back
            assert c.call("hello")["method"] == "hello"
    finally:
        server.stop()


def test_idle_connections_are_reaped_sooner_when_the_limit_is_near(
    sock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "CROWDED_IDLE_SECONDS", 0.5)
    server = serving(sock, max_connections=4, idle_timeout=600)
    try:
        idle = [memd_client.connect(sock, timeout=5) for _ in range(3)]  # 75 % of the limit
        for c in idle:
            c.call("hello")
        deadline = time.monotonic() + 10
        while len(server._clients) >= 3:  # reaped until the limit is no longer near
            assert time.monotonic() < deadline, "idle connections kept their slots"
            time.sleep(0.1)
        with memd_client.connect(sock, timeout=5) as fresh:
            assert fresh.call("hello")["method"] == "hello"
        for c in idle:
            c.close()
    finally:
        server.stop()


# -- clients that never read their replies --------------------------------------------------

REPLY_BYTES = 200_000


class BigReplies:
    """A handler whose ``get`` answers with REPLY_BYTES, counting what it was asked."""

    def __init__(self) -> None:
        self.gets = 0
        self.lock = threading.Lock()

    def __call__(self, request: Request, state: dict[str, Any]) -> list[Any]:
        if request.method == "get":
            with self.lock:
                self.gets += 1
            return [RESPONSE, request.msgid, None, {"text": b"x" * REPLY_BYTES}]
        return echo(request, state)


def never_reading(path: Path, requests: int = 40) -> socket.socket:
    """A client that pipelines ``requests`` gets and never reads a reply."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    s.setblocking(False)
    data = b"".join(pack([0, i, "get", [{"path": "MEMORY.md"}]]) for i in range(requests))
    with contextlib.suppress(BlockingIOError):
        s.send(data)  # as much as the socket takes; the rest is never sent
    return s


def test_clients_that_never_read_stop_being_served_and_a_new_client_is_answered(
    sock: Path,
) -> None:
    """More clients than the connection limit pipeline large replies and never read them: each
    is served only until its unsent output passes the bound, and a new client's hello is
    answered (not BUSY) because it gets the slot of one that does not read."""
    handler = BigReplies()
    server = Server(sock, handler, max_connections=8, write_timeout=600)
    server.bind()
    server.start()
    threads_before = threading.active_count()
    hogs: list[socket.socket] = []
    try:
        hogs = [never_reading(sock) for _ in range(12)]
        wait_for(lambda: server.outbox.unsent > 0, "the first replies to be stuck")
        with memd_client.connect(sock, timeout=30) as fresh:
            assert fresh.call("hello")["method"] == "hello"
            assert fresh.call("get", path="MEMORY.md")["text"] == b"x" * REPLY_BYTES
        # Threads: at most one per slot and per waiting newcomer, whatever the hogs do.
        assert threading.active_count() <= threads_before + 8 + server_module.BUSY_THREADS + 1
        assert server.outbox.shed_count >= 1
        # Each hog was served until its kernel buffer and one reply were full: of its 40
        # requests only a few were answered (the kernel doubles SO_SNDBUF).
        per_hog = 2 * outbox_module.SEND_BUFFER_BYTES // REPLY_BYTES + 2
        assert handler.gets <= len(hogs) * per_hog + 1
        assert server.outbox.peak_unsent <= (8 + server_module.BUSY_THREADS) * REPLY_BYTES
    finally:
        for s in hogs:
            s.close()
        server.stop()


def test_a_client_that_never_reads_is_closed_after_the_write_deadline(sock: Path) -> None:
    server = Server(sock, BigReplies(), write_timeout=1.0)
    server.bind()
    server.start()
    hogs: list[socket.socket] = []
    try:
        hogs = [never_reading(sock) for _ in range(3)]
        wait_for(lambda: server.connections == 3, "the hogs to be connected")
        wait_for(lambda: server.connections == 0, "the hogs to be closed", timeout=20)
        assert server.outbox.shed_count == 3 and server.outbox.unsent == 0
        hog = hogs[0]
        hog.setblocking(True)
        hog.settimeout(5)
        while hog.recv(1 << 16):  # what the kernel had taken, then the end of the stream
            pass
    finally:
        for s in hogs:
            s.close()
        server.stop()


def test_the_replies_waiting_for_all_clients_stay_within_the_budget(sock: Path) -> None:
    """Under the connection limit, with a budget of three replies: no client starts on a request
    while the stuck replies are over it, stuck connections are closed to bring them under, and
    a client that reads is still answered."""
    handler = BigReplies()
    server = Server(sock, handler, max_connections=64, write_timeout=600)
    server.outbox.max_unsent = 3 * REPLY_BYTES
    server.bind()
    server.start()
    hogs: list[socket.socket] = []
    try:
        hogs = [never_reading(sock) for _ in range(10)]
        wait_for(lambda: server.outbox.shed_count >= 1, "a stuck connection to give way")
        settled = [-1]

        def quiet() -> bool:  # no get answered since the last look
            before, settled[0] = settled[0], handler.gets
            time.sleep(0.5)
            return before == handler.gets

        wait_for(quiet, "the hogs to be stuck or closed")
        # Ten stuck replies without the budget; with it, the budget and at most the replies
        # begun at the same moment as the one that crossed it.
        assert server.outbox.unsent <= server.outbox.max_unsent + 2 * (REPLY_BYTES + 64)
        with memd_client.connect(sock, timeout=30) as fresh:
            assert fresh.call("get", path="MEMORY.md")["text"] == b"x" * REPLY_BYTES
    finally:
        for s in hogs:
            s.close()
        server.stop()


def test_a_daemon_answers_hello_while_more_clients_than_its_limit_never_read_large_gets(
    tmp_path: Path,
) -> None:
    """The daemon itself, its real ``get``: 270 clients (over the 256 limit) pipeline large
    gets and read nothing. A new client's hello and search are answered, the daemon's threads
    stay within its slots and newcomers, and the stuck replies within the output budget."""
    from memd.config import Config

    from .daemon_fixture import running_daemon

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    lines = [
        f"- note {i}: the staging cluster runs build {i} of the deploy tooling" for i in range(400)
    ]
    (ws / "MEMORY.md").write_text("# Memory\n\n" + "\n".join(lines) + "\n")
    hogs: list[socket.socket] = []
    with running_daemon(Config.load()) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=30) as c:
            c.workspace_add(ws, name="ws")
            assert len(c.get("ws", "MEMORY.md", lines=1000)["text"]) > 10_000
        threads_before = threading.active_count()
        request = pack([0, 1, "get", [{"workspace": "ws", "path": "MEMORY.md", "lines": 1000}]])
        try:
            for _ in range(270):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(daemon.socket_path))
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    s.send(request * 200)
                hogs.append(s)
            # The promise is about clients that do not read: on a loaded machine the hogs
            # may take longer than a newcomer's wait to fill their sockets and count as such.
            # The hogs over the limit came first and wait for a slot as the newcomer will, each
            # taking the next stuck hog's: the newcomer comes once none of them waits any more
            # (each was given a slot, its thread then serving it, or answered BUSY), and a
            # stuck hog is left to give it its slot.
            server = daemon.parts.server

            def hogs_waiting_for_a_slot() -> int:
                with server._lock:
                    serving = {thread for _, thread in server._clients.values()}
                    return sum(1 for t in server._turned_away if t not in serving)

            def newcomer_has_a_slot_to_take() -> bool:
                return server.outbox.stalled() >= 2 and hogs_waiting_for_a_slot() == 0

            deadline = time.monotonic() + 60
            while not newcomer_has_a_slot_to_take() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert newcomer_has_a_slot_to_take(), (
                f"{server.outbox.stalled()} hogs stalled, {hogs_waiting_for_a_slot()} waiting"
            )
            with memd_client.connect(daemon.socket_path, timeout=60) as fresh:
                assert fresh.call("hello")["server"] == "memd"
                assert fresh.search("ws", "staging cluster build")["results"]
            assert threading.active_count() <= threads_before + 256 + server_module.BUSY_THREADS
            assert server.outbox.unsent <= server.outbox.max_unsent
        finally:
            for s in hogs:
                s.close()
