"""Control characters from memory files never reach a terminal raw; append refuses them."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

import memd_client
from memd.config import Config
from memd_client.errors import BadRequest

from .daemon_fixture import running_daemon

HOSTILE = "Title \x1b]0;pwned\x07 clear \x1b[2J bell \x07 back\rspace \x9b31m done"


def on_a_terminal(*args: str, env: dict[str, str]) -> bytes:
    """Run memctl with its stdout on a pseudo-terminal; return what the terminal received."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from memd.ctl.memctl import main; main()", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        out += data
    os.close(leader)
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    return out


def test_memctl_escapes_controls_on_a_terminal(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-11-30.md").write_text(f"{HOSTILE}\n", encoding="utf-8")
    with running_daemon(Config.load()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(str(ws), name="ws")
            c.reindex("ws")
        env = dict(os.environ, MEMD_SOCKET=str(daemon.socket_path))
        got = on_a_terminal("get", "memory/2026-11-30.md", "-w", "ws", env=env)
        found = on_a_terminal(
            "search", "pwned clear bell", "-w", "ws", "--mode", "keyword", env=env
        )
    for out in (got, found):
        text = out.decode("utf-8", "replace")
        # memctl's own colour codes may be there; nothing the file held arrives raw.
        for raw in ("\x1b]", "\x1b[2J", "\x07", "\x9b", "back\rspace"):
            assert raw not in text, (raw, text)
        assert "\\x1b]0;pwned\\x07" in text and "\\x1b[2J" in text
    assert "\\x0d" in got.decode() or "\\x0dspace" in got.decode()


def test_append_refuses_control_characters_but_keeps_tab_and_newline(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    with running_daemon(Config.load()) as daemon, memd_client.connect(daemon.socket_path) as c:
        c.workspace_add(str(ws), name="ws")
        for bad in ("\x1b[31mred", "a\x07b", "osc \x1b]8;;http://x\x07", "c1 \x9b", "cr\ronly"):
            with pytest.raises(BadRequest, match="control character"):
                c.append("ws", bad)
        done = c.append("ws", "col\tumns\r\nand lines\nend")
        text = (ws / done["path"]).read_text()
        assert "col\tumns\nand lines\nend" in text or "col\tumns\r\nand lines" in text
        assert "\x1b" not in text
