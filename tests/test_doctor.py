"""`memctl doctor`: a healthy setup has no failure, and each seeded fault is named with its fix."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memd.config import Config
from memd.ctl.doctor import run_checks
from memd.ctl.doctor.check import Check
from memd.ctl.doctor.system import check_inotify
from memd.ctl.memctl import cli

from .daemon_fixture import running_daemon

MODEL = os.environ.get("MEMD_TEST_MODEL", "")
HAVE_MODEL = bool(MODEL) and Path(MODEL).is_file()
SECRET = "sk-doctortest0123456789abcdef"


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def doctor(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["doctor", *args], catch_exceptions=False)
    return result.exit_code, result.output


def private_runtime(config: Config) -> None:
    config.dirs.runtime.mkdir(parents=True, mode=0o700)
    os.chmod(config.dirs.runtime, 0o700)


def test_healthy_run_has_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    if HAVE_MODEL:
        monkeypatch.setenv("MEMD_LOCAL_MODEL", MODEL)
    config = Config.load()
    private_runtime(config)
    checks = by_name(run_checks(config, load_model=HAVE_MODEL))
    assert [c for c in checks.values() if c.status == "fail"] == []
    assert set(checks) == {
        "sqlite-vec",
        "model",
        "api keys",
        "socket directory",
        "private state",
        "daemon",
        "workspaces",
        "inotify",
        "disk space",
        "service",
    }
    # sqlite-vec is opt-in (index.sqlite_vec); by default vectors are searched in memory
    assert checks["sqlite-vec"].status == "skip" and "sketch" in checks["sqlite-vec"].detail
    opted = by_name(run_checks(Config.load(index__sqlite_vec=True), load_model=False))
    assert opted["sqlite-vec"].status == "ok" and "version" in opted["sqlite-vec"].detail
    assert checks["socket directory"].status == "ok"
    # Not running is a warning whose fix is to start it, not a failure.
    assert checks["daemon"].status == "warn"
    # (the tests turn clients' autostart off; with it on, the next client starts memd)
    assert checks["daemon"].fix is not None and checks["daemon"].fix.startswith("memd run")
    if HAVE_MODEL:
        assert "384 dims" in checks["model"].detail
        if checks["model"].status == "warn":  # a CPU whose AMX kernels crash llama.cpp
            assert "works in a worker in safe mode" in checks["model"].detail
            assert "crashed with default settings: SIG" in checks["model"].detail
        else:
            assert checks["model"].status == "ok"
    else:
        assert checks["model"].status == "warn"  # no model: remote or keyword-only


def test_running_daemon_and_watch_count(memd_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "agent"
    for sub in ("memory/a/b", "memory/c"):
        (root / sub).mkdir(parents=True)
    (memd_home / "config").mkdir(parents=True)
    (memd_home / "config" / "config.toml").write_text(f'[[workspaces]]\npath = "{root}"\n')
    config = Config.load()
    with running_daemon(config) as daemon:
        checks = by_name(run_checks(config, socket=daemon.socket_path, load_model=False))
    assert checks["daemon"].status == "ok", checks["daemon"]
    assert "1 workspace(s)" in checks["daemon"].detail
    assert checks["socket directory"].status == "ok"
    if sys.platform.startswith("linux"):
        # root (1) + memory/, memory/a, memory/a/b, memory/c (recursive)
        assert checks["inotify"].detail.startswith("5 directories in 1 workspace(s)")


def test_watch_limit_below_the_directory_count(memd_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "agent"
    (root / "memory" / "x").mkdir(parents=True)
    (memd_home / "config").mkdir(parents=True)
    (memd_home / "config" / "config.toml").write_text(f'[[workspaces]]\npath = "{root}"\n')
    proc = tmp_path / "inotify"
    proc.mkdir()
    (proc / "max_user_watches").write_text("2\n")
    (proc / "max_user_instances").write_text("128\n")
    check = check_inotify(Config.load(), None, proc=proc)
    if not sys.platform.startswith("linux"):
        assert check.status == "skip"
        return
    assert check.status == "fail"
    assert "more directories than watches" in check.detail
    assert check.fix is not None and "fs.inotify.max_user_watches" in check.fix


def test_socket_dir_not_private() -> None:
    config = Config.load()
    config.dirs.runtime.mkdir(parents=True)
    os.chmod(config.dirs.runtime, 0o755)
    check = by_name(run_checks(config, load_model=False))["socket directory"]
    assert check.status == "fail"
    assert "not private" in check.detail and "0755" in check.detail
    assert check.fix == f"chmod 700 {config.dirs.runtime}"


@pytest.mark.skipif(not HAVE_MODEL, reason="set MEMD_TEST_MODEL to a GGUF embedding model")
def test_model_that_crashes_is_probed_in_a_throwaway_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's test-only fault hook makes llama.cpp's process die (memd/embed/host.py):
    doctor names what crashed and what works, and survives it."""
    monkeypatch.setenv("MEMD_LOCAL_MODEL", MODEL)
    monkeypatch.setenv("MEMD_TEST_WORKER_FAULT", "ill:load:default")
    check = by_name(run_checks(Config.load()))["model"]
    assert check.status == "warn"
    assert "crashed with default settings: SIGILL" in check.detail
    assert "works in a worker in safe mode: extra buffer types off" in check.detail
    assert not (Config.load().state_dir / "local-model-modes.json").exists(), "doctor remembers"
    monkeypatch.setenv("MEMD_TEST_WORKER_FAULT", "segv:load")
    check = by_name(run_checks(Config.load()))["model"]
    assert check.status == "fail" and "crashed in every load mode" in check.detail
    assert check.fix is not None and "remote provider" in check.fix


def test_state_open_to_other_users_fails(memd_home: Path) -> None:
    config = Config.load()
    index = config.index_dir / "ws.sqlite"
    index.parent.mkdir(parents=True)
    index.write_bytes(b"")
    for path, mode in ((config.state_dir, 0o700), (config.index_dir, 0o700), (index, 0o600)):
        os.chmod(path, mode)
    assert by_name(run_checks(config, load_model=False))["private state"].status == "ok"
    os.chmod(index, 0o644)
    check = by_name(run_checks(config, load_model=False))["private state"]
    assert check.status == "fail" and "indexes/ws.sqlite 0644" in check.detail
    assert check.fix is not None and "chmod -R go-rwx" in check.fix


def test_missing_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMD_LOCAL_MODEL", "/nonexistent.gguf")
    check = by_name(run_checks(Config.load()))["model"]
    assert check.status == "fail"
    assert "/nonexistent.gguf does not exist" in check.detail
    assert check.fix is not None and "memctl model pull" in check.fix


def test_model_that_is_not_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"<html>not found</html>\n" * 10)
    monkeypatch.setenv("MEMD_LOCAL_MODEL", str(bogus))
    check = by_name(run_checks(Config.load()))["model"]
    assert check.status == "fail"
    assert "is not a GGUF file" in check.detail


def test_unloadable_sqlite_vec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "not-a-library.so"
    bad.write_text("garbage")
    check = by_name(run_checks(Config.load(), sqlite_vec_path=str(bad), load_model=False))[
        "sqlite-vec"
    ]
    assert check.status == "fail"
    assert f"cannot load sqlite-vec from {bad}" in check.detail
    assert check.fix is not None and "MEMD_SQLITE_VEC_PATH" in check.fix
    # The variable does the same through memctl.
    monkeypatch.setenv("MEMD_SQLITE_VEC_PATH", str(tmp_path / "missing.so"))
    code, out = doctor("--json", "--no-model")
    assert code == 1
    report = by_name([Check(**c) for c in json.loads(out)["checks"]])
    assert report["sqlite-vec"].status == "fail"
    assert "missing.so" in report["sqlite-vec"].detail


def test_key_file_readable_by_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    os.chmod(key_file, 0o644)
    monkeypatch.setenv("MEMD_EMBEDDING_API_KEY_FILE", str(key_file))
    check = by_name(run_checks(Config.load(), load_model=False))["api keys"]
    assert check.status == "fail"
    assert check.detail.startswith("key file refused:")
    assert "0644" in check.detail
    assert check.fix == f"chmod 600 {key_file}"
    for args in ((), ("--json",)):
        code, out = doctor("--no-model", *args)
        assert code == 1
        assert SECRET not in out
        assert f"chmod 600 {key_file}" in out


def test_keys_are_reported_never_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    check = by_name(run_checks(Config.load(), load_model=False))["api keys"]
    assert check.status == "ok"
    assert "openai set" in check.detail and "gemini missing" in check.detail
    # A good key file, 0600, is "set".
    key_file = tmp_path / "key"
    key_file.write_text(SECRET)
    os.chmod(key_file, 0o600)
    monkeypatch.setenv("MEMD_EMBEDDING_API_KEY_FILE", str(key_file))
    check = by_name(run_checks(Config.load(), load_model=False))["api keys"]
    assert check.status == "ok" and check.detail.endswith(": set")
    code, out = doctor("--no-model", "--json")
    assert SECRET not in out


def test_configured_remote_provider_without_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VOYAGE_API_KEY", raising=False)
    monkeypatch.setenv("MEMD_EMBEDDING_PROVIDER", "voyage")
    checks = by_name(run_checks(Config.load(), load_model=False))
    assert checks["api keys"].status == "fail"
    assert "voyage is configured but has no key" in checks["api keys"].detail
    assert checks["model"].status == "skip"


def test_memctl_exit_codes_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    private_runtime(Config.load())
    code, out = doctor("--json", "--no-model")
    report = json.loads(out)
    assert code == 0, out
    assert report["ok"] is True
    assert {c["status"] for c in report["checks"]} <= {"ok", "warn", "skip"}
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in report["checks"])
    code, out = doctor("--no-model")
    assert code == 0
    # Not a terminal: words, not symbols.
    assert "\nwarn daemon: " in out and "skip sqlite-vec: " in out
    assert "    fix: memd run" in out
    assert "✔" not in out
    monkeypatch.setenv("MEMD_LOCAL_MODEL", "/nonexistent.gguf")
    code, out = doctor()
    assert code == 1
    assert "FAIL model: model file /nonexistent.gguf does not exist" in out
    code, out = doctor("--json")
    assert code == 1
    assert json.loads(out)["ok"] is False


def test_bad_config_is_a_failure_not_a_crash(memd_home: Path) -> None:
    (memd_home / "config").mkdir(parents=True)
    (memd_home / "config" / "config.toml").write_text("[search]\nmax_results = 'many'\n")
    code, out = doctor("--json", "--no-model")
    assert code == 1
    checks = by_name([Check(**c) for c in json.loads(out)["checks"]])
    assert checks["config"].status == "fail"
    assert "search.max_results" in checks["config"].detail
    assert "disk space" in checks  # the rest still ran, on the defaults


def test_a_crashing_check_becomes_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import memd.ctl.doctor

    def boom(config: Config) -> Check:
        raise RuntimeError("disk exploded")

    monkeypatch.setattr(memd.ctl.doctor, "check_disk", boom)
    check = by_name(run_checks(Config.load(), load_model=False))["disk space"]
    assert check.status == "fail"
    assert "RuntimeError: disk exploded" in check.detail


def test_a_missing_relative_model_path_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memctl and the daemon read a relative path from different directories (a service's is
    # often /): the check says which one it used, as the daemon's status does.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMD_LOCAL_MODEL", "models/gone.gguf")
    check = by_name(run_checks(Config.load()))["model"]
    assert check.status == "fail"
    assert f"models/gone.gguf does not exist (looked for in {tmp_path})" in check.detail
