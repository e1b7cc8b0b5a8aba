"""What the memctl modules share: settings, workspace references, options and error handling."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from memd.ctl import display
from memd_client.connection import Client, DaemonNotRunning, DaemonUnavailable
from memd_client.errors import MemdError

# Scripts can tell "memd is down" (start it) from "the call failed" (exit 1) and usage (exit 2).
EXIT_NOT_RUNNING = 3


@dataclass(frozen=True)
class _Settings:
    socket: Path | None
    timeout: float
    identity: dict[str, str] | None = None


def _ref(value: str) -> str:
    """A workspace as sent: a registered name as is, anything path-like made absolute."""
    if os.sep in value or value.startswith((".", "~")):
        return os.path.abspath(os.path.expanduser(value))
    return value


def _ref_or_cwd(value: str | None) -> str:
    return _ref(value) if value is not None else os.getcwd()


def _ref_or_all(value: str | None) -> str | None:
    return _ref(value) if value is not None else None


_F = TypeVar("_F", bound=Callable[..., Any])


def _workspace_option(*, all_by_default: bool = False) -> Callable[[_F], _F]:
    default = "every workspace" if all_by_default else "the current directory"
    return click.option(
        "-w",
        "--workspace",
        envvar="MEMD_WORKSPACE",
        default=None,
        metavar="WS",
        help=f"A registered name or a directory (default: $MEMD_WORKSPACE, else {default}).",
    )


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _error_json(exc: MemdError) -> dict[str, Any]:
    """An error as --json prints it: the wire code, its name, the message."""
    kind = "NOT_RUNNING" if isinstance(exc, DaemonNotRunning) else exc.code.name
    if isinstance(exc, DaemonUnavailable) and not isinstance(exc, DaemonNotRunning):
        kind = "UNAVAILABLE"
    return {"error": {"code": int(exc.code), "kind": kind, "message": str(exc)}}


@contextmanager
def _errors(ctx: click.Context) -> Iterator[None]:
    """Daemon errors as exit codes (3: not running, 1: the call failed); under --json the
    error is also printed as JSON on stdout, so a script reads one format."""
    as_json = bool(ctx.params.get("as_json"))
    try:
        yield
    except MemdError as exc:
        code = EXIT_NOT_RUNNING if isinstance(exc, DaemonNotRunning) else 1
        if as_json:
            _print_json(_error_json(exc))
            ctx.exit(code)
        if isinstance(exc, DaemonNotRunning):
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(code)
        raise click.ClickException(str(exc)) from None


@contextmanager
def _client(ctx: click.Context) -> Iterator[Client]:
    settings: _Settings = ctx.obj
    with _errors(ctx), Client(settings.socket, settings.timeout, identity=settings.identity) as c:
        yield c


POLL_SECONDS = 0.5


def with_progress(
    settings: _Settings,
    ref: str | None,
    call: Callable[[Client], Mapping[str, Any]],
    *,
    as_json: bool,
    show: bool,
) -> dict[str, Any]:
    """Run ``call`` on a connection of its own while another asks the daemon what it is doing,
    twice a second: a bar on a terminal's stderr, JSON lines on stdout with ``as_json``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            with Client(settings.socket, settings.timeout, identity=settings.identity) as c:
                outcome["result"] = call(c)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="memctl-call", daemon=True)
    worker.start()
    tty = sys.stderr.isatty()
    last: dict[str, Any] = {}
    if show and (tty or as_json):
        with Client(settings.socket, settings.timeout, identity=settings.identity) as poll:
            while worker.is_alive():
                worker.join(POLL_SECONDS)
                if not worker.is_alive():
                    break
                try:
                    status = poll.status(ref)
                except MemdError:
                    continue  # the status is a courtesy; the call's own outcome decides
                for ws in status.get("workspaces") or []:
                    progress = ws.get("progress")
                    if not progress or last.get(ws["workspace"]) == progress:
                        continue
                    last[ws["workspace"]] = progress
                    if as_json:
                        event = {"event": "progress", "workspace": ws["workspace"], **progress}
                        click.echo(json.dumps(event))
                    else:
                        bar = display.progress_bar(progress)
                        click.echo(f"\r\033[K{ws['workspace']}: {bar}", nl=False, err=True)
        if tty and last and not as_json:
            click.echo("\r\033[K", nl=False, err=True)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return dict(outcome["result"])


def _style(text: str, colour: str) -> str:
    """``text`` in ``colour``: click.echo drops it when stdout is not a TTY, and it is never
    added when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return text
    return click.style(text, fg=colour)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))
