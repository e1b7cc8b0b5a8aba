"""The ``memd`` command: index, search and read a workspace in-process.

memd index ~/agent            # build or refresh the index
memd search ~/agent "when is the launch?"
memd get ~/agent memory/2026-03-01.md --from 10 --lines 20
memd status ~/agent --json
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from memd import __version__
from memd.config import Config
from memd.logs import configure_logging
from memd.private import keep_private, make_private, private_directory
from memd_client.errors import MemdError

if TYPE_CHECKING:  # imported by the commands that use it: `memd run` takes its lock first
    from memd.service import MemoryService

__all__ = ["main"]


@contextmanager
def _service(ctx: click.Context) -> Iterator[MemoryService]:
    from memd.service import MemoryService

    try:
        config = Config.load(ctx.obj.get("config"))
        # The one-shot commands write the same state as the daemon: the same rules hold.
        private_directory(config.state_dir, "state directory")
        make_private(config.state_dir)
        service = MemoryService(config)
    except MemdError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield service
    except MemdError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        service.close()


def _open(service: MemoryService, workspace: str) -> str:
    """The one-shot commands work on the directory they are given, registered or not."""
    return service.registry.add(Path(workspace).resolve()).name


def _progress(phase: str, done: int, total: int) -> None:
    if sys.stderr.isatty() and (done == total or done % 25 == 0):
        click.echo(f"\r{phase}: {done}/{total}", err=True, nl=done == total)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memd")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (default: $MEMD_CONFIG, else $MEMD_HOME/config/config.toml, else "
    "$XDG_CONFIG_HOME/memd/config.toml).",
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, log_level: str) -> None:
    """memd: a local memory service for AI agents."""
    configure_logging(log_level)
    ctx.ensure_object(dict)
    ctx.obj["config"] = config_path
    ctx.obj["log_level"] = log_level


@cli.command("run")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="MEMD_SOCKET",
    help="Socket path (default: $XDG_RUNTIME_DIR/memd/memd.sock).",
)
@click.option(
    "--idle-exit",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    envvar="MEMD_IDLE_EXIT",
    metavar="SECONDS",
    help="When socket-activated: stop after this long without clients or work "
    "(the service manager starts memd again on the next connection).",
)
@click.pass_context
def run_cmd(ctx: click.Context, socket_path: str | None, idle_exit: float | None) -> None:
    """Run the daemon in the foreground (what the systemd/launchd service starts).

    Given a listening socket by systemd (LISTEN_FDS) or launchd (Sockets), it serves on that.
    Exit codes: 0 clean stop, 3 start-up failure, 4 already running.
    """
    start_lock = _start_lock(socket_path)  # before the imports that take a second or two

    from memd.blas import limit_blas_threads
    from memd.daemon import EXIT_STARTUP_FAILURE, Daemon
    from memd.heap import configure_allocator

    configure_allocator()  # this process is the daemon: before any of its threads allocate
    limit_blas_threads()
    if ctx.obj.get("log_level") == "warning":
        configure_logging("info")
    try:
        config = Config.load(ctx.obj.get("config"))
    except MemdError as exc:
        click.echo(f"Error: {exc}", err=True)
        ctx.exit(EXIT_STARTUP_FAILURE)
    daemon = Daemon(
        config,
        socket=Path(socket_path) if socket_path else None,
        idle_exit=idle_exit,
        start_lock=start_lock,
    )
    ctx.exit(daemon.run())


def _start_lock(socket_path: str | None) -> int | None:
    """Hold the start lock beside the socket while this memd starts, so a client that finds
    nothing listening meanwhile waits for it rather than starting another (see
    memd_client.autostart); None when a client started this memd (it holds the lock) or the
    lock is not to be had (the daemon's own checks then say what is wrong)."""
    if os.environ.get("MEMD_STARTED_BY"):
        return None
    from memd_client.autostart import LOCK_NAME
    from memd_client.paths import socket_path as default_socket

    path = Path(socket_path) if socket_path else default_socket()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(
            path.parent / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@cli.command("index")
@click.argument("workspace", type=click.Path(file_okay=False, exists=True))
@click.option("--force", is_flag=True, help="Rebuild from scratch (safely, in a temporary file).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def index_cmd(ctx: click.Context, workspace: str, force: bool, as_json: bool) -> None:
    """Index WORKSPACE (only what changed, unless --force)."""
    with _service(ctx) as service:
        report = service.sync(_open(service, workspace), force=force, progress=_progress)
        if as_json:
            click.echo(json.dumps(report.__dict__, default=str, indent=2))
        else:
            click.echo(
                f"{report.scanned} files: {report.indexed} indexed, {report.unchanged} unchanged, "
                f"{report.removed} removed; {report.chunks_written} chunks written, "
                f"{report.embedded} embedded, {report.pending_files} pending "
                f"({report.seconds:.2f}s)" + (" [rebuilt]" if report.rebuilt else "")
            )
            for path, why in report.skipped:
                click.echo(f"skipped {path}: {why}", err=True)
        for path, why in report.errors:
            click.echo(f"error {path or '(index)'}: {why}", err=True)
        if report.errors:
            ctx.exit(1)


@cli.command("search")
@click.argument("workspace", type=click.Path(file_okay=False, exists=True))
@click.argument("query")
@click.option("-n", "--max-results", type=int, default=None)
@click.option("--min-score", type=float, default=None)
@click.option("--mode", type=click.Choice(["hybrid", "keyword", "vector"]), default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def search_cmd(
    ctx: click.Context,
    workspace: str,
    query: str,
    max_results: int | None,
    min_score: float | None,
    mode: str | None,
    as_json: bool,
) -> None:
    """Search WORKSPACE for QUERY."""
    with _service(ctx) as service:
        outcome = service.search(
            _open(service, workspace),
            query,
            max_results=max_results,
            min_score=min_score,
            mode=mode,
        )
        if as_json:
            payload: dict[str, Any] = {
                "results": [h.to_dict() for h in outcome.results],
                "mode": outcome.mode,
                "provider": outcome.provider,
                "model": outcome.model,
                "note": outcome.note,
            }
            click.echo(json.dumps(payload, ensure_ascii=False, indent=2))
            return
        if outcome.note:
            click.echo(f"note: {outcome.note}", err=True)
        for hit in outcome.results:
            click.echo(f"{hit.score:.3f}  {hit.path}#L{hit.start_line}-L{hit.end_line}")
            for line in hit.snippet.splitlines()[:3]:
                click.echo(f"    {line[:120]}")


@cli.command("get")
@click.argument("workspace", type=click.Path(file_okay=False, exists=True))
@click.argument("path")
@click.option("--from", "from_line", type=int, default=1, show_default=True)
@click.option("--lines", type=int, default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def get_cmd(
    ctx: click.Context, workspace: str, path: str, from_line: int, lines: int | None, as_json: bool
) -> None:
    """Print lines of a memory file of WORKSPACE."""
    with _service(ctx) as service:
        result = service.get(_open(service, workspace), path, from_line, lines)
        if as_json:
            click.echo(json.dumps(result.__dict__, ensure_ascii=False, indent=2))
        else:
            click.echo(result.text)
            if result.truncated:
                click.echo(f"[more: --from {result.next_from}]", err=True)


@cli.command("status")
@click.argument("workspace", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status_cmd(ctx: click.Context, workspace: str, as_json: bool) -> None:
    """Show how complete and fresh the index of WORKSPACE is."""
    with _service(ctx) as service:
        st = service.status(_open(service, workspace))
        if as_json:
            click.echo(json.dumps(st, indent=2, default=str))
            return
        p, v = st["provider"], st["vector_store"]
        click.echo(f"Workspace: {st['root']}")
        click.echo(f"Index: {st['index_path']} ({st['index_bytes']} bytes)")
        click.echo(
            f"Indexed: {st['files_indexed']}/{st['files_on_disk']} files · {st['chunks']} chunks"
            f" · {st['files_pending']} pending · {st['files_stale']} stale"
        )
        click.echo(f"Dirty: {'yes' if st['dirty'] else 'no'}")
        click.echo(f"Provider: {p['active']} (requested: {p['requested']}) model {p['model']}")
        for skipped in p["skipped"]:
            click.echo(f"  skipped {skipped['provider']}: {skipped['reason']}")
        click.echo(
            f"Identity: {st['identity']['state']}"
            + (f" ({st['identity']['reason']})" if st["identity"]["reason"] else "")
        )
        click.echo(
            f"Vectors: {v['kind']} · {st['vectors']} rows"
            + (
                f" · sqlite-vec {v['sqlite_vec_version']}"
                if v["sqlite_vec"]
                else " · in-memory sketch"
                if v["kind"] == "plain"
                else f" · unreadable ({v['reason']})"
            )
        )
        click.echo(f"Embedding cache: {st['cache_entries']} entries")
        for path_reason in st["files_skipped"]:
            click.echo(f"  skipped {path_reason['path']}: {path_reason['reason']}")
        for path, err in st["file_errors"].items():
            click.echo(f"  error {path}: {err}")


@cli.command("dump")
@click.argument("workspace", type=click.Path(file_okay=False, exists=True))
@click.pass_context
def dump_cmd(ctx: click.Context, workspace: str) -> None:
    """Print the logical content of the index (one JSON row per chunk), for comparisons."""
    with _service(ctx) as service:
        for row in service.dump(_open(service, workspace)):
            click.echo(json.dumps(row))


@cli.command("check-config")
@click.pass_context
def check_config_cmd(ctx: click.Context) -> None:
    """Load the configuration and print it, or name what is wrong with it."""
    try:
        config = Config.load(ctx.obj.get("config"))
    except MemdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"# from {config.source}")
    click.echo(
        json.dumps(
            {k: v for k, v in config.__dict__.items() if k not in ("dirs",)},
            default=lambda o: o.__dict__,
            indent=2,
        )
    )


def main(argv: list[str] | None = None) -> None:
    # Indexes hold the text of every memory file: whatever the shell's umask, what any memd
    # command creates (state, caches, the registry) is its user's alone.
    keep_private()
    cli.main(args=argv, prog_name="memd")
