"""What `memctl search` loads: the client, click and the display, nothing of the daemon; and
the quick path of the installed `memctl` (memd.ctl.quick), not even click.

memctl answers in a fraction of the time Python takes to import numpy, the index or the
dreaming code; a command that imports them at the top of a module would undo that. This runs a
real `memctl search` (a process of its own, against a running memd) and lists every module it
imported. The quick path answers search, get and status as the click commands do: a test
compares their outputs, and keeps their options the same.
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
    "memd.ctl.display_status",  # memctl status
    "memd.ctl.reads",
    "memd.ctl.quick",
    "memd.private",  # memctl's umask (stdlib only)
}
ALLOWED_TOP = {"memd", "memd_client", "click", "msgpack", "cython_runtime"}  # msgpack is Cython

# The click path (memd.ctl.memctl's main) and the installed entry point (memd.ctl.quick's).
_RUN = """\
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules))))
from memd.ctl.{module} import main
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


def _modules(daemon: Daemon, *args: str, module: str = "memctl") -> tuple[set[str], str]:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN.format(module=module),
            "--socket",
            str(daemon.socket_path),
            *args,
        ],
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


@pytest.mark.parametrize(
    "args",
    [
        ("search", "staging cluster", "-w", "agent", "--mode", "keyword"),
        ("search", "staging cluster", "-w", "agent", "--json", "-n", "1"),
        ("get", "MEMORY.md", "-w", "agent", "--from=3", "--lines", "1"),
        ("status", "--json"),
        ("--version",),
    ],
)
def test_the_quick_path_needs_not_even_click(daemon: Daemon, args: tuple[str, ...]) -> None:
    modules, out = _modules(daemon, *args, module="quick")
    ours = {m for m in modules if m == "memd" or m.startswith("memd.")}
    assert ours <= ALLOWED_MEMD - {"memd.ctl.memctl", "memd.ctl.common"}, sorted(ours)
    assert not {m for m in modules if m.split(".")[0] == "click"}
    assert out


def _both(daemon: Daemon, *args: str) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``args`` run by the click commands and by the quick path (real processes)."""
    return tuple(
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"from memd.ctl.{module} import main; main()",
                "--socket",
                str(daemon.socket_path),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        for module in ("memctl", "quick")
    )


@pytest.mark.parametrize(
    "args",
    [
        ("search", "staging cluster", "-w", "agent", "-n", "1"),
        ("search", "--mode=keyword", "staging cluster", "--workspace", "agent", "--json"),
        ("search", "nothing of the kind", "-w", "agent", "--min-score", "0.99"),
        ("get", "MEMORY.md", "-w", "agent", "--from", "3"),
        ("get", "memory/none.md", "-w", "agent"),  # missing: exit 1, both ways
        ("get", "memory/none.md", "-w", "agent", "--json"),
        ("search", "q", "-w", "nope"),  # an unknown workspace: exit 1
        ("search", "q", "-w", "nope", "--json"),
        ("status", "-w", "nope"),
    ],
)
def test_the_quick_path_answers_as_the_click_commands_do(
    daemon: Daemon, args: tuple[str, ...]
) -> None:
    clicked, quick = _both(daemon, *args)
    assert (quick.returncode, quick.stdout, quick.stderr) == (
        clicked.returncode,
        clicked.stdout,
        clicked.stderr,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("search", "q", "-n", "0"),  # out of range: click says so
        ("search", "q", "--mode", "fuzzy"),
        ("search", "-h"),
        ("search", "q", "--nope"),
        ("search",),
        ("get", "a.md", "b.md"),
        ("status", "--", "x"),
    ],
)
def test_what_the_quick_path_does_not_take_goes_to_click(args: tuple[str, ...]) -> None:
    from memd.ctl.quick import answer

    assert answer(list(args)) is None


def test_the_quick_options_are_the_click_commands_options() -> None:
    """An option added to a click command (or a global one) must be taken by the quick path
    too, or the quick path would hand it to click: this keeps the two the same."""
    import click

    from memd.ctl.memctl import cli
    from memd.ctl.quick import GLOBAL_OPTIONS, QUICK_COMMANDS

    def flags(command: click.Command) -> set[str]:
        return {
            opt
            for p in command.params
            if isinstance(p, click.Option)
            for opt in (*p.opts, *p.secondary_opts)
        } - {"-h", "--help", "--version"}

    def arguments(command: click.Command) -> tuple[str, ...]:
        return tuple(p.name or "" for p in command.params if isinstance(p, click.Argument))

    assert flags(cli) == set(GLOBAL_OPTIONS)
    ctx = click.Context(cli)
    for name, (positionals, options) in QUICK_COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None
        assert flags(command) == set(options), name
        assert arguments(command) == positionals, name
