"""The client library against a scripted msgpack-RPC server on a real Unix socket."""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd_client import (
    BadRequest,
    Busy,
    Client,
    DaemonNotRunning,
    DaemonUnavailable,
    Internal,
    MemdError,
    PathRefused,
    ProviderUnavailable,
    Timeout,
    TooLarge,
    UnknownWorkspace,
)
from memd_client.protocol import NOTIFICATION, RESPONSE, Request, pack

from .fake_daemon import Drop, FakeDaemon, Hang, Hold, Raw, Release, Reply, routes


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    with FakeDaemon() as d:
        yield d


@pytest.fixture
def empty_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="memd-t"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def test_requests_carry_named_params_without_nones(daemon: FakeDaemon) -> None:
    with memd_client.connect(daemon.path) as c:
        echoed = c.call("search", workspace="w", query="q", max_results=None, mode="keyword")
        c.call("workspace_list")
    assert echoed == {
        "method": "search",
        "params": {"workspace": "w", "query": "q", "mode": "keyword"},
    }
    assert daemon.received == [
        [0, 1, "search", [{"workspace": "w", "query": "q", "mode": "keyword"}]],
        [0, 2, "workspace_list", []],
    ]


def test_methods_send_documented_params(
    daemon: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with memd_client.connect(daemon.path) as c:
        c.hello("tests")
        c.status()
        c.search(Path("ws"), "q", max_results=3, min_score=0.2, wait_ms=50)
        c.get("agent", "MEMORY.md", from_line=3)
        c.append("agent", "- note\n", idempotency_key="key-1")
        c.record_recall("agent", "q", [{"path": "MEMORY.md", "start_line": 1, "end_line": 2}])
        c.reindex()
        c.reindex("agent", force=True, wait=False)
        c.workspace_add("ws", extra_paths=["notes"])
        c.workspace_remove(Path("ws"))
        c.workspace_list()
    ws = str(tmp_path / "ws")
    assert [m[3] for m in daemon.received] == [
        [{"client": "tests", "protocol": 1}],
        [],
        [{"workspace": ws, "query": "q", "max_results": 3, "min_score": 0.2, "wait_ms": 50}],
        [{"workspace": "agent", "path": "MEMORY.md", "from": 3}],
        [{"workspace": "agent", "text": "- note\n", "idempotency_key": "key-1"}],
        [
            {
                "workspace": "agent",
                "query": "q",
                "results": [{"path": "MEMORY.md", "start_line": 1, "end_line": 2}],
            }
        ],
        [{"wait": True}],
        [{"workspace": "agent", "force": True, "wait": False}],
        [{"path": ws, "extra_paths": [str(tmp_path / "notes")]}],
        [{"workspace": ws}],
        [],
    ]
    assert [m[1] for m in daemon.received] == list(range(1, 12))


def test_false_is_sent_none_is_not(daemon: FakeDaemon) -> None:
    with memd_client.connect(daemon.path) as c:
        c.search("agent", "q", mmr=False, decay=None)
    assert daemon.received[0][3] == [{"workspace": "agent", "query": "q", "mmr": False}]


@pytest.mark.parametrize(
    ("code", "exc"),
    [
        (2, BadRequest),
        (4, UnknownWorkspace),
        (5, PathRefused),
        (6, ProviderUnavailable),
        (7, Busy),
        (8, Timeout),
        (1, Internal),
        (99, Internal),
    ],
)
def test_wire_errors_become_typed_exceptions(code: int, exc: type[MemdError]) -> None:
    handler = routes({"fail": Reply(error=[code, f"failure {code}"]), "hello": {"ok": True}})
    with FakeDaemon(handler) as daemon, memd_client.connect(daemon.path) as c:
        with pytest.raises(exc, match=f"failure {code}") as info:
            c.call("fail")
        assert type(info.value) is exc
        assert c.call("hello") == {"ok": True}  # an error reply leaves the connection usable
        assert daemon.connections == 1


def test_malformed_error_is_internal() -> None:
    with FakeDaemon(lambda req: Reply(error=["oops"])) as daemon, Client(daemon.path) as c:
        with pytest.raises(Internal, match="malformed error"):
            c.call("x")


def test_non_map_result_of_a_method_is_internal() -> None:
    with FakeDaemon(lambda req: [1, 2]) as daemon, Client(daemon.path) as c:
        assert c.call("workspace_list") == [1, 2]
        with pytest.raises(Internal, match="not a map"):
            c.workspace_list()


def test_timeout_then_a_fresh_connection() -> None:
    handler = routes({"slow": Hang(30), "hello": "hi"})
    with FakeDaemon(handler) as daemon, Client(daemon.path, timeout=0.2) as c:
        start = time.monotonic()
        with pytest.raises(Timeout, match="no reply from memd to slow within 0.2 s"):
            c.call("slow")
        assert time.monotonic() - start < 2
        assert not c.connected  # a late reply must not be taken for the next call's
        assert c.call("hello") == "hi"
        assert daemon.connections == 2


def test_search_timeout_includes_wait_ms() -> None:
    handler = routes({"search": (Hang(0.4), Reply({"results": []}))})
    with FakeDaemon(handler) as daemon, Client(daemon.path, timeout=0.2) as c:
        assert c.search("agent", "q", wait_ms=1000) == {"results": []}


def test_dropped_mid_reply_raises_then_reconnects() -> None:
    partial = pack([RESPONSE, 1, None, {"results": ["x" * 100]}])[:20]
    handler = routes({"search": (Raw(partial), Drop()), "hello": "hi"})
    with FakeDaemon(handler) as daemon, Client(daemon.path) as c:
        with pytest.raises(DaemonUnavailable, match="closed the connection .during search"):
            c.call("search")
        assert not c.connected
        assert c.call("hello") == "hi"
        assert daemon.connections == 2
        assert daemon.methods() == ["search", "hello"]  # the dropped call was not retried


def test_idle_closed_connection_is_replaced_transparently() -> None:
    handler = routes({"bye": (Reply("ok"), Drop()), "hello": "hi"})
    with FakeDaemon(handler) as daemon, Client(daemon.path) as c:
        assert c.call("bye") == "ok"
        daemon.wait_for_disconnects(1)
        assert c.call("hello") == "hi"
        assert daemon.connections == 2
        assert daemon.methods() == ["bye", "hello"]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xc1", "undecodable reply"),
        (pack([RESPONSE, "one", None, 1]), "malformed reply"),
        (pack([7, 1]), "malformed reply"),
    ],
)
def test_garbage_reply_breaks_only_that_connection(data: bytes, match: str) -> None:
    handler = routes({"bad": Raw(data), "hello": "hi"})
    with FakeDaemon(handler) as daemon, Client(daemon.path) as c:
        with pytest.raises(DaemonUnavailable, match=match):
            c.call("bad")
        assert c.call("hello") == "hi"
        assert daemon.connections == 2


def test_replies_to_other_msgids_and_notifications_are_skipped() -> None:
    stale = pack([RESPONSE, 9999, None, "stale"]) + pack([NOTIFICATION, "note", []])
    handler = routes({"hello": (Raw(stale), Reply("fresh"))})
    with FakeDaemon(handler) as daemon, Client(daemon.path) as c:
        assert c.call("hello") == "fresh"
        assert c.call("hello") == "fresh"


def test_no_socket_means_not_running(empty_dir: Path) -> None:
    path = empty_dir / "memd.sock"
    with pytest.raises(DaemonNotRunning, match="no socket at .*memd.sock.*memd run") as info:
        memd_client.connect(path)
    assert isinstance(info.value, MemdError)
    c = Client(path)  # lazy: the first call finds out
    with pytest.raises(DaemonNotRunning):
        c.call("hello")


def test_stale_socket_file_means_not_running(empty_dir: Path) -> None:
    path = empty_dir / "memd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # bound, never listening, then closed: the file stays behind
    assert path.exists()
    with pytest.raises(DaemonNotRunning, match="nothing listens on"):
        memd_client.connect(path)


def test_default_path_is_memd_socket(monkeypatch: pytest.MonkeyPatch, daemon: FakeDaemon) -> None:
    monkeypatch.setenv("MEMD_SOCKET", str(daemon.path))
    with memd_client.connect() as c:
        assert c.path == daemon.path
        assert c.call("hello") == {"method": "hello", "params": {}}


def test_pipeline_sends_everything_first_and_keeps_call_order() -> None:
    def handler(req: Request) -> object:
        n = req.params["n"]
        return Release(n) if n == 19 else Hold(n)  # answers come back last first

    with FakeDaemon(handler) as daemon, Client(daemon.path, timeout=5) as c:
        assert c.pipeline([("echo", {"n": i}) for i in range(20)]) == list(range(20))
        assert [m[1] for m in daemon.received] == list(range(1, 21))
        assert c.pipeline([]) == []


def test_pipeline_errors() -> None:
    handler = routes(
        {"ok": lambda req: req.params["n"], "fail": Reply(error=[4, "unknown workspace: x"])}
    )
    calls = [("ok", {"n": 1}), ("fail", {}), ("ok", {"n": 3})]
    with FakeDaemon(handler) as daemon, Client(daemon.path) as c:
        with pytest.raises(UnknownWorkspace):
            c.pipeline(calls)
        results = c.pipeline(calls, return_exceptions=True)
        assert results[0] == 1 and results[2] == 3
        assert isinstance(results[1], UnknownWorkspace)
        assert c.call("ok", n=4) == 4 and daemon.connections == 1


def test_pipeline_larger_than_the_socket_buffers(daemon: FakeDaemon) -> None:
    text = "y" * 100_000
    with Client(daemon.path) as c:
        results = c.pipeline([("append", {"text": text, "i": i}) for i in range(40)])
    assert [r["params"]["i"] for r in results] == list(range(40))
    assert all(r["params"]["text"] == text for r in results)


def test_large_reply_arrives_whole() -> None:
    big = "z" * (3 << 20)
    with FakeDaemon(lambda req: {"text": big}) as daemon, Client(daemon.path) as c:
        assert c.call("get")["text"] == big


def test_oversized_request_is_refused_before_sending(daemon: FakeDaemon) -> None:
    with Client(daemon.path) as c:
        with pytest.raises(TooLarge, match="limit is 1048576"):
            c.append("agent", "x" * (1 << 20))
        assert c.call("hello")["method"] == "hello"
    assert daemon.methods() == ["hello"]


def test_context_manager_closes(daemon: FakeDaemon) -> None:
    with memd_client.connect(daemon.path) as c:
        assert c.connected
        c.call("hello")
    assert not c.connected
    daemon.wait_for_disconnects(1)
    c.close()  # closing twice is harmless
    assert "not connected" in repr(c)
