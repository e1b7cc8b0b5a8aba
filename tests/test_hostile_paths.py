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
from .test_scopes import NOT_DIRECT_CHAT_TYPES, NOT_DIRECT_KEY_SPELLINGS, NOT_DIRECT_SESSION_KEYS

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
    os.link(real / "MEMORY.md", real / "memory" / "hard-link.md")
    os.link(real / "MEMORY.md", real / "memory" / "deep" / "Memory.md")
    os.symlink("hard-link.md", real / "memory" / "symlink-to-hard-link.md")
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
            except MemdError as exc:  # not found, not a memory path: nothing served
                assert SECRET not in str(exc)
                continue
            if SECRET in got["text"]:
                leaked.append(spelling)
    assert leaked == [], f"served long-term memory to a group chat: {leaked}"
    assert refused >= 12
    found = c_search(daemon, GROUP)
    assert found == [], f"search served long-term memory to a group chat: {found}"


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
    assert {"memory/hard-link.md", "memory/deep/Memory.md"} <= set(served)
    assert c_search(daemon, DIRECT) == ["MEMORY.md"]  # indexed once, under its own name
    with memd_client.connect(daemon.socket_path, identity=GROUP) as c:
        assert c.get("ws", "memory/2026-11-30.md")["text"] == ordinary["text"]


def c_search(daemon: Daemon, identity: dict[str, str]) -> list[str]:
    """The paths of the hits that hold the secret, searched as ``identity``."""
    with memd_client.connect(daemon.socket_path, identity=identity) as c:
        got = c.search("ws", "vault combination", mode="keyword", wait_ms=5000)["results"]
    return [h["path"] for h in got if "vault combination" in h["snippet"]]


@pytest.fixture
def open_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A workspace with MEMORY.md and no scope rules: the default decides."""
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(f"# Memory\n\n{SECRET}\n")
    with running_daemon(Config.load(), embedder=FakeEmbedder()) as daemon:
        with memd_client.connect(daemon.socket_path) as c:
            c.workspace_add(root, name="ws")
        yield daemon


def test_no_spelling_of_a_shared_chat_gets_long_term_memory(open_daemon: Daemon) -> None:
    """Chat types and session keys as hosts send them, through hello and per request."""
    identities = [{"chat_type": t} for t in NOT_DIRECT_CHAT_TYPES]
    identities += [{"session_key": k} for k in NOT_DIRECT_SESSION_KEYS]
    identities += NOT_DIRECT_KEY_SPELLINGS
    leaked = []
    for identity in identities:
        with memd_client.connect(open_daemon.socket_path, identity=identity) as c:
            if SECRET in c.context("ws")["text"] or c_search(open_daemon, identity):
                leaked.append(identity)
            try:
                c.get("ws", "MEMORY.md")
                leaked.append(identity)
            except PathRefused:
                pass
        with memd_client.connect(open_daemon.socket_path) as c:  # a per-request caller map
            if SECRET in c.call("context", workspace="ws", caller=identity)["text"]:
                leaked.append(identity)
    assert leaked == []
    with memd_client.connect(open_daemon.socket_path) as c:  # the user's own terminal
        assert SECRET in c.context("ws")["text"]


def test_an_identity_declared_in_hellos_caller_map_holds_for_the_connection(
    open_daemon: Daemon,
) -> None:
    """hello's own caller map used to apply to the hello alone: the requests after it ran as
    a caller that said nothing, with long-term memory."""
    with memd_client.connect(open_daemon.socket_path) as c:
        c.call("hello", client="host", caller={"chatType": "group"})
        assert SECRET not in c.context("ws")["text"]
        with pytest.raises(MemdError, match="top of hello or in its caller map"):
            c.call("hello", client="host", identity={"chat_type": "group"})
