"""memctl's entry point, with a quick path: the everyday reads answered without importing click.

``memctl search``, ``get``, ``status`` and ``--version`` are what agents and scripts run most,
and importing click costs a process about as much as the rest of such a command. Their plain
forms are parsed here and run by the same bodies as the click commands (memd.ctl.reads);
anything else (another command, -h, an option or value this path does not know, ``--``) goes to
click (memd.ctl.memctl), which parses and reports everything. A test keeps the options here the
same as the click commands'.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["GLOBAL_OPTIONS", "QUICK_COMMANDS", "answer", "main"]

Convert = Callable[[str], Any]


def _at_least(low: int) -> Convert:
    def convert(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(text)
        return value

    return convert


def _one_of(*choices: str) -> Convert:
    def convert(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text

    return convert


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


FLAG = None  # an option that takes no value

# flag -> (name, how its value is read); as memd.ctl.memctl's click options.
GLOBAL_OPTIONS: dict[str, tuple[str, Convert | None]] = {
    "--home": ("home", str),
    "--socket": ("socket", str),
    "--timeout": ("timeout", _positive),
    "--agent-id": ("agent_id", str),
    "--session-key": ("session_key", str),
}
_WORKSPACE: dict[str, tuple[str, Convert | None]] = {
    "-w": ("workspace", str),
    "--workspace": ("workspace", str),
    "--json": ("as_json", FLAG),
}
# command -> (its positional arguments, its options)
QUICK_COMMANDS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, Convert | None]]]] = {
    "status": ((), _WORKSPACE),
    "search": (
        ("query",),
        {
            **_WORKSPACE,
            "-n": ("max_results", _at_least(1)),
            "--max-results": ("max_results", _at_least(1)),
            "--min-score": ("min_score", float),
            "--mode": ("mode", _one_of("hybrid", "keyword", "vector")),
            "--wait-ms": ("wait_ms", _at_least(0)),
            "--sources": ("sources", _one_of("memory", "sessions", "all")),
        },
    ),
    "get": (
        ("path",),
        {
            **_WORKSPACE,
            "--from": ("from_line", _at_least(1)),
            "--lines": ("lines", _at_least(1)),
        },
    ),
}


class _NotHere(Exception):
    """A form this path does not take: click parses it."""


def _options(
    args: Sequence[str], known: dict[str, tuple[str, Convert | None]], positionals: int
) -> tuple[dict[str, Any], list[str]]:
    """The options and positional arguments of ``args``, as click would read them."""
    values: dict[str, Any] = {}
    plain: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            plain.append(arg)
            continue
        flag, eq, inline = arg.partition("=")
        if flag not in known or (eq and not flag.startswith("--")):
            raise _NotHere  # -h, --, -n5, an unknown option
        name, convert = known[flag]
        if convert is FLAG:
            if eq:
                raise _NotHere
            values[name] = True
            continue
        if not eq:
            if i >= len(args):
                raise _NotHere
            inline, i = args[i], i + 1
        try:
            values[name] = convert(inline)
        except ValueError:
            raise _NotHere from None  # click says what is wrong with it
    if len(plain) != positionals:
        raise _NotHere
    return values, plain


def _env(name: str) -> str | None:
    return os.environ.get(name) or None  # an empty variable counts as unset, as for click


def answer(argv: Sequence[str]) -> int | None:
    """Run ``argv`` here and return the exit code, or None when click must take it."""
    if "--version" in argv:  # with global options at most
        try:
            _options([arg for arg in argv if arg != "--version"], GLOBAL_OPTIONS, 0)
        except _NotHere:
            return None
        return _version()
    try:
        at = next(i for i, arg in enumerate(argv) if arg in QUICK_COMMANDS)
        command = argv[at]
        given, loose = _options(argv[:at], GLOBAL_OPTIONS, 0)
        positionals, known = QUICK_COMMANDS[command]
        values, plain = _options(argv[at + 1 :], known, len(positionals))
    except (StopIteration, _NotHere):
        return None
    from memd.ctl import reads

    if given.get("home"):
        os.environ["MEMD_HOME"] = str(Path(given["home"]).expanduser().absolute())
    socket = given.get("socket") or _env("MEMD_SOCKET")
    agent_id = given.get("agent_id") or _env("MEMD_AGENT_ID")
    session_key = given.get("session_key") or _env("MEMD_SESSION_KEY")
    identity = {k: v for k, v in (("agent_id", agent_id), ("session_key", session_key)) if v}
    settings = reads.Settings(
        Path(socket) if socket else None, given.get("timeout", 30.0), identity or None
    )
    workspace = values.get("workspace") or _env("MEMD_WORKSPACE")
    as_json = bool(values.get("as_json"))
    if command == "status":
        return reads.status(settings, workspace, as_json=as_json)
    if command == "search":
        names = ("max_results", "min_score", "mode", "wait_ms", "sources")
        options = {name: values.get(name) for name in names}
        return reads.search(settings, workspace, plain[0], options, as_json=as_json)
    return reads.get(
        settings,
        workspace,
        plain[0],
        from_line=values.get("from_line"),
        lines=values.get("lines"),
        as_json=as_json,
    )


def _version() -> int:
    from memd import __version__

    sys.stdout.write(f"memctl, version {__version__}\n")
    return 0


def main() -> None:
    """Run memctl: the quick path when it can, else click."""
    if sys.argv[1:] == ["--version"]:  # before anything else is imported
        sys.exit(_version())
    from memd.private import keep_private

    keep_private()  # models, and the state its doctor and model commands write, stay private
    code = answer(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from memd.ctl.memctl import cli

    cli(prog_name="memctl")
