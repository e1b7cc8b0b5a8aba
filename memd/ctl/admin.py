"""memctl's administrative commands: model, service, doctor, mcp and start.

They run daemon code in-process, imported inside each command; ``memd.ctl.memctl`` imports this
module only when one of them runs, so the everyday commands (which only talk to the socket)
start without loading it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from memd.ctl import display
from memd.ctl.common import (
    _errors,
    _json_option,
    _print_json,
    _ref_or_cwd,
    _style,
    _workspace_option,
)
from memd.ctl.reads import EXIT_NOT_RUNNING
from memd.ctl.reads import Settings as _Settings
from memd.private import private_directory
from memd_client.errors import MemdError
from memd_client.paths import user_dirs

__all__ = ["doctor_cmd", "mcp_cmd", "model_group", "service_group", "start_cmd"]


@click.group("model")
def model_group() -> None:
    """List and download embedding models (runs here, not in the daemon)."""


@model_group.command("list")
@_json_option
@click.pass_context
def model_list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the GGUF models in the model directory.

    Example: memctl model list --json
    """
    from memd.embed.models import list_models  # only this command needs it: memctl starts faster

    models_dir = user_dirs().models
    with _errors(ctx):
        models = list_models(models_dir)
    if as_json:
        _print_json(
            [
                {"name": m.name, "path": str(m.path), "size": m.size}
                | {"sha256": m.sha256, "partial": m.partial}
                for m in models
            ]
        )
        return
    if not models:
        click.echo(f"No models in {models_dir}; get one with `memctl model pull URI`.", err=True)
    for m in models:
        click.echo(display.model_line(m.name, m.size, m.sha256, m.partial))


@model_group.command("pull")
@click.argument("uri", required=False)
@click.option("--sha256", default=None, metavar="HEX", help="The expected checksum.")
@click.pass_context
def model_pull_cmd(ctx: click.Context, uri: str | None, sha256: str | None) -> None:
    """Bring the model URI into the model directory: download hf:owner/repo/file.gguf or an
    https:// URL, or copy a GGUF file on this machine (a path); with no URI, the recommended
    multilingual model (multilingual-e5-small, or [embedding] pull_uri).

    \b
    Example:
      memctl model pull
      memctl model pull ~/Downloads/multilingual-e5-small-q8_0.gguf
      memctl model pull hf:second-state/All-MiniLM-L6-v2-Embedding-GGUF/all-MiniLM-L6-v2-Q8_0.gguf
    """
    # only this command needs it: memctl starts faster
    from memd.config import Config
    from memd.embed.models import RECOMMENDED_MODEL_URI, progress_bar, pull

    if uri is None:
        with _errors(ctx):
            uri = Config.load().embedding.pull_uri or RECOMMENDED_MODEL_URI

    with _errors(ctx):
        # A model directory others may write to would let them choose what memd loads.
        models = private_directory(user_dirs().models, "model directory")
        path = pull(uri, models, sha256=sha256, progress=progress_bar())
    click.echo(str(path))


@click.command("doctor")
@_json_option
@click.option("--no-model", is_flag=True, help="Read the model's header only; do not load it.")
@click.pass_context
def doctor_cmd(ctx: click.Context, as_json: bool, no_model: bool) -> None:
    """Check sqlite-vec, the model, keys, the socket, watches, disk and the service.

    Exits 1 when a check fails (warnings exit 0). Example: memctl doctor --json
    """
    from memd.ctl import doctor  # only this command needs it: memctl starts faster

    settings: _Settings = ctx.obj
    checks = doctor.diagnose(socket=settings.socket, load_model=not no_model)
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        _print_json({"ok": not failed, "checks": [vars(c) for c in checks]})
    else:
        tty = sys.stdout.isatty()
        marks = {"ok": ("✔", "ok", "green"), "warn": ("!", "warn", "yellow")}
        marks |= {"fail": ("✘", "FAIL", "red"), "skip": ("-", "skip", "white")}
        for c in checks:
            symbol, word, colour = marks[c.status]
            click.echo(f"{_style(symbol if tty else word, colour)} {c.name}: {c.detail}")
            if c.fix and c.status != "ok":
                click.echo(f"    fix: {c.fix}")
    if failed:
        ctx.exit(1)


@click.command("mcp")
@_workspace_option()
@click.option("--agent-id", default=None, help="Search as this agent (as memctl --agent-id).")
@click.option("--session-key", default=None, help="The caller's session key (as memctl's).")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="memd's home (MEMD_HOME): MCP clients pass servers few environment variables.",
)
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="memd's socket (MEMD_SOCKET), for the same reason.",
)
@click.option(
    "--no-register",
    is_flag=True,
    help="A -w directory memd does not know is an error (default: registered on first use).",
)
@click.pass_context
def mcp_cmd(
    ctx: click.Context,
    workspace: str | None,
    agent_id: str | None,
    session_key: str | None,
    home: Path | None,
    socket_path: Path | None,
    no_register: bool,
) -> None:
    """Serve the workspace's memory to an MCP client over stdio (memory_search/get/append).

    memd is started if it is not running (MEMD_AUTOSTART=0: it is not), and a workspace
    directory it does not know is registered on first use.

    Example: memctl mcp -w ~/agent --home ~/.memd --agent-id main   (an MCP server command)
    """
    try:
        from memd.ctl import mcp_server  # the MCP SDK too: only this command needs them
    except ImportError as exc:
        from memd.dist import install_hint

        raise click.ClickException(
            f"memctl mcp needs the MCP SDK ({exc}); install it with: {install_hint('mcp')}"
        ) from None
    settings: _Settings = ctx.obj
    if home is not None:  # before anything resolves a path: the socket, a memd started here
        os.environ["MEMD_HOME"] = str(home.expanduser().absolute())
    os.environ.setdefault("MEMD_STARTED_BY", f"memctl mcp (pid {os.getpid()})")
    identity = dict(settings.identity or {})
    identity.update({k: v for k, v in (("agent_id", agent_id), ("session_key", session_key)) if v})
    mcp_server.run(
        _ref_or_cwd(workspace),
        socket_path.expanduser().absolute() if socket_path else settings.socket,
        identity or None,
        timeout=settings.timeout,
        register=not no_register,
    )


@click.command("start")
@_json_option
@click.pass_context
def start_cmd(ctx: click.Context, as_json: bool) -> None:
    """Start memd in the background unless it is running; return once it answers.

    Every client starts memd by itself when nothing answers (unless MEMD_AUTOSTART=0): this
    does it now, for a script or an agent host. Of several started at once, one starts memd
    and the others wait for it. Exits 3 when memd could not be started, saying why.

    Example: memctl start
    """
    from memd_client.autostart import StartFailed, ensure_running
    from memd_client.connection import Client
    from memd_client.paths import socket_path

    settings: _Settings = ctx.obj
    path = settings.socket or socket_path()
    try:
        started = ensure_running(path)
    except StartFailed as exc:
        message = f"memd is not running at {path}, and {exc}"
        if as_json:
            error = {"code": 1, "kind": "NOT_RUNNING", "message": message}
            _print_json({"error": error})
        else:
            click.echo(f"Error: {message}", err=True)
        ctx.exit(EXIT_NOT_RUNNING)
    with _errors(ctx), Client(path, settings.timeout, autostart=False) as c:
        hello = c.hello(client="memctl")
    reply = {"started": started is not None, "pid": hello["pid"], "socket": str(path)}
    if as_json:
        _print_json(reply)
    elif started is not None:
        click.echo(f"Started memd (pid {hello['pid']}) on {path}")
    else:
        click.echo(f"memd is running (pid {hello['pid']}) on {path}")


@click.group("service")
def service_group() -> None:
    """Run memd under the service manager: a systemd user unit (Linux) or a LaunchAgent (macOS)."""


def _service_failure(exc: Exception) -> None:
    """Print what was done before ``exc`` (a ServiceError), then the error."""
    for line in getattr(exc, "lines", []):
        click.echo(line)
    click.echo(f"Error: {exc}", err=True)


@service_group.command("install")
@click.option("--dry-run", is_flag=True, help="Show what would be done; change nothing.")
@click.option("--force", is_flag=True, help="Replace a service file that differs from memd's.")
@click.pass_context
def service_install_cmd(ctx: click.Context, dry_run: bool, force: bool) -> None:
    """Write the service file for this platform, then enable and start memd.

    Example: memctl service install --dry-run
    """
    running = None if dry_run else _daemon_answer(ctx.obj)
    if running and (running.get("started") or {}).get("how") not in (
        "service",
        "socket activation",
    ):
        # The service's memd would find this one holding memd's state and stop (exit 4).
        how = (running.get("started") or {}).get("how") or "by hand"
        click.echo(
            f"Error: a memd started {how} is running (pid {running['pid']} on "
            f"{running['socket']}): stop it first (Ctrl-C, or kill {running['pid']}), then "
            "install the service, which starts memd again",
            err=True,
        )
        ctx.exit(1)
    _service_action(ctx, lambda sf: sf.install(dry_run=dry_run, force=force))


@service_group.command("uninstall")
@click.option("--dry-run", is_flag=True, help="Show what would be done; change nothing.")
@click.pass_context
def service_uninstall_cmd(ctx: click.Context, dry_run: bool) -> None:
    """Stop and disable memd, and remove its service file.

    Example: memctl service uninstall
    """
    _service_action(ctx, lambda sf: sf.uninstall(dry_run=dry_run))


def _daemon_answer(settings: _Settings) -> dict[str, Any] | None:
    """The memd that answers on the socket (pid, version, socket), whoever started it."""
    from memd_client.connection import Client

    try:
        with Client(settings.socket, 2.0, autostart=False) as c:  # asks; does not start one
            hello = c.hello(client="memctl")
            return {
                "pid": hello["pid"],
                "version": hello["version"],
                "socket": str(c.path),
                "started": hello.get("started"),
            }
    except MemdError:
        return None


def _service_action(ctx: click.Context, action: Callable[[Any], list[str]]) -> None:
    """Run ``action`` on memd.ctl.servicefiles and print what it did; exit 1 on failure."""
    from memd.ctl import servicefiles  # only these commands need it: memctl starts faster

    try:
        lines = action(servicefiles)
    except servicefiles.ServiceError as exc:
        _service_failure(exc)
        ctx.exit(1)
    for line in lines:
        click.echo(line)


@service_group.command("status")
@_json_option
@click.pass_context
def service_status_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show whether memd's service is installed, current and running (exit 1: no service manager).

    Example: memctl service status --json
    """
    from memd.ctl import servicefiles  # only this command needs it: memctl starts faster

    try:
        info = servicefiles.status()
    except servicefiles.ServiceError as exc:
        _service_failure(exc)
        ctx.exit(1)
    info["daemon"] = _daemon_answer(ctx.obj)
    if as_json:
        _print_json(info)
    else:
        name = info.get("unit") or info.get("label")
        click.echo(f"manager: {info['manager']} ({name})")
        if not info["installed"]:
            state = "not installed"
        elif info["up_to_date"] is False:
            state = "installed, differs from what `memctl service install` writes"
        else:
            state = "installed"
        click.echo(f"file: {info['path']} ({state})")
        if info["manager"] == "systemd" and info["available"]:
            click.echo(f"state: {info['active']}, {info['enabled']}")
            listening = (info.get("socket_unit") or {}).get("active")
            click.echo(f"socket: memd.socket {listening or 'unknown'} (starts memd on demand)")
        elif info["manager"] == "launchd" and info["available"]:
            loaded = (info["state"] or "unknown") if info["loaded"] else "not loaded"
            pid = f", pid {info['pid']}" if info["pid"] else ""
            click.echo(f"state: {loaded}{pid}; logs: {info['log']}")
        daemon = info["daemon"]
        if info["running"]:
            click.echo(f"memd: {_style('running', 'green')}")
        elif daemon:
            where = f"pid {daemon['pid']} on {daemon['socket']}"
            click.echo(f"memd: {_style('running', 'green')}, but not as this service ({where})")
        else:
            click.echo(f"memd: {_style('not running', 'red')}")
    if not info["available"]:
        click.echo(f"Error: {info.get('reason')}", err=True)
        ctx.exit(1)
