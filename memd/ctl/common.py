"""What the memctl modules share: settings, workspace references, options and error handling.

The parts that need no click (settings, references, printing, the exit codes) live in
memd.ctl.reads, which memctl's quick path uses without importing click.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from memd.ctl import display
from memd.ctl.reads import Settings as _Settings
from memd.ctl.reads import (
    error_json,
    failure,
    print_json,
    ref,
    ref_or_all,
    ref_or_cwd,
)
from memd_client.connection import Client
from memd_client.errors import MemdError

_ref, _ref_or_cwd, _ref_or_all = ref, ref_or_cwd, ref_or_all
_print_json, _error_json = print_json, error_json

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


@contextmanager
def _errors(ctx: click.Context) -> Iterator[None]:
    """Daemon errors as exit codes (3: not running, 1: the call failed); under --json the
    error is also printed as JSON on stdout, so a script reads one format."""
    try:
        yield
    except MemdError as exc:
        ctx.exit(failure(exc, as_json=bool(ctx.params.get("as_json"))))


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
    """``text`` in ``colour``: click.echo drops it when stdout is not a TTY (unless told to
    colour), and it is never added when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return text
    return click.style(text, fg=colour)
