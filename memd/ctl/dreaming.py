"""memctl's dreaming commands: ``memctl promote`` and ``memctl dream``.

They ask the daemon to rank, dream and promote (memd.dreams runs there), then print what it
says. ``memd.ctl.memctl`` imports this module only when one of them runs, so the everyday
commands start without it (and without the dream diary's line format that ``dream`` prints).
"""

from __future__ import annotations

import click

from memd.ctl import display
from memd.ctl.common import _client, _json_option, _print_json, _ref_or_cwd, _workspace_option
from memd.ctl.reads import shown as _shown

__all__ = ["dream_cmd", "promote_cmd"]


@click.command("promote")
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
    unknown = explain is not None and result.get("explain") is None
    if as_json:
        _print_json(result)
        ctx.exit(1 if unknown else 0)
    for line in display.promote_lines({**result, "explain_key": explain}):
        click.echo(line)
    if unknown:
        click.echo("`memctl promote` lists the keys --explain takes.", err=True)
        ctx.exit(1)


@click.command("dream")
@_workspace_option()
@click.option(
    "--phase",
    type=click.Choice(["light", "rem", "deep", "all"]),
    default="all",
    show_default=True,
    help="Run one phase only.",
)
@click.option("--apply", is_flag=True, help="Write: recall store, MEMORY.md and DREAMS.md.")
@_json_option
@click.pass_context
def dream_cmd(
    ctx: click.Context, workspace: str | None, phase: str, apply: bool, as_json: bool
) -> None:
    """Dream: Light reads the recent daily notes, REM finds themes and lasting truths, Deep
    promotes into MEMORY.md. Without --apply, shows what a run would do and writes nothing.

    Example: memctl dream -w ~/agent --apply
    """
    with _client(ctx) as c:
        result = c.dream(_ref_or_cwd(workspace), phase=phase, apply=apply)
    if as_json:
        _print_json(result)
        return
    from memd.dreams.diary import diary_lines  # only this command needs it: memctl starts faster

    if not apply:
        click.echo("Preview: nothing written (--apply writes).")
    click.echo(f"Similar memories compared by {result['similarity']}.")
    for line in diary_lines(result):
        click.echo(_shown(line))
    if withheld := result.get("withheld_from_transcripts"):
        click.echo(f"{withheld} items from session transcripts not shown (--agent-id shows them).")
    if apply:
        click.echo("Written to DREAMS.md.")
