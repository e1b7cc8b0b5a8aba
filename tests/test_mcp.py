"""`memctl mcp` end to end: a real daemon, memctl as a subprocess, the MCP SDK's stdio client."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

import memd_client
from memd.ctl.mcp_replies import get_reply, search_reply, split_citation
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder

from .daemon_fixture import running_daemon, short_socket_dir, wait_for

_T = TypeVar("_T")

# The installed `memctl` script may belong to another environment: run this interpreter's.
_MEMCTL = ["-c", "from memd.ctl.memctl import main; main()"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    (root / "memory" / "2026-01-02.md").write_text(
        "# 2026-01-02\n\n- migrated the billing service to Postgres 16\n"
    )
    return root


@pytest.fixture
def daemon(ws: Path) -> Iterator[Daemon]:
    with running_daemon(embedder=FakeEmbedder()) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(ws, name="agent")
            c.search("agent", "billing", wait_ms=5000)  # indexed before the tests search
            deadline = time.monotonic() + 20
            while not c.search("agent", "billing", wait_ms=1000)["freshness"]["fresh"]:
                assert time.monotonic() < deadline, "the workspace never became fresh"
                time.sleep(0.1)
        yield d


def _params(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> StdioServerParameters:
    """How an MCP client starts `memctl mcp`: it passes the server only a few variables (HOME,
    PATH, ...) and those of its configuration (here MEMD_HOME, unless ``env`` says otherwise)."""
    return StdioServerParameters(
        command=sys.executable,
        args=[*_MEMCTL, *args],
        env={"MEMD_HOME": os.environ["MEMD_HOME"]} if env is None else env,
        cwd=cwd,
    )


def _serve(params: StdioServerParameters, body: Callable[[ClientSession], Awaitable[_T]]) -> _T:
    """Start the server, initialise a session, run ``body`` on it; the process is reaped after."""

    async def go() -> _T:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=60) as session:
                init = await session.initialize()
                assert init.server_info.name == "memd"
                return await body(session)

    return asyncio.run(go())


async def _result(session: ClientSession, name: str, **arguments: Any) -> CallToolResult:
    """A tool call; its structuredContent, success or failure, is what the tool's outputSchema
    says it is."""
    result = await session.call_tool(name, arguments)
    assert isinstance(result, CallToolResult)
    (block,) = result.content
    assert isinstance(block, TextContent) and block.text
    assert isinstance(result.structured_content, dict)
    schemas = {t.name: t.output_schema for t in (await session.list_tools()).tools}
    assert schemas[name] is not None, f"{name} declares no outputSchema"
    jsonschema.validate(result.structured_content, schemas[name])
    return result


async def _call(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structure (the text is checked where it matters)."""
    result = await _result(session, name, **arguments)
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content or {}
    return data


async def _fail(session: ClientSession, name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    """A tool call that must fail as a tool error: (its text, its structure)."""
    result = await _result(session, name, **arguments)
    assert result.is_error, result.content
    block = result.content[0]
    assert isinstance(block, TextContent) and result.structured_content is not None
    return block.text, result.structured_content


def test_tools_search_get_append(daemon: Daemon, ws: Path) -> None:
    added_path: list[str] = []

    async def body(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"memory_search", "memory_get", "memory_append"}
        search_schema = tools["memory_search"].input_schema
        assert search_schema["required"] == ["query"]
        assert {"query", "max_results", "min_score", "sources"} <= set(search_schema["properties"])
        assert set(tools["memory_get"].input_schema["properties"]) == {"path", "from", "lines"}
        assert tools["memory_append"].input_schema["required"] == ["text"]
        assert all(t.description and "Use it" in t.description for t in tools.values())
        # Each tool says what its structuredContent holds.
        outputs = {n: t.output_schema or {} for n, t in tools.items()}
        assert outputs["memory_search"]["required"] == ["results"]
        hit_fields = {"path", "startLine", "endLine", "score", "snippet", "source", "citation"}
        assert hit_fields <= set(str(outputs["memory_search"]).split("'"))
        assert {"path", "text", "from", "lines", "nextFrom"} <= set(
            outputs["memory_get"]["properties"]
        )
        assert {"path", "startLine", "citation"} <= set(outputs["memory_append"]["properties"])
        assert all(
            {"error", "action", "disabled"} <= set(o["properties"]) for o in outputs.values()
        )

        result = await _result(session, "memory_search", query="billing service Postgres")
        found = result.structured_content
        assert found is not None and not result.is_error
        assert found["provider"] == "fake" and found["mode"] and found["freshness"]["fresh"]
        hit = found["results"][0]
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.startswith("1 memory hit(s) for 'billing service Postgres':"), text
        assert f"1. {hit['citation']} (score " in text and "Postgres 16" in text
        assert hit["path"] == "memory/2026-01-02.md" and hit["source"] == "memory"
        assert hit["citation"] == f"memory/2026-01-02.md#L{hit['startLine']}-L{hit['endLine']}"
        assert "Postgres 16" in hit["snippet"] and 0 < hit["score"] <= 1

        got = await _call(session, "memory_get", path=hit["path"])
        assert got["path"] == "memory/2026-01-02.md" and got["from"] == 1
        assert "migrated the billing service to Postgres 16" in got["text"]
        window = await _call(session, "memory_get", path="MEMORY.md", **{"from": 3, "lines": 1})
        assert window == {
            "path": "MEMORY.md",
            "text": "The staging cluster is called Orion.",
            "from": 3,
            "lines": 1,
        }
        cited = await _result(session, "memory_get", path="MEMORY.md#L3-L3")
        assert cited.structured_content == window
        assert cited.content[0].text == "MEMORY.md#L3-L3:\nThe staging cluster is called Orion."  # type: ignore[union-attr]
        missing = await _call(session, "memory_get", path="memory/1999-01-01.md")
        assert missing["text"] == "" and missing["missing"] and "disabled" not in missing
        # A caller mistake is a tool error saying what to do, not "memory is disabled".
        text, refused = await _fail(session, "memory_get", path="../secrets.md")
        assert "disabled" not in refused and refused["text"] == "" and refused["error"]
        assert "path refused" in text and "Use a path from a memory_search hit" in text

        added = await _call(session, "memory_append", text="- the deploy freeze starts Friday")
        assert added["path"].startswith("memory/") and added["startLine"] >= 1
        added_path.append(added["path"])
        again = await _call(session, "memory_search", query="deploy freeze Friday")
        assert [h["path"] for h in again["results"]][:1] == [added["path"]]
        assert "deploy freeze starts Friday" in again["results"][0]["snippet"]

    _serve(_params("--socket", str(daemon.socket_path), "mcp", "-w", "agent"), body)
    assert "deploy freeze starts Friday" in (ws / added_path[0]).read_text()


def test_workspace_defaults_to_the_current_directory(daemon: Daemon, ws: Path) -> None:
    async def body(session: ClientSession) -> dict[str, Any]:
        return await _call(session, "memory_search", query="staging cluster", max_results=1)

    found = _serve(_params("--socket", str(daemon.socket_path), "mcp", cwd=ws), body)
    assert [h["path"] for h in found["results"]] == ["MEMORY.md"]


def test_unknown_workspace_is_reported_not_raised(daemon: Daemon) -> None:
    async def body(session: ClientSession) -> dict[str, Any]:
        text, data = await _fail(session, "memory_search", query="anything")
        assert text.startswith("Memory is unavailable:") and "registered on first use" in text
        return data

    found = _serve(_params("--socket", str(daemon.socket_path), "mcp", "-w", "nope"), body)
    assert found["results"] == [] and found["disabled"] and found["unavailable"]
    assert "-w naming a workspace directory" in found["action"]


def test_a_directory_memd_does_not_know_is_registered_on_first_use(
    daemon: Daemon, tmp_path: Path
) -> None:
    """As the OpenClaw plugin does; --no-register makes it an error instead."""
    other = tmp_path / "other-agent"
    (other / "memory").mkdir(parents=True)
    (other / "MEMORY.md").write_text("# Memory\n\nThe release train is called Comet.\n")

    async def refused(session: ClientSession) -> str:
        return (await _fail(session, "memory_search", query="release train"))[0]

    args = ("--socket", str(daemon.socket_path), "mcp", "-w", str(other))
    text = _serve(_params(*args, "--no-register"), refused)
    assert "is not a registered workspace" in text and f"memctl workspace add {other}" in text

    async def body(session: ClientSession) -> dict[str, Any]:
        return await _call(session, "memory_search", query="release train Comet")

    found = _serve(_params(*args), body)
    assert [h["path"] for h in found["results"]] == ["MEMORY.md"]
    with memd_client.connect(daemon.socket_path) as c:
        paths = [w["path"] for w in c.workspace_list()["workspaces"]]
    assert str(other) in paths


def test_daemon_not_running() -> None:
    directory = short_socket_dir()
    try:
        sock = directory / "memd.sock"  # nothing listens here

        async def body(session: ClientSession) -> list[dict[str, Any]]:
            names = {t.name for t in (await session.list_tools()).tools}
            assert names == {"memory_search", "memory_get", "memory_append"}
            failures = [
                await _fail(session, "memory_search", query="what did we decide?"),
                await _fail(session, "memory_get", path="MEMORY.md"),
                await _fail(session, "memory_append", text="remember this"),
            ]
            for text, _ in failures:
                assert text.startswith("Memory is unavailable:") and "memd run" in text
                assert text.count("memd run") == 1, text  # one sentence, said once
            return [data for _, data in failures]

        told_not_to = {"MEMD_HOME": os.environ["MEMD_HOME"], "MEMD_AUTOSTART": "0"}
        args = ("--socket", str(sock), "mcp", "-w", "agent")
        found, got, added = _serve(_params(*args, env=told_not_to), body)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert found["results"] == [] and found["disabled"] is True and found["unavailable"] is True
    assert "not running" in found["error"] and "memd run" in found["action"]
    assert got["path"] == "MEMORY.md" and got["text"] == "" and got["disabled"] and got["error"]
    assert "not running" in added["error"] and "memd run" in added["action"] and added["disabled"]


def test_an_mcp_client_is_served_with_no_memd_running(tmp_path: Path, ws: Path) -> None:
    """The server is given only what an MCP configuration carries (--home, --socket, -w; no
    MEMD_* variables): it starts memd, registers the workspace and answers."""
    home = tmp_path / "memd-home"
    directory = short_socket_dir()
    sock = directory / "memd.sock"

    async def body(session: ClientSession) -> dict[str, Any]:
        return await _call(session, "memory_search", query="staging cluster Orion")

    args = ("mcp", "--home", str(home), "--socket", str(sock), "-w", str(ws))
    try:
        found = _serve(_params(*args, env={}), body)
        assert [h["path"] for h in found["results"]] == ["MEMORY.md"]
        with memd_client.connect(sock, autostart=False) as c:
            started = c.hello()["started"]
            assert started["how"] == "on demand" and started["by"].startswith("memctl mcp")
            assert c.status()["daemon"]["socket"] == str(sock)
    finally:
        pid = int((home / "state" / "memd.lock").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _running(pid), "the memd started for the MCP client to stop")
        shutil.rmtree(directory, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_reply_shapes() -> None:
    hit = {"path": "MEMORY.md", "start_line": 3, "end_line": 4, "score": 0.5}
    hit |= {"snippet": "x", "source": "memory", "vector_score": 0.1, "text_score": 0.9}
    reply = search_reply({"results": [hit], "provider": "none", "model": "", "mode": "keyword"})
    assert reply["results"] == [
        {
            "path": "MEMORY.md",
            "startLine": 3,
            "endLine": 4,
            "score": 0.5,
            "snippet": "x",
            "source": "memory",
            "citation": "MEMORY.md#L3-L4",
        }
    ]
    got = get_reply(
        {"path": "a.md", "text": "one", "from": 1, "lines": 1, "truncated": True, "next_from": 2}
    )
    assert got["truncated"] and got["nextFrom"] == 2
    assert got["text"] == "one\n\n[More content available. Use from=2 to continue.]"


def test_citations_are_split_into_a_window() -> None:
    assert split_citation("MEMORY.md#L3-L7") == ("MEMORY.md", 3, 5)
    assert split_citation("memory/2026-01-02.md#L4") == ("memory/2026-01-02.md", 4, None)
    assert split_citation("memory/a.md#L4-5") == ("memory/a.md", 4, 2)
    for plain in ("MEMORY.md", "notes#1.md", "a.md#L7-L3", "a.md#L0-L2"):
        assert split_citation(plain) == (plain, None, None)
