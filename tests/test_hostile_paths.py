"""Access decisions on resolved paths: every spelling of MEMORY.md meets the same scope rule.

The corpus in tests/hostile/longterm_paths.txt grows with every finding; each line is asked of a
real daemon over its socket, as a group chat (long-term memory denied) and as a direct chat.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd.config import Config, ScopeRule
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd_client.errors import MemdError, PathRefused

from .daemon_fixture import running_daemon

CORPUS = Path(__file__).with_name("hostile") / "longterm_paths.txt"
SECRET = "The vault combination is 4-8-15-16-23-42."
GROUP = {"session_key": "agent:main:tg:group:1"}
DIRECT = {"session_key": "agent:main:tg:direct:1"}


def spellings() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Daemon, dict[str, str]]]:
    base = tmp_path
    real = base / "real-ws"
    (real / "memory" / "deep").mkdir(parents=True)
    (real / "MEMORY.md").write_text(f"# Memory\n\n{SECRET}\n")
    (real / "memory" / "2026-11-30.md").write_text("An ordinary daily note.\n")
    os.symlink("../MEMORY.md", real / "memory" / "longterm-link.md")
    os.symlink("../longterm-link.md", real / "memory" / "deep" / "link-to-link.md")
    link = base / "ws-link"
    os.symlink(real, link)
    config = Config.load(
        scopes=(ScopeRule(action="deny", chat_type="group", sources=("longterm",)),)
    )
    with running_daemon(config, embedder=FakeEmbedder()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(link, name="ws")  # registered through the symlink
        names = {"root": str(real), "realroot": str(real.resolve()), "link": str(link)}
        yield daemon, names


def test_group_chat_never_reads_longterm_memory(setup: tuple[Daemon, dict[str, str]]) -> None:
    daemon, names = setup
    leaked, refused = [], 0
    with memd_client.connect(daemon.socket_path, identity=GROUP) as c:
        for spelling in spellings():
            try:
                got = c.get("ws", spelling.format(**names))
            except PathRefused as exc:
                assert SECRET not in str(exc)
                refused += 1
                continue
            if SECRET in got["text"]:
                leaked.append(spelling)
    assert leaked == [], f"served long-term memory to a group chat: {leaked}"
    assert refused >= 12


def test_direct_chat_reads_it_by_the_plain_name_and_through_symlinks(
    setup: tuple[Daemon, dict[str, str]],
) -> None:
    """The same spellings are served when the scope allows it: the refusals above are the
    scope rule's doing, not a path that cannot be read at all."""
    daemon, names = setup
    served = []
    with memd_client.connect(daemon.socket_path, identity=DIRECT) as c:
        for spelling in spellings():
            try:
                got = c.get("ws", spelling.format(**names))
            except MemdError:
                continue
            if SECRET in got["text"]:
                served.append(spelling)
        ordinary = c.get("ws", "memory/2026-11-30.md")
    assert {"MEMORY.md", "MEMORY.md/", "./MEMORY.md", "{root}/MEMORY.md"} <= set(served)
    assert {"memory/longterm-link.md", "{realroot}/MEMORY.md"} <= set(served)
    with memd_client.connect(daemon.socket_path, identity=GROUP) as c:
        assert c.get("ws", "memory/2026-11-30.md")["text"] == ordinary["text"]
