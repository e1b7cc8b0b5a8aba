"""The memd command end to end on a real workspace and a real index (click's runner)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from memd.cli import cli

from .conftest import WriteFile


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_index_search_get_status(workspace: Path, write: WriteFile) -> None:
    write("MEMORY.md", "# Memory\n\nThe release train leaves every second Tuesday.\n")
    write("memory/2026-04-01.md", "- 发布 计划 已确认\n")
    code, out = run("index", str(workspace))
    assert code == 0 and "2 indexed" in out
    code, out = run("search", str(workspace), "when does the release train leave?", "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["mode"] == "keyword" and payload["results"][0]["path"] == "MEMORY.md"
    code, out = run("search", str(workspace), "发布")
    assert code == 0 and "memory/2026-04-01.md#L1-L1" in out
    code, out = run("get", str(workspace), "MEMORY.md", "--from", "3", "--lines", "1")
    assert code == 0 and out.strip() == "The release train leaves every second Tuesday."
    code, out = run("status", str(workspace), "--json")
    status = json.loads(out)
    assert (status["files_indexed"], status["files_on_disk"], status["dirty"]) == (2, 2, False)
    write("memory/2026-04-02.md", "new\n")
    status = json.loads(run("status", str(workspace), "--json")[1])
    assert status["dirty"] and status["files_stale"] == 1


def test_refused_path_is_a_clear_error(workspace: Path) -> None:
    code, out = run("get", str(workspace), "../../etc/passwd")
    assert code == 1 and "path refused" in out and "root:" not in out


def test_bad_config_is_reported(memd_home: Path, workspace: Path) -> None:
    (memd_home / "config").mkdir(parents=True)
    (memd_home / "config" / "config.toml").write_text("[search]\nmode = 'x'\n")
    code, out = run("search", str(workspace), "q")
    assert code == 1 and "search.mode must be one of" in out


def test_dump_matches_after_force(workspace: Path, write: WriteFile) -> None:
    write("MEMORY.md", "alpha\n" * 500)
    run("index", str(workspace))
    before = run("dump", str(workspace))[1]
    code, out = run("index", str(workspace), "--force")
    assert code == 0 and "[rebuilt]" in out
    assert run("dump", str(workspace))[1] == before != ""


def test_dash_h_is_help() -> None:
    code, out = run("-h")
    assert code == 0 and "Usage:" in out and "run" in out
    code, out = run("run", "-h")
    assert code == 0 and "--idle-exit" in out


def test_check_config_says_where_it_looked(memd_home: Path) -> None:
    code, out = run("check-config")
    expected = memd_home / "config" / "config.toml"
    assert code == 0 and out.startswith(f"# from defaults: no file at {expected}\n")
    # A config.toml at the top of MEMD_HOME is not read: said, with where it belongs.
    memd_home.mkdir(parents=True, exist_ok=True)
    (memd_home / "config.toml").write_text("[search]\nmax_results = 3\n")
    code, out = run("check-config")
    assert code == 0
    (source,) = [line for line in out.splitlines() if line.startswith("# from ")]
    assert source.endswith(f"({memd_home / 'config.toml'} is not read: move it there)")
    expected.parent.mkdir()
    (memd_home / "config.toml").rename(expected)
    code, out = run("check-config")
    assert out.startswith(f"# from {expected}\n") and '"max_results": 3' in out
