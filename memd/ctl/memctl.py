"""The ``memctl`` command: talk to the running memd daemon and format what it says.

memctl status
memctl workspace add ~/agent --name agent
memctl search "when is the launch?" -w agent
memctl get memory/2026-03-01.md -w agent --from 10 --lines 20
echo "- launch moved to May" | memctl append - -w agent

The everyday commands are here; the others (workspace, model, doctor, mcp, service, start,
promote, dream) live in modules of their own, imported when one of them runs.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import click

from memd import __version__
from memd.ctl import display, reads
from memd.ctl.common import (
    _client,
    _errors,
    _json_option,
    _print_json,
    _ref_or_all,
    _ref_or_cwd,
    _style,
    _workspace_option,
    with_progress,
)
from memd.ctl.reads import EXIT_NOT_RUNNING
from memd.ctl.reads import Settings as _Settings
from memd.private import keep_private

__all__ = ["EXIT_NOT_RUNNING", "cli", "main"]


_shown = reads.shown


# The commands defined elsewhere, imported when one of them runs: `memctl search` loads the
# client, click and the display, not the daemon code doctor, model, service and mcp run.
_ELSEWHERE = {
    "workspace": "memd.ctl.workspaces:workspace_group",
    "model": "memd.ctl.admin:model_group",
    "promote": "memd.ctl.dreaming:promote_cmd",
    "dream": "memd.ctl.dreaming:dream_cmd",
    "doctor": "memd.ctl.admin:doctor_cmd",
    "mcp": "memd.ctl.admin:mcp_cmd",
    "service": "memd.ctl.admin:service_group",
    "start": "memd.ctl.admin:start_cmd",
}


class _Commands(click.Group):
    """A group whose commands in ``_ELSEWHERE`` are imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_ELSEWHERE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _ELSEWHERE and cmd_name not in self.commands:
            module, _, name = _ELSEWHERE[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memctl")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="memd's home: sets MEMD_HOME for this command (and a memd it starts).",
)
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
    home: Path | None,
    socket_path: Path | None,
    timeout: float,
    agent_id: str | None,
    session_key: str | None,
) -> None:
    """memctl: control and query the memd memory daemon.

    When memd is not running, memctl starts it (MEMD_AUTOSTART=0: it does not).

    Example: memctl search "deploy checklist" -w ~/agent
    """
    if home is not None:
        os.environ["MEMD_HOME"] = str(home.expanduser().absolute())
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
    ctx.exit(reads.status(ctx.obj, workspace, as_json=as_json, echo=click.echo, style=_style))


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
    options = {
        "max_results": max_results,
        "min_score": min_score,
        "mode": mode,
        "wait_ms": wait_ms,
        "sources": sources,
    }
    ctx.exit(
        reads.search(
            ctx.obj, workspace, query, options, as_json=as_json, echo=click.echo, style=_style
        )
    )


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
    ctx.exit(
        reads.get(
            ctx.obj,
            workspace,
            path,
            from_line=from_line,
            lines=lines,
            as_json=as_json,
            echo=click.echo,
        )
    )


@cli.command("append")
@click.argument("text")
@_workspace_option()
@_json_option
@click.pass_context
def append_cmd(ctx: click.Context, text: str, workspace: str | None, as_json: bool) -> None:
    """Append TEXT ("-" reads stdin) to today's memory file; returns once it is searchable.

    Example: echo "- the launch moved to May" | memctl append - -w ~/agent
    """
    if text == "-":
        text = sys.stdin.read()
    ref = _ref_or_cwd(workspace)
    with _client(ctx) as c:
        result = c.append(ref, text)
    if as_json:
        _print_json(result)
        return
    click.echo(
        f"Appended to {result.get('path')}#L{result.get('start_line')}-L{result.get('end_line')}"
    )


@cli.command("context")
@_workspace_option()
@click.option(
    "--max-chars", type=click.IntRange(min=1), default=None, help="Budget (default 12,000)."
)
@_json_option
@click.pass_context
def context_cmd(
    ctx: click.Context, workspace: str | None, max_chars: int | None, as_json: bool
) -> None:
    """Print the session-start context: MEMORY.md, today's and yesterday's logs, with citations.

    It is what an agent host (the OpenClaw plugin) puts in a new session's prompt, under the
    scope rules of the caller (memctl --session-key: a group chat gets no MEMORY.md).

    Example: memctl context -w ~/agent --max-chars 4000
    """
    ref = _ref_or_cwd(workspace)
    with _client(ctx) as c:
        result = c.context(ref, max_chars=max_chars)
    if as_json:
        _print_json(result)
        return
    text = _shown(str(result.get("text") or ""))
    if not text:
        click.echo(f"(no memory for {result.get('date')}: MEMORY.md and the daily logs are empty)")
        return
    click.echo(text)


@cli.command("reindex")
@_workspace_option(all_by_default=True)
@click.option("--force", is_flag=True, help="Rebuild from scratch (safely, in a temporary file).")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until done.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --force: change nothing; say what the rebuild would send to the provider.",
)
@_json_option
@click.pass_context
def reindex_cmd(
    ctx: click.Context,
    workspace: str | None,
    force: bool,
    wait: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Bring the index of one workspace (default: every workspace) up to date.

    While it works, a terminal shows a progress bar (files read, chunks embedded, the rate and
    the time left); with --json, one JSON object per line: progress events, then the result.
    With --force --dry-run nothing changes: it says how many texts and tokens the rebuild
    would send to the embedding provider (what the embedding cache holds is not sent again).

    Example: memctl reindex -w ~/agent --force --dry-run
    """
    ref = _ref_or_all(workspace)
    if dry_run:
        if not force:
            raise click.UsageError("--dry-run estimates a rebuild: use it with --force")
        with _client(ctx) as c:
            estimates = c.reindex(ref, force=True, dry_run=True)["estimates"]
        if as_json:
            _print_json({"estimates": estimates})
            return
        for estimate in estimates:
            for line in display.estimate_lines(estimate):
                click.echo(line)
        return
    try:
        with _errors(ctx):
            # With --wait the daemon answers when the work is done, however long that takes.
            result = with_progress(
                ctx.obj,
                ref,
                lambda c: c.reindex(ref, force=force, wait=wait, timeout=None),
                as_json=as_json,
                show=wait,
            )
    except KeyboardInterrupt:
        # Only the waiting stops: the reindex is memd's, and it goes on.
        click.echo(
            "\nStopped waiting; memd goes on with the reindex (`memctl status` shows how far "
            "it is).",
            err=True,
        )
        ctx.exit(130)
    if as_json:
        click.echo(json.dumps({"event": "done", **result}, ensure_ascii=False, default=str))
        failed = any(r.get("errors") for r in result.get("workspaces") or [])
        ctx.exit(1 if failed else 0)
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
    keep_private()  # models, and the state its doctor and model commands write, stay private
    cli(prog_name="memctl")
