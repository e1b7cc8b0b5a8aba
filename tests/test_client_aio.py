"""The asyncio client against a real daemon (and a scripted server for what a daemon won't do):
every method's reply against its TypedDict, concurrency, errors, timeouts, dropped and stale
connections, and mypy on typed use."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import socket
import subprocess
import sys
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

import pytest

import memd_client
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd_client.aio import AsyncClient
from memd_client.protocol import MAX_MSGID, RESPONSE, Request, make_unpacker, pack, parse

from .daemon_fixture import running_daemon, short_socket_dir

ROOT = Path(__file__).resolve().parent.parent
P = ParamSpec("P")


def in_loop(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an async test in a fresh event loop (pytest here runs plain functions only)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    (root / "memory" / "2026-03-01.md").write_text("- migrated billing to Postgres 16\n")
    return root


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon(embedder=FakeEmbedder()) as d:
        yield d


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = short_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def conforms(value: Any, tp: Any, where: str = "result") -> None:
    """Assert that ``value`` has the shape of the type ``tp``: a TypedDict's required keys are
    there, no key is unknown to it, and every value fits its annotation."""
    if tp is Any:
        return
    if typing.is_typeddict(tp):
        assert isinstance(value, dict), f"{where}: {value!r} is not a map"
        hints = typing.get_type_hints(tp)
        missing = tp.__required_keys__ - value.keys()
        unknown = value.keys() - hints.keys()
        assert not missing and not unknown, f"{where}: missing {missing}, not typed {unknown}"
        for key, item in value.items():
            conforms(item, hints[key], f"{where}.{key}")
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        for option in args:
            with contextlib.suppress(AssertionError):
                return conforms(value, option, where)
        raise AssertionError(f"{where}: {value!r} fits none of {tp}")
    if origin is list:
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            conforms(item, args[0], f"{where}[{i}]")
    elif origin is dict:
        assert isinstance(value, dict), f"{where}: {value!r} is not a map"
        for key, item in value.items():
            conforms(key, args[0], f"{where} key")
            conforms(item, args[1], f"{where}[{key!r}]")
    elif tp is type(None):
        assert value is None, f"{where}: {value!r} is not None"
    elif tp in (int, float):  # an int is a float, a bool is not a number
        assert isinstance(value, int | tp) and not isinstance(value, bool), f"{where}: {value!r}"
    else:
        assert isinstance(value, tp), f"{where}: {value!r} is not a {tp.__name__}"


@in_loop
async def test_every_method_and_its_result_type(daemon: Daemon, ws: Path) -> None:
    async with memd_client.aio.connect(daemon.socket_path, timeout=30) as c:
        conforms(await c.hello("tests"), memd_client.HelloResult)
        conforms(added := await c.workspace_add(ws, name="agent"), memd_client.WorkspaceAddResult)
        assert added["path"] == str(ws.resolve())
        conforms(await c.workspace_list(), memd_client.WorkspaceListResult)
        found = await c.search("agent", "what is the staging cluster called?", wait_ms=5000)
        conforms(found, memd_client.SearchResult)
        assert found["results"][0]["path"] == "MEMORY.md"
        conforms(got := await c.get("agent", "MEMORY.md", from_line=3), memd_client.GetResult)
        assert got["text"].startswith("The staging cluster is called Orion.")
        appended = await c.append("agent", "Deploy freeze starts Friday.")
        conforms(appended, memd_client.AppendResult)
        hits = (await c.search("agent", "deploy freeze", mode="keyword"))["results"]
        assert hits[0]["path"] == appended["path"]
        conforms(await c.context("agent", max_chars=2000), memd_client.ContextResult)
        conforms(await c.flush_plan("agent"), memd_client.FlushPlan)
        line = {"path": "memory/2026-03-01.md", "start_line": 1, "end_line": 1}
        for query in ("billing database", "postgres upgrade", "what did billing move to"):
            recalled = await c.record_recall("agent", query, [line])
            conforms(recalled, memd_client.RecordRecallResult)
        loose = {"min_score": 0.0, "min_recall_count": 0, "min_unique_queries": 0}
        ranked = await c.promote("agent", **loose)
        conforms(ranked, memd_client.PromoteResult)
        assert ranked["candidates"], "a recalled daily line is a candidate"
        key = ranked["candidates"][0]["key"]
        conforms(await c.promote("agent", explain=key, **loose), memd_client.PromoteResult)
        applied = await c.promote("agent", apply=True, **loose)
        conforms(applied, memd_client.PromoteResult)
        assert key in [a["key"] for a in applied["applied"]]
        conforms(await c.reindex("agent"), memd_client.ReindexResult)
        assert await c.reindex("agent", wait=False) == {"queued": ["agent"]}
        status = await c.status("agent")
        conforms(status, memd_client.StatusResult)
        assert status["workspaces"][0]["files_on_disk"] >= 3
        removed = await c.workspace_remove("agent")
        assert removed == {"removed": True}
        conforms(removed, memd_client.WorkspaceRemoveResult)


@in_loop
async def test_concurrent_calls_on_one_client(daemon: Daemon, ws: Path) -> None:
    for day in range(1, 21):
        (ws / "memory" / f"2026-04-{day:02d}.md").write_text(f"- note {day}\n")
    async with AsyncClient(daemon.socket_path) as c:
        await c.workspace_add(ws, name="agent")
        await c.reindex("agent")
        gets = [c.get("agent", f"memory/2026-04-{day:02d}.md") for day in range(1, 21)]
        others = [c.hello(), c.status("agent"), c.search("agent", "note 7", mode="keyword")]
        calls = [("hello", {}), ("get", {"workspace": "x", "path": "M.md"})]
        piped = c.pipeline(calls, return_exceptions=True)
        *got, hello, status, found, pipeline = await asyncio.gather(*gets, *others, piped)
        assert [g["text"] for g in got] == [f"- note {day}" for day in range(1, 21)]
        assert hello["server"] == "memd" and found["results"]
        assert status["daemon"]["connections"] == 1, "every call went over one connection"
        assert pipeline[0]["server"] == "memd"
        assert isinstance(pipeline[1], memd_client.UnknownWorkspace)


@in_loop
async def test_errors_are_typed_and_keep_the_connection(daemon: Daemon, ws: Path) -> None:
    async with memd_client.aio.connect(daemon.socket_path) as c:
        await c.workspace_add(ws, name="agent")
        with pytest.raises(memd_client.UnknownWorkspace):
            await c.search("nobody", "x")
        with pytest.raises(memd_client.PathRefused):
            await c.get("agent", "../../etc/passwd")
        with pytest.raises(memd_client.BadRequest, match="max_results"):
            await c.search("agent", "x", max_results=10_000)
        with pytest.raises(memd_client.UnknownMethod):
            await c.call("drop_tables")
        with pytest.raises(memd_client.TooLarge, match="limit is 1048576"):
            await c.append("agent", "x" * (1 << 20))  # refused before sending
        status = await c.status()
        assert c.connected and status["daemon"]["connections"] == 1


@in_loop
async def test_daemon_not_running(sock_dir: Path) -> None:
    path = sock_dir / "memd.sock"
    with pytest.raises(memd_client.DaemonNotRunning, match="no socket at .*memd.sock.*memd run"):
        async with memd_client.aio.connect(path):
            pass
    c = AsyncClient(path)  # lazy: the first call finds out
    with pytest.raises(memd_client.DaemonNotRunning):
        await c.hello()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # bound, never listening: a stale socket file
    with pytest.raises(memd_client.DaemonNotRunning, match="nothing listens on"):
        await memd_client.aio.connect(path)
    assert not c.connected


Answer = Callable[[int, Request, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Script:
    """What a scripted server saw: its connections, and (connection, msgid, method) per request."""

    path: Path
    connections: int = 0
    received: list[tuple[int, int, str]] = field(default_factory=list)


@asynccontextmanager
async def scripted(sock_dir: Path, answer: Answer) -> AsyncIterator[Script]:
    """A msgpack-RPC server in the test's event loop; ``answer(connection number, request,
    writer)`` decides what each request gets."""
    script, tasks = Script(sock_dir / "memd.sock"), set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())
        script.connections += 1
        number, unpacker = script.connections, make_unpacker()
        try:
            while data := await reader.read(65536):
                unpacker.feed(data)
                for request in map(parse, unpacker):
                    assert isinstance(request, Request)
                    script.received.append((number, request.msgid, request.method))
                    await answer(number, request, writer)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, str(script.path))
    try:
        yield script
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def reply(writer: asyncio.StreamWriter, msgid: int, result: Any) -> None:
    writer.write(pack([RESPONSE, msgid, None, result]))


@in_loop
async def test_timeout_closes_the_connection_and_a_late_reply_is_never_taken(
    sock_dir: Path,
) -> None:
    async def answer(number: int, request: Request, writer: asyncio.StreamWriter) -> None:
        if request.method == "append":
            await asyncio.sleep(30)
        elif number == 1:  # silent until the client gave up; then answers the next msgid too
            await asyncio.sleep(0.3)
            reply(writer, request.msgid + 1, {"late": True})
            reply(writer, request.msgid, {"late": True})
        else:
            reply(writer, request.msgid, {"connection": number})

    async with scripted(sock_dir, answer) as script, AsyncClient(script.path, 0.1) as c:
        with pytest.raises(memd_client.Timeout, match="no reply from memd to hello within 0.1 s"):
            await c.hello()
        assert not c.connected
        await asyncio.sleep(0.5)  # the late replies were sent by now
        assert await c.hello() == {"connection": 2}
        with pytest.raises(memd_client.Timeout, match="retry with idempotency_key='k1'"):
            await c.append("agent", "- note", idempotency_key="k1")
        assert script.connections == 2


@in_loop
async def test_cancelled_call_drops_the_connection_and_msgids_wrap(sock_dir: Path) -> None:
    async def answer(number: int, request: Request, writer: asyncio.StreamWriter) -> None:
        if request.method == "slow":
            await asyncio.sleep(30)
        reply(writer, request.msgid, [number])

    async with scripted(sock_dir, answer) as script, AsyncClient(script.path) as c:
        c._msgid = MAX_MSGID - 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(c.call("slow"), 0.1)
        assert not c.connected  # its reply may still come: the stream is out of step
        assert await c.call("fast") == [2] and await c.call("fast") == [2]
        assert [i for _, i, _ in script.received] == [MAX_MSGID, 1, 2]


@in_loop
async def test_drop_mid_call_is_not_retried_then_reconnects(sock_dir: Path) -> None:
    async def answer(number: int, request: Request, writer: asyncio.StreamWriter) -> None:
        if request.method == "search":
            writer.write(pack([RESPONSE, request.msgid, None, {"results": ["x" * 100]}])[:20])
            writer.close()
        else:
            reply(writer, request.msgid, [])

    async with scripted(sock_dir, answer) as script, AsyncClient(script.path) as c:
        with pytest.raises(
            memd_client.DaemonUnavailable, match="closed the connection .during search"
        ):
            await c.search("agent", "q")
        assert await c.call("hello") == []
        assert [m for _, _, m in script.received] == ["search", "hello"]  # not sent twice
        assert script.connections == 2
        with pytest.raises(memd_client.Internal, match="not a map"):
            await c.workspace_list()


@in_loop
async def test_pipeline_larger_than_the_socket_buffers(sock_dir: Path) -> None:
    """Requests and replies of 4 MB each way: writing must not wait for reading, or both
    sides block on full buffers."""

    async def answer(number: int, request: Request, writer: asyncio.StreamWriter) -> None:
        reply(writer, request.msgid, request.params)
        await writer.drain()  # as the daemon does: it blocks until the client reads

    text = "y" * 100_000
    async with scripted(sock_dir, answer) as script, AsyncClient(script.path, 10) as c:
        results = await c.pipeline([("append", {"text": text, "i": i}) for i in range(40)])
        assert [r["i"] for r in results] == list(range(40))
        assert all(r["text"] == text for r in results)
        assert await c.pipeline([]) == []


@in_loop
async def test_reconnects_after_the_daemon_closes_an_idle_connection(daemon: Daemon) -> None:
    assert daemon.parts is not None
    daemon.parts.server.idle_timeout = 0.2
    async with AsyncClient(daemon.socket_path) as c:
        assert (await c.hello())["server"] == "memd"
        for _ in range(200):
            if daemon.parts.ctx.connections == 0:
                break
            await asyncio.sleep(0.05)
        assert daemon.parts.ctx.connections == 0, "the daemon closed the idle connection"
        assert (await c.hello())["server"] == "memd"
        assert c.connected and daemon.parts.ctx.connections == 1


@in_loop
async def test_reconnects_after_a_daemon_restart(sock_dir: Path) -> None:
    """The client does not see the close (the loop is blocked while the daemon restarts): the
    first write fails before any byte is sent, so the call is sent again on a new connection."""
    c = AsyncClient(sock_dir / "memd.sock")
    with running_daemon(embedder=FakeEmbedder(), socket_dir=sock_dir):
        assert (await c.hello())["server"] == "memd"
    with running_daemon(embedder=FakeEmbedder(), socket_dir=sock_dir):
        assert (await c.workspace_list())["workspaces"] == []
        await c.close()


TYPED_USE = """
import memd_client

def blocking(c: memd_client.Client) -> str:
    r = c.search("agent", "q")
    got = c.get("agent", "MEMORY.md")
    return r["results"][0]["path"] + got["text"] + str(got["from"] + r["freshness"]["generation"])

async def asynchronous() -> float:
    async with memd_client.aio.connect() as c:
        r = await c.search("agent", "q", max_results=3)
        s = await c.status()
        return r["results"][0]["score"] + s["daemon"]["uptime_s"]

async def wrong(c: memd_client.aio.AsyncClient, b: memd_client.Client) -> None:
    b.search("agent", "q")["results"][0]["nope"]
    pid: str = b.status()["daemon"]["pid"]
    b.search("agent", max_results=3)
    c.hello()["server"]
"""


def test_mypy_accepts_typed_use_and_rejects_wrong_use(tmp_path: Path) -> None:
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    (tmp_path / "use.py").write_text(TYPED_USE)
    (tmp_path / "mypy.ini").write_text(
        f"[mypy]\nstrict = True\nmypy_path = {ROOT / 'client'}\n"
        "[mypy-msgpack.*]\nignore_missing_imports = True\n"
    )
    result = subprocess.run(
        [mypy, "--config-file", "mypy.ini", "--cache-dir", "cache", "use.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = TYPED_USE.splitlines()
    errors = {
        int(line.split(":")[1])
        for line in result.stdout.splitlines()
        if line.startswith("use.py:") and ": error:" in line
    }
    start = next(i for i, text in enumerate(lines) if text.startswith("async def wrong("))
    wrong = set(range(start + 2, len(lines) + 1))  # 1-based: every line after the def
    assert errors == wrong, result.stdout
