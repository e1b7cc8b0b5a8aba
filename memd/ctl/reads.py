"""memctl's everyday reads (status, search, get) and how memctl prints, without click.

memctl's click commands (memd.ctl.memctl) and its quick path (memd.ctl.quick, which answers
these commands without importing click) run the same bodies here, so both print the same
thing and exit the same way: 0, 1 when a call fails, 3 when memd is not running.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from memd.ctl import display
from memd_client.connection import Client, DaemonNotRunning, DaemonUnavailable
from memd_client.errors import MemdError

__all__ = [
    "EXIT_NOT_RUNNING",
    "Settings",
    "echo",
    "failure",
    "get",
    "print_json",
    "ref",
    "ref_or_all",
    "ref_or_cwd",
    "search",
    "shown",
    "status",
    "style",
]

# Scripts can tell "memd is down" (start it) from "the call failed" (exit 1) and usage (exit 2).
EXIT_NOT_RUNNING = 3

T = TypeVar("T")

Echo = Callable[..., None]  # echo(text, err=False, nl=True)
Style = Callable[[str, str], str]

# The ANSI colours memctl uses, as click.style writes them.
_COLOURS = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36}
_COLOURS["white"] = 37


class Settings(NamedTuple):
    """memctl's global options: the socket, the reply timeout, whom it speaks for."""

    socket: Path | None
    timeout: float
    identity: dict[str, str] | None = None


def ref(value: str) -> str:
    """A workspace as sent: a registered name as is, anything path-like made absolute."""
    if os.sep in value or value.startswith((".", "~")):
        return os.path.abspath(os.path.expanduser(value))
    return value


def ref_or_cwd(value: str | None) -> str:
    return ref(value) if value is not None else os.getcwd()


def ref_or_all(value: str | None) -> str | None:
    return ref(value) if value is not None else None


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + ("\n" if nl else ""))
    stream.flush()


def style(text: str, colour: str) -> str:
    """``text`` in ``colour`` on a terminal; plain into a pipe or a file, and whenever NO_COLOR
    is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR") or not sys.stdout.isatty() or colour not in _COLOURS:
        return text
    return f"\x1b[{_COLOURS[colour]}m{text}\x1b[0m"


def print_json(value: Any) -> None:
    import json  # only --json needs it

    echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))


def shown(value: T) -> T:
    """What memory files say, with control characters escaped when stdout is a terminal
    (memctl's own colours are added after this, so they survive)."""
    if not sys.stdout.isatty():
        return value
    if isinstance(value, str):
        return display.terminal_safe(value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: shown(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [shown(v) for v in value]  # type: ignore[return-value]
    return value


def error_json(exc: MemdError) -> dict[str, Any]:
    """An error as --json prints it: the wire code, its name, the message."""
    kind = "NOT_RUNNING" if isinstance(exc, DaemonNotRunning) else exc.code.name
    if isinstance(exc, DaemonUnavailable) and not isinstance(exc, DaemonNotRunning):
        kind = "UNAVAILABLE"
    return {"error": {"code": int(exc.code), "kind": kind, "message": str(exc)}}


def failure(exc: MemdError, *, as_json: bool) -> int:
    """Say what failed (as JSON on stdout with ``as_json``, else ``Error: ...`` on stderr) and
    return the exit code: 3 when memd is not running, else 1."""
    if as_json:
        print_json(error_json(exc))
    else:
        echo(f"Error: {exc}", err=True)
    return EXIT_NOT_RUNNING if isinstance(exc, DaemonNotRunning) else 1


@contextmanager
def client(settings: Settings) -> Iterator[Client]:
    with Client(settings.socket, settings.timeout, identity=settings.identity) as c:
        yield c


def status(
    settings: Settings,
    workspace: str | None,
    *,
    as_json: bool,
    echo: Echo = echo,
    style: Style = style,
) -> int:
    """memctl status (``echo`` and ``style``: click's, from the click command)."""
    try:
        with client(settings) as c:
            result = c.status(ref_or_all(workspace))
    except MemdError as exc:
        return failure(exc, as_json=as_json)
    if as_json:
        print_json(result)
        return 0
    from memd.ctl.display_status import status_lines  # search and get start without it

    for line in status_lines(shown(result), time.time(), style):
        echo(line)
    return 0


def search(
    settings: Settings,
    workspace: str | None,
    query: str,
    options: Mapping[str, Any],
    *,
    as_json: bool,
    echo: Echo = echo,
    style: Style = style,
) -> int:
    """memctl search; ``options``: max_results, min_score, mode, wait_ms, sources."""
    try:
        with client(settings) as c:
            result = c.search(ref_or_cwd(workspace), query, **options)
    except MemdError as exc:
        return failure(exc, as_json=as_json)
    if as_json:
        keys = ("results", "freshness", "provider", "model", "mode", "note")
        print_json({k: result.get(k) for k in keys})
        return 0
    result = shown(result)
    for line in display.search_notes(result):
        echo(line, err=True)
    for line in display.search_lines(result, style):
        echo(line)
    return 0


def get(
    settings: Settings,
    workspace: str | None,
    path: str,
    *,
    from_line: int | None,
    lines: int | None,
    as_json: bool,
    echo: Echo = echo,
) -> int:
    """memctl get: exits 1 for a file that does not exist, in text mode and with --json."""
    try:
        with client(settings) as c:
            result = c.get(ref_or_cwd(workspace), path, from_line=from_line, lines=lines)
    except MemdError as exc:
        return failure(exc, as_json=as_json)
    if as_json:
        print_json(result)
        return 1 if result.get("missing") else 0  # a script need not parse the reply to know
    if result.get("missing"):
        echo(f"Error: {path} does not exist in the workspace", err=True)
        return 1
    text = shown(str(result.get("text") or ""))
    echo(text, nl=bool(text) and not text.endswith("\n"))
    if result.get("truncated") and result.get("next_from"):
        echo(f"(more: memctl get {path} --from {result['next_from']})", err=True)
    return 0
