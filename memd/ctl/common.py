"""What the memctl modules share: settings, workspace references, options and error handling."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from memd_client.connection import Client, DaemonNotRunning
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


@contextmanager
def _errors(ctx: click.Context) -> Iterator[None]:
    try:
        yield
    except DaemonNotRunning as exc:
        click.echo(f"Error: {exc}", err=True)
        ctx.exit(EXIT_NOT_RUNNING)
    except MemdError as exc:
        raise click.ClickException(str(exc)) from None


@contextmanager
def _client(ctx: click.Context) -> Iterator[Client]:
    settings: _Settings = ctx.obj
    with _errors(ctx), Client(settings.socket, settings.timeout, identity=settings.identity) as c:
        yield c


@contextmanager
def _spinner(label: str) -> Iterator[None]:
    """Show an elapsed-time spinner on a terminal's stderr while the block runs."""
    err = sys.stderr
    if not err.isatty():
        yield
        return
    done = threading.Event()

    def spin() -> None:
        start, frames = time.monotonic(), "|/-\\"
        i = 0
        while not done.wait(0.1):
            err.write(f"\r{frames[i % 4]} {label} {time.monotonic() - start:.0f}s")
            err.flush()
            i += 1
        err.write("\r\033[K")
        err.flush()

    thread = threading.Thread(target=spin, name="memctl-spinner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _style(text: str, colour: str) -> str:
    return click.style(text, fg=colour)  # click.echo drops it when stdout is not a TTY


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))
