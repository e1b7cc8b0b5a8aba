"""memctl (click's runner) against a scripted msgpack-RPC server on a real Unix socket."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from memd.ctl.memctl import EXIT_NOT_RUNNING, cli
from memd_client.protocol import Request

from .fake_daemon import FakeDaemon, Reply, routes

FRESHNESS = {
    "generation": 7,
    "pending_files": 0,
    "unembedded_files": 0,
    "watcher": "running",
    "last_sync": 1_700_000_000.0,
    "waited_ms": 0,
    "fresh": True,
}
SEARCH = {
    "results": [
        {
            "path": "memory/2026-01-02.md",
            "start_line": 3,
            "end_line": 9,
            "score": 0.8731,
            "snippet": "## Launch\n\nThe launch moved to May.\nThird line, not shown.",
            "source": "memory",
            "vector_score": 0.9,
            "text_score": 0.7,
        },
        {
            "path": "MEMORY.md",
            "start_line": 1,
            "end_line": 2,
            "score": 0.5,
            "snippet": "Launch owner: Dana",
            "source": "memory",
            "vector_score": 0.5,
            "text_score": 0.0,
        },
    ],
    "freshness": FRESHNESS,
    "provider": "local",
    "model": "all-MiniLM-L6-v2",
    "mode": "hybrid",
    "note": None,
    "took_ms": 3,  # not part of --json's shape
}
STATUS = {
    "daemon": {
        "pid": 4242,
        "version": "0.1.0",
        "started_at": 1_700_000_000.0,
        "uptime_s": 3725,
        "rss_bytes": 54_300_000,
        "sqlite_memory_bytes": 4_100_000,
        "cpu_percent": 0.25,
        "threads": 7,
        "connections": 2,
        "socket": "/run/user/1000/memd/memd.sock",
        "readers": {"processes": 2, "running": 2, "busy": 1, "pids": [4250, 4251], "error": None},
    },
    "workspaces": [
        {
            "workspace": "agent",
            "root": "/home/u/agent",
            "files_on_disk": 4,
            "files_indexed": 3,
            "files_pending": 1,
            "chunks": 10,
            "vectors": 10,
            "dirty": True,
            "provider": {
                "requested": "auto",
                "active": "local",
                "model": "all-MiniLM-L6-v2",
                "dims": 384,
                "skipped": [{"provider": "openai", "reason": "OPENAI_API_KEY is not set"}],
                "last_error": None,
            },
            "vector_store": {
                "kind": "sqlite-vec",
                "sqlite_vec": True,
                "sqlite_vec_version": "v0.1.9",
                "reason": None,
            },
            "identity": {"state": "valid", "reason": None},
            "freshness": FRESHNESS,
            "watcher": {"state": "running", "backend": "inotify", "reason": None},
            "last_sync": None,
            "cache_entries": 12,
        }
    ],
}
WORKSPACES = {
    "workspaces": [
        {"name": "agent", "path": "/home/u/agent", "extra_paths": ["/home/u/notes"]},
        {"name": "other", "path": "/srv/other", "extra_paths": []},
    ]
}
GET = {
    "path": "MEMORY.md",
    "text": "line three\nline four",
    "from": 3,
    "lines": 2,
    "truncated": True,
    "next_from": 5,
    "missing": False,
    "freshness": FRESHNESS,
}


def _append(req: Request) -> dict[str, Any]:
    return {"path": "memory/2026-01-02.md", "start_line": 10, "end_line": 11}


def _reindex(req: Request) -> dict[str, Any]:
    if not req.params.get("wait"):
        return {"queued": ["agent"]}
    report = {"workspace": "agent", "scanned": 4, "indexed": 1, "unchanged": 3, "removed": 0}
    report |= {"embedded": 2, "pending_files": 0, "rebuilt": True, "seconds": 0.5, "errors": []}
    if req.params.get("workspace") == "broken":
        report["errors"] = [["memory/bad.md", "not UTF-8"]]
    return {"workspaces": [report]}


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    handler = routes(
        {
            "search": SEARCH,
            "status": STATUS,
            "workspace_list": WORKSPACES,
            "workspace_add": lambda req: {"name": "ws", "extra_paths": []} | req.params,
            "workspace_remove": lambda req: {"removed": req.params["workspace"] != "ghost"},
            "get": GET,
            "append": _append,
            "reindex": _reindex,
        }
    )
    with FakeDaemon(handler) as d:
        yield d


@pytest.fixture(autouse=True)
def _no_workspace_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MEMD_WORKSPACE", raising=False)
    monkeypatch.delenv("MEMD_SOCKET", raising=False)
    monkeypatch.chdir(tmp_path)


def run(daemon: FakeDaemon | None, *args: str, input: str | None = None) -> Result:
    prefix = ["--socket", str(daemon.path)] if daemon else []
    return CliRunner().invoke(cli, [*prefix, *args], input=input)


def params(daemon: FakeDaemon, method: str) -> dict[str, Any]:
    sent = [m[3] for m in daemon.received if m[2] == method]
    assert sent, f"no {method} request"
    return sent[-1][0] if sent[-1] else {}


def test_search_json_shape(daemon: FakeDaemon, tmp_path: Path) -> None:
    result = run(daemon, "search", "launch", "--json", "-n", "5", "--mode", "hybrid")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"results", "freshness", "provider", "model", "mode", "note"}
    assert payload["results"] == SEARCH["results"] and payload["freshness"] == FRESHNESS
    # no -w and no $MEMD_WORKSPACE: the current directory, absolute
    sent = params(daemon, "search")
    assert sent == {
        "workspace": str(tmp_path),
        "query": "launch",
        "max_results": 5,
        "mode": "hybrid",
    }


def test_search_human_output(daemon: FakeDaemon) -> None:
    result = run(daemon, "search", "launch", "-w", "agent")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "0.873  memory/2026-01-02.md#L3-L9",
        "    ## Launch",
        "    The launch moved to May.",
        "0.500  MEMORY.md#L1-L2",
        "    Launch owner: Dana",
    ]
    assert "\x1b[" not in result.output  # no colour off a terminal
    assert params(daemon, "search")["workspace"] == "agent"


def test_workspace_option_sources(
    daemon: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(daemon, "search", "q", "-w", "./sub")
    assert params(daemon, "search")["workspace"] == str(tmp_path / "sub")
    monkeypatch.setenv("MEMD_WORKSPACE", "from-env")
    run(daemon, "search", "q", "--wait-ms", "200")
    assert params(daemon, "search") == {"workspace": "from-env", "query": "q", "wait_ms": 200}


def test_status_human(daemon: FakeDaemon) -> None:
    result = run(daemon, "status")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "memd 0.1.0 · pid 4242 · up 1h 2m · 54.3 MB RSS (4.1 MB in SQLite)" in out
    assert "2 connections · 2 reader processes" in out
    assert "agent (/home/u/agent)" in out
    assert "  Indexed: 3/4 files · 10 chunks · 1 pending" in out
    assert "  Dirty: yes" in out
    assert "  Provider: local all-MiniLM-L6-v2, 384 dims (requested auto)" in out
    assert "    skipped openai: OPENAI_API_KEY is not set" in out
    assert "  Vector store: sqlite-vec v0.1.9" in out
    assert "  Watcher: running (inotify)" in out
    assert "  Last sync: never" in out
    assert params(daemon, "status") == {}  # every workspace by default


def test_status_json_and_last_sync_age(daemon: FakeDaemon) -> None:
    STATUS["workspaces"][0]["last_sync"] = time.time() - 125  # type: ignore[index]
    try:
        assert "  Last sync: 2m 5s ago" in run(daemon, "status", "-w", "agent").stdout
        result = run(daemon, "status", "-w", "agent", "--json")
        assert json.loads(result.stdout) == STATUS
        assert params(daemon, "status") == {"workspace": "agent"}
    finally:
        STATUS["workspaces"][0]["last_sync"] = None  # type: ignore[index]


def test_not_running_exit_code_and_hint(tmp_path: Path) -> None:
    result = run(None, "--socket", str(tmp_path / "none.sock"), "status")
    assert result.exit_code == EXIT_NOT_RUNNING == 3
    assert "Error: memd is not running (no socket at" in result.output
    assert "memd run" in result.output and "memctl service install" in result.output


def test_daemon_error_is_exit_1() -> None:
    handler = routes({"search": Reply(error=[4, "unknown workspace: nope"])})
    with FakeDaemon(handler) as failing:
        result = run(failing, "search", "q", "-w", "nope")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: unknown workspace: nope"


def test_workspace_list(daemon: FakeDaemon) -> None:
    result = run(daemon, "workspace", "list")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "agent\t/home/u/agent",
        "\t+ /home/u/notes",
        "other\t/srv/other",
    ]
    assert json.loads(run(daemon, "workspace", "list", "--json").stdout) == WORKSPACES


def test_workspace_add_and_remove(daemon: FakeDaemon, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "notes").mkdir()
    result = run(daemon, "workspace", "add", "ws", "--name", "ws", "--extra", "notes")
    assert result.exit_code == 0, result.output
    assert params(daemon, "workspace_add") == {
        "path": str(tmp_path / "ws"),
        "name": "ws",
        "extra_paths": [str(tmp_path / "notes")],
    }
    assert f"Added ws: {tmp_path / 'ws'}" in result.stdout
    assert run(daemon, "workspace", "add", "missing").exit_code == 2  # click checks it exists
    assert run(daemon, "workspace", "remove", "agent").stdout == "Removed agent\n"
    result = run(daemon, "workspace", "remove", "ghost")
    assert result.exit_code == 1 and "no workspace 'ghost' is registered" in result.output


def test_get(daemon: FakeDaemon) -> None:
    result = run(daemon, "get", "MEMORY.md", "-w", "agent", "--from", "3", "--lines", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout == "line three\nline four\n"
    assert "--from 5" in result.output  # where to continue, on stderr
    assert params(daemon, "get") == {
        "workspace": "agent",
        "path": "MEMORY.md",
        "from": 3,
        "lines": 2,
    }
    assert json.loads(run(daemon, "get", "MEMORY.md", "-w", "agent", "--json").stdout) == GET


def test_append_reads_stdin(daemon: FakeDaemon) -> None:
    result = run(daemon, "append", "-", "-w", "agent", input="- launch moved to May\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "Appended to memory/2026-01-02.md#L10-L11\n"
    sent = params(daemon, "append")
    key = sent.pop("idempotency_key")
    assert isinstance(key, str) and len(key) == 32, "every append carries a fresh key"
    assert sent == {"workspace": "agent", "text": "- launch moved to May\n"}
    run(daemon, "append", "inline note", "-w", "agent")
    assert params(daemon, "append")["text"] == "inline note"


def test_reindex(daemon: FakeDaemon) -> None:
    result = run(daemon, "reindex", "--force")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "agent: 4 scanned · 1 indexed · 3 unchanged · 0 removed · 2 embedded · 0 pending"
        " (0.50s) [rebuilt]\n"
    )
    assert params(daemon, "reindex") == {"force": True, "wait": True}
    result = run(daemon, "reindex", "-w", "broken")
    assert result.exit_code == 1 and "error memory/bad.md: not UTF-8" in result.output
    result = run(daemon, "reindex", "-w", "agent", "--no-wait")
    assert result.exit_code == 0 and result.stdout == "Queued: agent\n"


def test_model_list_on_an_empty_dir(memd_home: Path) -> None:
    result = run(None, "model", "list")
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and "No models in" in result.output
    assert str(memd_home / "models") in result.output
    assert json.loads(run(None, "model", "list", "--json").stdout) == []


def test_model_list_shows_files(memd_home: Path) -> None:
    models = memd_home / "models"
    models.mkdir(parents=True)
    (models / "mini.gguf").write_bytes(b"GGUF" + b"\0" * 1_999_996)
    (models / "big.gguf.part").write_bytes(b"GGUF")
    result = run(None, "model", "list")
    assert result.stdout.splitlines() == [
        "big.gguf  0.0 MB  partial download",
        "mini.gguf  2.0 MB  unverified",
    ]


def test_the_vector_store_line_says_what_is_off() -> None:
    """The in-memory sketch is on; what configuration turned off is sqlite-vec."""
    from memd.ctl.display_status import status_lines

    ws = {
        "workspace": "agent",
        "vector_store": {
            "kind": "plain",
            "sqlite_vec": False,
            "reason": "disabled by configuration (index.sqlite_vec = false)",
        },
    }
    lines = list(status_lines({"workspaces": [ws]}, 0.0))
    assert (
        "  Vector store: in-memory sketch — sqlite-vec disabled by configuration "
        "(index.sqlite_vec = false)" in lines
    )


def test_the_keyword_ranking_line_says_what_ranks() -> None:
    from memd.ctl.display_status import status_lines

    def shown(fts: dict[str, Any]) -> list[str]:
        lines = status_lines({"workspaces": [{"workspace": "agent", "fts": fts}]}, 0.0)
        return [line for line in lines if "Keyword ranking" in line]

    ready = {"ranking": "postings", "postings_mb": 77.8, "built_seconds": 12.1, "error": None}
    assert shown(ready) == ["  Keyword ranking: postings in memory (77.8 MB, built in 12.1 s)"]
    assert shown({"ranking": "building"}) == [
        "  Keyword ranking: FTS5 while the postings are built"
    ]
    assert shown({"ranking": "fts5", "error": "counts differ"}) == [
        "  Keyword ranking: FTS5 — counts differ"
    ]
    assert shown({"ranking": "fts5", "error": None}) == []  # small: nothing worth a line


def test_the_worker_line_says_how_many_queries_had_fewer_threads() -> None:
    from memd.ctl.display_status import _worker_line

    worker: dict[str, Any] = {
        "state": "running",
        "pid": 7,
        "mode": "default",
        "query_threads": {"2": 9},
    }
    assert _worker_line(worker) == "model worker: running, pid 7"  # all alike: nothing to say
    worker["query_threads"] = {"1": 3, "2": 9}
    assert _worker_line(worker) == "model worker: running, pid 7, queries by threads 1: 3 · 2: 9"
    # with the time the recent ones took in llama.cpp
    worker["query_ms"] = {"1": {"p50": 22.04, "p90": 30.0, "queries": 3}}
    assert _worker_line(worker) == (
        "model worker: running, pid 7, queries by threads 1: 3 (p50 22.0 ms) · 2: 9"
    )
    worker["query_threads"] = {"1": 3}
    assert _worker_line(worker) == "model worker: running, pid 7, queries p50 22.0 ms"
    # and the time outside it, from the daemon's sending to its reading the reply
    worker["query_ms"]["1"]["outside_p50"] = 1.96
    assert _worker_line(worker) == (
        "model worker: running, pid 7, queries p50 22.0 ms + 2.0 outside"
    )
