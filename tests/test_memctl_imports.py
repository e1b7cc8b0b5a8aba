"""What `memctl search` loads: the client, click and the display, nothing of the daemon.

memctl answers in a fraction of the time Python takes to import numpy, the index or the
dreaming code; a command that imports them at the top of a module would undo that. This runs a
real `memctl search` (a process of its own, against a running memd) and lists every module it
imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import memd_client
from memd.daemon import Daemon

from .daemon_fixture import running_daemon

# Beyond the standard library, the modules memctl may load for these commands.
ALLOWED_MEMD = {
    "memd",
    "memd.ctl",
    "memd.ctl.memctl",
    "memd.ctl.common",
    "memd.ctl.display",
    "memd.private",  # memctl's umask (stdlib only)
}
ALLOWED_TOP = {"memd", "memd_client", "click", "msgpack", "cython_runtime"}  # msgpack is Cython

_RUN = """\
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules))))
from memd.ctl.memctl import main
sys.argv = ["memctl", *sys.argv[1:]]
main()
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    ws = tmp_path / "agent"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    with running_daemon() as d:
        with memd_client.connect(d.socket_path) as c:
            c.workspace_add(ws, name="agent")
            c.search("agent", "staging", wait_ms=5000)
        yield d


def _modules(daemon: Daemon, *args: str) -> tuple[set[str], str]:
    result = subprocess.run(
        [sys.executable, "-c", _RUN, "--socket", str(daemon.socket_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    *printed, modules = result.stdout.strip().splitlines()
    return set(json.loads(modules)), "\n".join(printed)


@pytest.mark.parametrize(
    "args",
    [
        ("search", "staging cluster", "-w", "agent", "--mode", "keyword"),
        ("search", "staging cluster", "-w", "agent", "--json"),
        ("get", "MEMORY.md", "-w", "agent"),
        ("status",),
        ("--version",),
    ],
)
def test_memctl_loads_the_client_click_and_the_display_only(
    daemon: Daemon, args: tuple[str, ...]
) -> None:
    modules, out = _modules(daemon, *args)
    if args[0] == "search":
        assert "MEMORY.md" in out
    ours = {m for m in modules if m == "memd" or m.startswith("memd.")}
    assert ours <= ALLOWED_MEMD, sorted(ours - ALLOWED_MEMD)
    stdlib = sys.stdlib_module_names
    foreign = {
        m
        for m in modules
        if m.split(".")[0] not in stdlib
        and m.split(".")[0] not in ALLOWED_TOP
        and not m.startswith(("_", "__editable__"))  # interpreter internals, the dev install
    }
    assert not foreign, sorted(foreign)
    # Not even the parts of the standard library the daemon's side needs.
    assert not {"asyncio", "subprocess", "sqlite3", "importlib.metadata"} & modules
