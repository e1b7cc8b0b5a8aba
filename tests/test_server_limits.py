"""The socket server at its connection limit: BUSY said properly, idle slots reclaimed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memd_client
from memd.ipc import server as server_module
from memd.ipc.server import Server
from memd_client.errors import Busy
from memd_client.protocol import RESPONSE, Request

from .daemon_fixture import short_socket_dir


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
