"""The ``memctl`` command: talk to the running memd daemon and format what it says.

memctl status
memctl workspace add ~/agent --name agent
memctl search "when is the launch?" -w agent
memctl get memory/2026-03-01.md -w agent --from 10 --lines 20
echo "- launch moved to May" | memctl append - -w agent
"""

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

from memd_client import display
from memd_client.connection import Client, DaemonNotRunning
from memd_client.errors import MemdError
from memd_client.paths import user_dirs

__all__ = ["EXIT_NOT_RUNNING", "cli", "main"]

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


@click.group()
@click.version_option(package_name="memd", prog_name="memctl")
@click.option(
    "--socket",
    "socket_path",
    envvar="MEMD_SOCKET",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The daemon's socket (default: $MEMD_SOCKET, else the per-user runtime directory).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for each reply.",
)
@click.option(
    "--agent-id",
    envvar="MEMD_AGENT_ID",
    default=None,
    help="Search as this agent (its session transcripts become visible).",
)
@click.option(
    "--session-key",
    envvar="MEMD_SESSION_KEY",
    default=None,
    help="The caller's session key (agent:<id>:<channel>:<chat type>:...).",
)
@click.pass_context
def cli(
    ctx: click.Context,
    socket_path: Path | None,
    timeout: float,
    agent_id: str | None,
    session_key: str | None,
) -> None:
    """memctl: control and query the memd memory daemon.

    Example: memctl search "deploy checklist" -w ~/agent
    """
    identity = {k: v for k, v in (("agent_id", agent_id), ("session_key", session_key)) if v}
    ctx.obj = _Settings(socket_path, timeout, identity or None)


@cli.command("status")
@_workspace_option(all_by_default=True)
@_json_option
@click.pass_context
def status_cmd(ctx: click.Context, workspace: str | None, as_json: bool) -> None:
    """Show the daemon and the index of each workspace.

    Example: memctl status -w ~/agent
    """
    with _client(ctx) as c:
        result = c.status(_ref_or_all(workspace))
    if as_json:
        _print_json(result)
        return
    for line in display.status_lines(result, time.time(), _style):
        click.echo(line)


@cli.group("workspace")
def workspace_group() -> None:
    """Register, unregister and list workspaces."""


@workspace_group.command("add")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", default=None, help="The name to refer to it by (default: derived).")
@click.option(
    "--extra",
    "extra",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Another Markdown file or folder to index with it (repeatable).",
)
@click.option(
    "--sessions-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A folder of the agent's session transcripts (*.jsonl) to index too.",
)
@click.option("--agent-id", "owner", default=None, help="The agent the transcripts belong to.")
@click.pass_context
def workspace_add_cmd(
    ctx: click.Context,
    path: Path,
    name: str | None,
    extra: tuple[Path, ...],
    sessions_dir: Path | None,
    owner: str | None,
) -> None:
    """Register the directory PATH as a workspace.

    Example: memctl workspace add ~/agent --name agent --extra ~/notes
    """
    with _client(ctx) as c:
        result = c.workspace_add(
            path,
            name=name,
            extra_paths=list(extra) or None,
            sessions_dir=sessions_dir,
            agent_id=owner,
        )
    click.echo(f"Added {result.get('name')}: {result.get('path')}")
    for p in result.get("extra_paths") or []:
        click.echo(f"  + {p}")


@workspace_group.command("remove")
@click.argument("workspace")
@click.pass_context
def workspace_remove_cmd(ctx: click.Context, workspace: str) -> None:
    """Unregister WORKSPACE (a name or a path); its files are left alone.

    Example: memctl workspace remove agent
    """
    with _client(ctx) as c:
        result = c.workspace_remove(_ref(workspace))
    if not result.get("removed"):
        raise click.ClickException(f"no workspace {workspace!r} is registered")
    click.echo(f"Removed {workspace}")


@workspace_group.command("list")
@_json_option
@click.pass_context
def workspace_list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the registered workspaces.

    Example: memctl workspace list --json
    """
    with _client(ctx) as c:
        result = c.workspace_list()
    if as_json:
        _print_json(result)
        return
    workspaces = result.get("workspaces") or []
    if not workspaces:
        click.echo("No workspaces registered; add one with `memctl workspace add PATH`.", err=True)
    for ws in workspaces:
        click.echo(f"{ws.get('name')}\t{ws.get('path')}")
        for p in ws.get("extra_paths") or []:
            click.echo(f"\t+ {p}")


@cli.command("search")
@click.argument("query")
@_workspace_option()
@click.option(
    "-n", "--max-results", type=click.IntRange(min=1), default=None, help="At most N hits."
)
@click.option("--min-score", type=float, default=None, help="Drop hits scoring below X.")
@click.option(
    "--mode",
    type=click.Choice(["hybrid", "keyword", "vector"]),
    default=None,
    help="How to rank (default: the daemon's configured mode).",
)
@click.option(
    "--wait-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Wait up to this long for pending edits to be indexed first.",
)
@click.option(
    "--sources",
    type=click.Choice(["memory", "sessions", "all"]),
    default=None,
    help="Which sources to search (default: all this caller may see).",
)
@_json_option
@click.pass_context
def search_cmd(
    ctx: click.Context,
    query: str,
    workspace: str | None,
    max_results: int | None,
    min_score: float | None,
    mode: str | None,
    wait_ms: int | None,
    sources: str | None,
    as_json: bool,
) -> None:
    """Search a workspace's memory for QUERY.

    Example: memctl search "what did we decide about the API?" -w ~/agent -n 5
    """
    ref = _ref_or_cwd(workspace)
    with _client(ctx) as c:
        result = c.search(
            ref,
            query,
            max_results=max_results,
            min_score=min_score,
            mode=mode,
            wait_ms=wait_ms,
            sources=sources,
        )
    if as_json:
        keys = ("results", "freshness", "provider", "model", "mode", "note")
        _print_json({k: result.get(k) for k in keys})
        return
    for line in display.search_notes(result):
        click.echo(line, err=True)
    for line in display.search_lines(result, _style):
        click.echo(line)


@cli.command("get")
@click.argument("path")
@_workspace_option()
@click.option("--from", "from_line", type=click.IntRange(min=1), default=None, help="First line.")
@click.option("--lines", type=click.IntRange(min=1), default=None, help="How many lines.")
@_json_option
@click.pass_context
def get_cmd(
    ctx: click.Context,
    path: str,
    workspace: str | None,
    from_line: int | None,
    lines: int | None,
    as_json: bool,
) -> None:
    """Print lines of the memory file PATH (relative to the workspace).

    Example: memctl get memory/2026-03-01.md -w ~/agent --from 10 --lines 20
    """
    ref = _ref_or_cwd(workspace)
    with _client(ctx) as c:
        result = c.get(ref, path, from_line=from_line, lines=lines)
    if as_json:
        _print_json(result)
        return
    if result.get("missing"):
        raise click.ClickException(f"{path} does not exist in the workspace")
    text = result.get("text") or ""
    click.echo(text, nl=bool(text) and not text.endswith("\n"))
    if result.get("truncated") and result.get("next_from"):
        click.echo(f"(more: memctl get {path} --from {result['next_from']})", err=True)


@cli.command("append")
@click.argument("text")
@_workspace_option()
@click.pass_context
def append_cmd(ctx: click.Context, text: str, workspace: str | None) -> None:
    """Append TEXT ("-" reads stdin) to today's memory file; returns once it is searchable.

    Example: echo "- the launch moved to May" | memctl append - -w ~/agent
    """
    if text == "-":
        text = sys.stdin.read()
    ref = _ref_or_cwd(workspace)
    with _client(ctx) as c:
        result = c.append(ref, text)
    click.echo(
        f"Appended to {result.get('path')}#L{result.get('start_line')}-L{result.get('end_line')}"
    )


@cli.command("promote")
@_workspace_option()
@click.option("--apply", is_flag=True, help="Write the candidates to MEMORY.md.")
@click.option("--explain", metavar="KEY", default=None, help="Show one entry's score breakdown.")
@click.option("--json", "as_json", is_flag=True, help="Print the reply as JSON.")
@click.pass_context
def promote_cmd(
    ctx: click.Context, workspace: str | None, apply: bool, explain: str | None, as_json: bool
) -> None:
    """Rank short-term memories that keep being recalled; --apply promotes them to MEMORY.md.

    Example: memctl promote -w ~/agent --apply
    """
    with _client(ctx) as c:
        result = c.promote(_ref_or_cwd(workspace), apply=apply, explain=explain)
    if as_json:
        _print_json(result)
        return
    for line in display.promote_lines(result):
        click.echo(line)


@cli.command("reindex")
@_workspace_option(all_by_default=True)
@click.option("--force", is_flag=True, help="Rebuild from scratch (safely, in a temporary file).")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until done.")
@click.pass_context
def reindex_cmd(ctx: click.Context, workspace: str | None, force: bool, wait: bool) -> None:
    """Bring the index of one workspace (default: every workspace) up to date.

    Example: memctl reindex -w ~/agent --force
    """
    ref = _ref_or_all(workspace)
    with _client(ctx) as c, _spinner("reindexing"):
        # With --wait the daemon answers when the work is done, however long that takes.
        result = c.reindex(ref, force=force, wait=wait, timeout=None)
    if not wait:
        click.echo("Queued: " + ", ".join(str(n) for n in result.get("queued") or []))
        return
    failed = False
    for report in result.get("workspaces") or []:
        click.echo(display.reindex_line(report))
        for path, message in report.get("errors") or []:
            click.echo(f"error {path or '(index)'}: {message}", err=True)
            failed = True
    if failed:
        ctx.exit(1)


@cli.group("model")
def model_group() -> None:
    """List and download embedding models (runs here, not in the daemon)."""


@model_group.command("list")
@_json_option
@click.pass_context
def model_list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the GGUF models in the model directory.

    Example: memctl model list --json
    """
    from memd.embed.models import list_models  # the daemon's package, only for this command

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
@click.argument("uri")
@click.option("--sha256", default=None, metavar="HEX", help="The expected checksum.")
@click.pass_context
def model_pull_cmd(ctx: click.Context, uri: str, sha256: str | None) -> None:
    """Download the model URI (hf:owner/repo/file.gguf or https://…) into the model directory.

    Example: memctl model pull hf:second-state/All-MiniLM-L6-v2-Embedding-GGUF/all-MiniLM-L6-v2-Q8_0.gguf
    """
    from memd.embed.models import progress_bar, pull  # the daemon's package, only for this command

    with _errors(ctx):
        path = pull(uri, user_dirs().models, sha256=sha256, progress=progress_bar())
    click.echo(str(path))


@cli.command("doctor")
@_json_option
@click.option("--no-model", is_flag=True, help="Read the model's header only; do not load it.")
@click.pass_context
def doctor_cmd(ctx: click.Context, as_json: bool, no_model: bool) -> None:
    """Check sqlite-vec, the model, keys, the socket, watches, disk and the service.

    Exits 1 when a check fails (warnings exit 0). Example: memctl doctor --json
    """
    from memd import doctor  # the daemon's package, only for this command

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


@cli.command("mcp")
@_workspace_option()
@click.pass_context
def mcp_cmd(ctx: click.Context, workspace: str | None) -> None:
    """Serve the workspace's memory to an MCP client over stdio (memory_search/get/append).

    Example: memctl mcp -w ~/agent   (as an MCP client's server command)
    """
    try:
        from memd import mcp_server  # the daemon's package and the MCP SDK, only for this command
    except ImportError as exc:
        raise click.ClickException(
            f"memctl mcp needs the MCP SDK ({exc}); install it with: pip install 'memd[mcp]'"
        ) from None
    settings: _Settings = ctx.obj
    mcp_server.run(
        _ref_or_cwd(workspace), settings.socket, settings.identity, timeout=settings.timeout
    )


@cli.group("service")
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
    from memd import servicefiles  # the daemon's package, only for this command

    try:
        lines = servicefiles.install(dry_run=dry_run, force=force)
    except servicefiles.ServiceError as exc:
        _service_failure(exc)
        ctx.exit(1)
    for line in lines:
        click.echo(line)


@service_group.command("uninstall")
@click.option("--dry-run", is_flag=True, help="Show what would be done; change nothing.")
@click.pass_context
def service_uninstall_cmd(ctx: click.Context, dry_run: bool) -> None:
    """Stop and disable memd, and remove its service file.

    Example: memctl service uninstall
    """
    from memd import servicefiles  # the daemon's package, only for this command

    try:
        lines = servicefiles.uninstall(dry_run=dry_run)
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
    from memd import servicefiles  # the daemon's package, only for this command

    try:
        info = servicefiles.status()
    except servicefiles.ServiceError as exc:
        _service_failure(exc)
        ctx.exit(1)
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
        elif info["manager"] == "launchd" and info["available"]:
            loaded = (info["state"] or "unknown") if info["loaded"] else "not loaded"
            pid = f", pid {info['pid']}" if info["pid"] else ""
            click.echo(f"state: {loaded}{pid}; logs: {info['log']}")
        running = _style("running", "green") if info["running"] else _style("not running", "red")
        click.echo(f"memd: {running}")
    if not info["available"]:
        click.echo(f"Error: {info.get('reason')}", err=True)
        ctx.exit(1)


def main() -> None:
    """Run memctl."""
    cli(prog_name="memctl")
