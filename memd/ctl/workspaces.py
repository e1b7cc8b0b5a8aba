"""memctl's workspace commands: register, unregister and list workspaces (over the socket)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from memd.ctl.common import _client, _json_option, _print_json, _ref

__all__ = ["workspace_group"]


@click.group("workspace")
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
@click.option(
    "--sessions-agent",
    "owner",
    default=None,
    metavar="ID",
    help="The agent whose transcripts --sessions-dir holds (default: the workspace name).",
)
@_json_option
@click.pass_context
def workspace_add_cmd(
    ctx: click.Context,
    path: Path,
    name: str | None,
    extra: tuple[Path, ...],
    sessions_dir: Path | None,
    owner: str | None,
    as_json: bool,
) -> None:
    """Register the directory PATH as a workspace; for one already registered, the options
    given replace its settings (the others stay).

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
    if as_json:
        _print_json(result)
        return
    if result.get("added", True):
        click.echo(f"Added {result.get('name')}: {result.get('path')}")
    elif result.get("updated"):
        click.echo(f"Updated {result.get('name')}: {', '.join(result['updated'])}")
    else:
        click.echo(f"{result.get('name')} is registered with these settings already")
    _settings(result, path=not result.get("added", True))


def _settings(ws: Mapping[str, Any], *, path: bool = True) -> None:
    if path:
        click.echo(f"  path: {ws.get('path')}")
    for p in ws.get("extra_paths") or []:
        click.echo(f"  extra: {p}")
    if ws.get("sessions_dir"):
        click.echo(f"  sessions: {ws['sessions_dir']} (agent {ws.get('agent_id')})")


@workspace_group.command("show")
@click.argument("workspace")
@_json_option
@click.pass_context
def workspace_show_cmd(ctx: click.Context, workspace: str, as_json: bool) -> None:
    """Print the settings of WORKSPACE (a name or a directory).

    Example: memctl workspace show agent
    """
    ref = _ref(workspace)
    with _client(ctx) as c:
        found = [
            ws
            for ws in c.workspace_list()["workspaces"]
            if ref in (ws.get("name"), ws.get("path"))
            or Path(ref).expanduser().resolve() == Path(str(ws.get("path")))
        ]
    if not found:
        message = f"no workspace {workspace!r} is registered"
        if as_json:
            _print_json({"error": {"code": 4, "kind": "UNKNOWN_WORKSPACE", "message": message}})
            ctx.exit(1)
        raise click.ClickException(message)
    if as_json:
        _print_json(found[0])
        return
    click.echo(str(found[0].get("name")))
    _settings(found[0])


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
