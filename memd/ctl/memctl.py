"""The ``memctl`` command: talk to the running memd daemon and format what it says.

memctl status
memctl workspace add ~/agent --name agent
memctl search "when is the launch?" -w agent
memctl get memory/2026-03-01.md -w agent --from 10 --lines 20
echo "- launch moved to May" | memctl append - -w agent
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TypeVar

import click

from memd.ctl import display
from memd.ctl.admin import doctor_cmd, mcp_cmd, model_group, service_group
from memd.ctl.common import (
    EXIT_NOT_RUNNING,
    _client,
    _json_option,
    _print_json,
    _ref,
    _ref_or_all,
    _ref_or_cwd,
    _Settings,
    _spinner,
    _style,
    _workspace_option,
)

__all__ = ["EXIT_NOT_RUNNING", "cli", "main"]


T = TypeVar("T")


def _shown(value: T) -> T:
    """What memory files say, with control characters escaped when stdout is a terminal
    (memctl's own colours are added after this, so they survive)."""
    if not sys.stdout.isatty():
        return value
    if isinstance(value, str):
        return display.terminal_safe(value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [_shown(v) for v in value]  # type: ignore[return-value]
    return value


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
    for line in display.status_lines(_shown(result), time.time(), _style):
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
    result = _shown(result)
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
    text = _shown(str(result.get("text") or ""))
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


def main() -> None:
    """Run memctl."""
    cli(prog_name="memctl")


# The administrative commands live in memctl_admin (which, like this module, imports memctl_common).
cli.add_command(model_group)
cli.add_command(doctor_cmd)
cli.add_command(mcp_cmd)
cli.add_command(service_group)
