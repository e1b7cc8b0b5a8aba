"""The frames corpus (tests/hostile/frames.txt) against a live daemon: a typed error or a closed
connection for each, and the daemon goes on serving."""

from __future__ import annotations

import socket
from pathlib import Path

import msgpack

import memd_client
from memd.config import Config

from .daemon_fixture import running_daemon

CORPUS = Path(__file__).with_name("hostile") / "frames.txt"


def frames() -> list[bytes]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [bytes.fromhex(line) for line in lines if line and not line.startswith("#")]


def test_every_hostile_frame_gets_an_error_or_a_close(tmp_path: Path) -> None:
    corpus = frames()
    assert len(corpus) >= 15
    with running_daemon(Config.load()) as daemon:
        for frame in corpus:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(15)
                s.connect(str(daemon.socket_path))
                s.sendall(frame)
                s.shutdown(socket.SHUT_WR)  # a truncated frame is then a closed stream
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            if data:
                unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                unpacker.feed(data)
                for reply in unpacker:
                    assert isinstance(reply, list) and reply[0] == 1, (frame.hex(), reply)
                    assert reply[2] is not None, f"{frame.hex()} was answered as if valid"
                    assert isinstance(reply[2], list) and isinstance(reply[2][0], int)
            with memd_client.connect(daemon.socket_path, timeout=10) as c:
                assert c.call("hello")["server"] == "memd", f"after {frame.hex()}"
