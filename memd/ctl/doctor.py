"""``memctl doctor``: check what memd needs and name the cause (and the fix) of each problem.

Every check runs on its own and turns any exception into a ``fail`` naming it, so the doctor
itself never crashes. API keys are only ever reported as "set" or "missing", never printed.
Over 400 lines: one short function per check, listed in the order they run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memd.config import Config
from memd.dist import install_hint
from memd.embed.models import RECOMMENDED_MODEL_URI
from memd_client.errors import ConfigError

__all__ = ["Check", "Status", "diagnose", "run_checks"]

Status = Literal["ok", "warn", "fail", "skip"]

SQLITE_VEC_ENV = "MEMD_SQLITE_VEC_PATH"
"""An explicit sqlite-vec library for the extension check (default: the sqlite-vec package's)."""

DEFAULT_MODEL_URI = RECOMMENDED_MODEL_URI
LOW_DISK_BYTES = 500 * 1024 * 1024
LOW_DISK_FRACTION = 0.05
FULL_DISK_BYTES = 50 * 1024 * 1024
_INOTIFY = Path("/proc/sys/fs/inotify")


@dataclass
class Check:
    """The outcome of one check: what was found (``detail``) and what to do about it (``fix``)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None


def diagnose(
    *,
    socket: Path | None = None,
    sqlite_vec_path: str | None = None,
    load_model: bool = True,
    env: Mapping[str, str] | None = None,
) -> list[Check]:
    """Load the configuration (reporting a bad one as a check of its own) and run every check."""
    from memd_client.paths import user_dirs

    env = os.environ if env is None else env
    try:
        config = Config.load(env=env)
        if "is not read" in config.source:
            first = Check("config", "warn", config.source, f"move it to {config.config_file}")
        else:
            first = Check("config", "ok", config.source)
    except ConfigError as exc:
        config = Config(dirs=user_dirs(env))
        first = Check(
            "config",
            "fail",
            f"{exc}; the other checks use the defaults",
            "correct the file or the MEMD_* variable named above",
        )
    except Exception as exc:  # never crash: a broken config is one more finding
        config = Config(dirs=user_dirs(env))
        first = Check("config", "fail", _describe(exc), None)
    return [
        first,
        *run_checks(config, socket=socket, sqlite_vec_path=sqlite_vec_path, load_model=load_model),
    ]


def run_checks(
    config: Config,
    *,
    socket: Path | None = None,
    sqlite_vec_path: str | None = None,
    load_model: bool = True,
) -> list[Check]:
    """Run every check against ``config``; each failure names its cause, nothing raises."""
    if sqlite_vec_path is None:
        sqlite_vec_path = os.environ.get(SQLITE_VEC_ENV) or None
    if socket is None:
        socket = _guarded_socket_path()
    asked: dict[str, tuple[Check, dict[str, Any] | None]] = {}

    def ask() -> tuple[Check, dict[str, Any] | None]:
        """The running daemon's answer, asked once: the model check says what it serves."""
        if "daemon" not in asked:
            asked["daemon"] = check_daemon(socket)
        return asked["daemon"]

    status_box: list[dict[str, Any] | None] = [None]

    def daemon() -> Check:
        check, status_box[0] = ask()
        return check

    def model() -> Check:
        try:
            status = ask()[1]
        except Exception:  # the daemon check reports it; judge the model from here
            status = None
        return check_model(config, load_model=load_model, status=status)

    checks: list[tuple[str, Callable[[], Check]]] = [
        ("sqlite-vec", lambda: check_sqlite_vec(config, sqlite_vec_path)),
        ("model", model),
        ("api keys", lambda: check_keys(config)),
        ("socket directory", lambda: check_socket_dir(socket)),
        ("private state", lambda: check_private_state(config)),
        ("daemon", daemon),
        ("workspaces", lambda: check_workspaces(status_box[0])),
        ("inotify", lambda: check_inotify(config, status_box[0])),
        ("disk space", lambda: check_disk(config)),
        ("service", check_service),
    ]
    return [_guard(name, fn) for name, fn in checks]


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:
        detail = _describe(exc)
        if name == "api keys":  # belt and braces: mask anything shaped like a token
            from memd.embed.secrets import redact

            detail = redact(detail)
        return Check(name, "fail", f"the check itself failed: {detail}", None)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _guarded_socket_path() -> Path | None:
    from memd_client.paths import socket_path

    try:
        return socket_path()
    except Exception:  # reported by the socket check as "unknown"
        return None


# -- sqlite-vec -----------------------------------------------------------------------------------


def check_sqlite_vec(config: Config, path: str | None = None) -> Check:
    """Load sqlite-vec (from ``path``, else the package's library) and ask for its version."""
    name = "sqlite-vec"
    if path is None:
        if not config.index.sqlite_vec:
            return Check(name, "skip", "not used (index.sqlite_vec = false: the in-memory sketch)")
        try:
            import sqlite_vec
        except ImportError as exc:
            return Check(
                name,
                "fail",
                f"the sqlite-vec package is not installed ({exc}); vectors fall back to a scan",
                "pip install sqlite-vec (or set index.sqlite_vec = false)",
            )
        path = str(sqlite_vec.loadable_path())
        fix = "pip install --force-reinstall sqlite-vec (or set index.sqlite_vec = false)"
    else:
        fix = f"point {SQLITE_VEC_ENV} at a loadable sqlite-vec library, or unset it"
    import apsw

    conn = apsw.Connection(":memory:")
    try:
        conn.enable_load_extension(True)
        conn.load_extension(path)
        conn.enable_load_extension(False)
        row = conn.execute("SELECT vec_version()").fetchone()
    except apsw.Error as exc:
        return Check(name, "fail", f"cannot load sqlite-vec from {path}: {exc}", fix)
    finally:
        conn.close()
    version = str(row[0]) if row else "?"
    return Check(
        name, "ok", f"loads, version {version} ({path}; SQLite {apsw.sqlite_lib_version()})"
    )


# -- the local model --------------------------------------------------------------------------


def check_model(
    config: Config, *, load_model: bool = True, status: Mapping[str, Any] | None = None
) -> Check:
    """Say what the running daemon embeds with (``status``: its reply), or else find the local
    GGUF model, read its header, and (``load_model``) embed one query with it."""
    from memd.embed.gguf import GGUFError, read_metadata

    name = "model"
    served = _served(config, status)
    if served is not None:
        return served
    emb = config.embedding
    wanted = {emb.provider, emb.fallback}
    required = "local" in wanted
    if not required and emb.provider != "auto":
        return Check(name, "skip", f"provider {emb.provider} does not use a local model")
    pull = f"memctl model pull {DEFAULT_MODEL_URI}"
    if emb.model_path:
        path = Path(emb.model_path).expanduser()
        where = "embedding.model_path / MEMD_LOCAL_MODEL"
    else:
        from memd.embed.models import find_default_model

        found = find_default_model(config.dirs.models)
        if found is None:
            detail = (
                f"no model configured (embedding.model_path or MEMD_LOCAL_MODEL) "
                f"and none in {config.dirs.models}"
            )
            if required:
                return Check(name, "fail", detail, pull)
            return Check(name, "warn", detail + ": remote or keyword-only search", pull)
        path, where = found, f"the newest model in {config.dirs.models}"
    fix_path = f"{pull}, or set {where} to an existing GGUF file"
    if not path.exists():
        return Check(name, "fail", f"model file {path} does not exist", fix_path)
    if not path.is_file():
        return Check(name, "fail", f"model path {path} is not a regular file", fix_path)
    try:
        meta = read_metadata(path)
    except GGUFError as exc:
        return Check(name, "fail", f"{exc} (damaged or not a model)", f"re-download it: {pull}")
    except OSError as exc:
        return Check(name, "fail", f"cannot read {path}: {exc.strerror or exc}", None)
    arch = str(meta.get("general.architecture", ""))
    dims = meta.get(f"{arch}.embedding_length")
    if not isinstance(dims, int) or dims <= 0:
        return Check(
            name, "fail", f"{path.name} has no embedding length in its GGUF header", fix_path
        )
    if not load_model:
        return Check(name, "ok", f"{path}: GGUF header says {dims} dims (not loaded: --no-model)")
    if importlib.util.find_spec("llama_cpp") is None:
        detail = f"{path}: {dims} dims, but llama-cpp-python is not installed"
        return Check(name, "fail" if required else "warn", detail, install_hint("local"))
    from memd.embed.process import ProcessEmbedder
    from memd_client.errors import ProviderUnavailable

    # A throwaway worker process, remembering nothing: what crashes and what works, as of now.
    embedder = ProcessEmbedder(
        path,
        threads=emb.threads,
        batch_size=emb.batch_size,
        query_prefix=emb.query_prefix or None,
        document_prefix=emb.document_prefix or None,
        timeout=emb.timeout_seconds,
    )
    quiet = logging.getLogger("memd.embed.process")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the check's own line says what crashed
    try:
        vector = embedder.embed_query("ping")
    except ProviderUnavailable as exc:
        fix = (
            "the model crashes llama.cpp on this CPU: try another model or a newer "
            "llama-cpp-python, or use a remote provider"
            if embedder.restarts
            else f"re-download it: {pull}"
        )
        return Check(name, "fail", str(exc), fix)
    finally:
        quiet.setLevel(level)
        embedder.close()
    got = int(vector.shape[-1])
    if got != dims:
        return Check(name, "fail", f"{path.name} embeds {got} dims, its header says {dims}", None)
    if embedder.restarts:
        crashed = "; ".join(embedder.crashes)
        return Check(
            name,
            "warn",
            f"{path} works in a worker in {embedder.mode.label} ({got} dims); it crashed with "
            f"{crashed}. The daemon remembers the working mode for this CPU.",
            "nothing to do; a newer llama-cpp-python may fix the default mode",
        )
    return Check(name, "ok", f"{path} loads in a worker process: {got} dims")


def _served(config: Config, status: Mapping[str, Any] | None) -> Check | None:
    """What the running memd embeds with, as the model check: the daemon, not this shell,
    decides (its environment and its model directory may differ). None without a daemon (or
    one too old to say): the model is then judged from here."""
    from memd.ctl.display import model_pull_text
    from memd.embed.download import OFFLINE_ROUTES
    from memd.embed.models import find_default_model

    name = "model"
    daemon = (status or {}).get("daemon") or {}
    embedder = daemon.get("embedder")
    if not embedder:
        return None
    who = f"memd (pid {daemon.get('pid')})"
    active, model = embedder.get("active"), embedder.get("model")
    if active not in (None, "none"):
        return Check(name, "ok", f"{who} embeds with {active} {model}, {embedder.get('dims')} dims")
    pull = daemon.get("model_pull") or {}
    if pull.get("state") in ("downloading", "loading"):
        return Check(name, "ok", f"{who}: {model_pull_text(pull)}")
    fix = f"memctl model pull (the recommended model); {OFFLINE_ROUTES}; then restart memd"
    if pull.get("state") == "failed":
        text = model_pull_text(pull, time.time())
        return Check(name, "warn", f"{who} searches by keyword: {text}", fix)
    here = Path(config.embedding.model_path).expanduser() if config.embedding.model_path else None
    here = here or find_default_model(config.dirs.models)
    if here is not None:
        return Check(
            name,
            "warn",
            f"{who} searches by keyword only ({embedder.get('reason') or 'no model'}), though "
            f"this shell would use {here}",
            "restart memd from this shell (or `memctl service install` again: it carries "
            "MEMD_* settings into the service)",
        )
    return Check(
        name,
        "warn",
        f"{who} searches by keyword only: {embedder.get('reason') or 'no model'}",
        fix,
    )


# -- provider keys ----------------------------------------------------------------------------


def check_keys(config: Config, env: Mapping[str, str] | None = None) -> Check:
    """Say which remote providers have a key ("set" / "missing"); never print a key."""
    from memd.embed.providers import PROVIDERS
    from memd.embed.secrets import KEY_VARIABLES, load_api_key
    from memd.embed.select import REMOTE_ORDER

    name = "api keys"
    env = os.environ if env is None else env
    emb = config.embedding
    configured = [p for p in (emb.provider, emb.fallback) if p in PROVIDERS]
    if emb.api_key_file:
        # A key file serves whichever remote provider is used: check it once.
        try:
            load_api_key(
                configured[0] if configured else "openai", env=env, key_file=emb.api_key_file
            )
        except ConfigError as exc:
            return Check(
                name, "fail", f"key file refused: {exc}", _key_file_fix(exc, emb.api_key_file)
            )
        return Check(name, "ok", f"key file {emb.api_key_file}: set")
    providers = list(dict.fromkeys([*REMOTE_ORDER, *configured]))
    parts: list[str] = []
    problems: list[str] = []
    fixes: list[str] = []
    for provider in providers:
        try:
            key = load_api_key(provider, env=env)
        except ConfigError as exc:
            parts.append(f"{provider} refused")
            problems.append(str(exc))
            fixes.append(f"re-set {' or '.join(KEY_VARIABLES.get(provider, ()))} without spaces")
            continue
        needs = PROVIDERS[provider].needs_key
        if key is not None:
            parts.append(f"{provider} set")
        elif not needs:
            parts.append(f"{provider} not needed")
        else:
            parts.append(f"{provider} missing")
            if provider in configured:
                where = " or ".join([*KEY_VARIABLES.get(provider, ()), "embedding.api_key_file"])
                problems.append(f"provider {provider} is configured but has no key")
                fixes.append(f"set {where}")
    detail = ", ".join(parts)
    if problems:
        return Check(name, "fail", f"{detail}: {'; '.join(problems)}", "; ".join(fixes))
    return Check(name, "ok", detail)


def _key_file_fix(exc: ConfigError, path: str) -> str:
    text = str(exc)
    if "run: chmod" in text:
        return text[text.index("run: chmod") + len("run: ") :]
    if "does not exist" in text:
        return f"create {path} with the key (mode 0600), or unset embedding.api_key_file"
    return f"chmod 600 {path} and keep only the key in it"


# -- the socket directory ---------------------------------------------------------------------


def check_private_state(config: Config) -> Check:
    """Indexes and their WAL hold the text of every memory file: no other user may read them."""
    from memd.private import not_private

    name = "private state"
    state = config.state_dir
    if not state.exists():
        return Check(name, "ok", f"{state} does not exist yet (memd creates it 0700)")
    exposed = not_private(state)
    if not exposed:
        return Check(name, "ok", f"{state}: directories 0700, files 0600")
    shown = ", ".join(
        f"{p.relative_to(state) if p != state else '.'} {stat.S_IMODE(os.lstat(p).st_mode):04o}"
        for p in exposed[:5]
    )
    more = f" and {len(exposed) - 5} more" if len(exposed) > 5 else ""
    return Check(
        name,
        "fail",
        f"{len(exposed)} item(s) in {state} are open to other users: {shown}{more}",
        f"start memd (it tightens them), or: chmod -R go-rwx {state}",
    )


def check_socket_dir(socket: Path | None) -> Check:
    """The socket's directory must be a real directory, owned by the user, mode 0700."""
    name = "socket directory"
    if socket is None:
        return Check(
            name, "fail", "cannot tell where the socket is", "set MEMD_SOCKET or MEMD_HOME"
        )
    directory = socket.parent
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return Check(name, "ok", f"{directory} does not exist yet; memd run creates it 0700")
    if stat.S_ISLNK(st.st_mode):
        return Check(
            name, "fail", f"{directory} is a symlink", f"rm {directory}; memd run creates it 0700"
        )
    if not stat.S_ISDIR(st.st_mode):
        return Check(name, "fail", f"{directory} is not a directory", f"remove {directory}")
    if st.st_uid != os.getuid():
        return Check(
            name,
            "fail",
            f"socket directory {directory} belongs to uid {st.st_uid}, not to you",
            "set MEMD_SOCKET to a path in a directory of your own",
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return Check(
            name,
            "fail",
            f"socket directory {directory} is not private (mode {mode:04o})",
            f"chmod 700 {directory}",
        )
    return Check(name, "ok", f"{directory} is yours, mode {mode:04o}")


# -- the daemon -------------------------------------------------------------------------------


def check_daemon(socket: Path | None) -> tuple[Check, dict[str, Any] | None]:
    """Ask the daemon for its status; not running is a warning, not a failure."""
    from memd_client.connection import Client, DaemonNotRunning
    from memd_client.errors import MemdError

    name = "daemon"
    try:
        with Client(socket, 10.0, autostart=False) as client:  # the doctor looks, never starts
            status = client.status()
    except DaemonNotRunning as exc:
        from memd_client.autostart import enabled

        if enabled():
            fix = "nothing to do: the next client starts it (or `memctl start` now)"
        else:
            fix = "memd run, or `memctl service install` (MEMD_AUTOSTART is off: clients do not start it)"
        return Check(name, "warn", str(exc) or "memd is not running", fix), None
    except (MemdError, OSError) as exc:
        return Check(
            name, "fail", f"memd does not answer: {exc}", "check `journalctl --user -u memd`"
        ), None
    daemon = status.get("daemon") or {}
    workspaces = status.get("workspaces") or []
    names = ", ".join(str(w.get("workspace")) for w in workspaces) or "none"
    from memd.ctl.display import started_text

    started = f", started {started_text(daemon['started'])}" if daemon.get("started") else ""
    detail = (
        f"running, pid {daemon.get('pid')}, version {daemon.get('version')}{started}; "
        f"{len(workspaces)} workspace(s): {names}"
    )
    errors = [
        f"{w.get('workspace')}: {(w.get('provider') or {}).get('last_error')}"
        for w in workspaces
        if (w.get("provider") or {}).get("last_error")
    ]
    if errors:
        warn = Check(name, "warn", f"{detail}; embedding errors: {'; '.join(errors)}", None)
        return warn, dict(status)
    return Check(name, "ok", detail), dict(status)


def check_workspaces(status: Mapping[str, Any] | None) -> Check:
    """What each workspace's index cannot follow: its directory gone or replaced, the watcher,
    files found but not indexed (too large, transcripts in a format memd does not read)."""
    name = "workspaces"
    if status is None:
        return Check(name, "skip", "memd is not running")
    findings = []
    for w in status.get("workspaces") or []:
        ws = w.get("workspace")
        findings += [f"{ws}: {p}" for p in (w.get("freshness") or {}).get("problems") or []]
        findings += [
            f"{ws}: {s.get('path')} not indexed ({s.get('reason')})"
            for s in w.get("files_skipped") or []
        ]
    if not findings:
        return Check(name, "ok", f"{len(status.get('workspaces') or [])} workspace(s) followed")
    return Check(
        name,
        "warn",
        "; ".join(findings),
        "a transcript must be OpenClaw JSONL (README: Session transcripts); split a file over "
        "index.max_file_bytes or raise the limit; mount or re-add a directory that moved",
    )


# -- inotify ----------------------------------------------------------------------------------


def check_inotify(config: Config, status: Mapping[str, Any] | None, proc: Path = _INOTIFY) -> Check:
    """Compare the directories memd watches with the kernel's per-user inotify limits."""
    name = "inotify"
    if not sys.platform.startswith("linux") or not proc.is_dir():
        return Check(name, "skip", "not Linux (no inotify limits to check)")
    max_watches = int((proc / "max_user_watches").read_text().strip())
    max_instances = int((proc / "max_user_instances").read_text().strip())
    roots = _watched_workspaces(config, status)
    dirs = sum(_count_watches(root, extras) for root, extras in roots.items())
    # Two watches a directory: the watcher's and its change probe's (memd/watch/probe.py),
    # which is an inotify instance of its own per workspace.
    watches = 2 * dirs
    detail = (
        f"{dirs} director{'y' if dirs == 1 else 'ies'} in {len(roots)} workspace(s) "
        f"({watches} watches); "
        f"limits: max_user_watches {max_watches}, max_user_instances {max_instances}"
    )
    watcher_errors = [
        str((w.get("watcher") or {}).get("reason"))
        for w in (status or {}).get("workspaces") or []
        if "inotify" in str((w.get("watcher") or {}).get("reason") or "")
    ]
    want = max(524288, 2 * watches)
    fix_watches = (
        f"sudo sysctl fs.inotify.max_user_watches={want} (persist it in /etc/sysctl.d/60-memd.conf)"
    )
    if watcher_errors:
        return Check(name, "fail", f"{detail}; watcher: {'; '.join(watcher_errors)}", fix_watches)
    if watches >= max_watches:
        return Check(name, "fail", f"{detail}: more directories than watches", fix_watches)
    if len(roots) + 1 >= max_instances:
        return Check(
            name,
            "fail",
            f"{detail}: more workspaces than inotify instances",
            f"sudo sysctl fs.inotify.max_user_instances={max(1024, 2 * len(roots))}",
        )
    if watches > max_watches // 2:
        return Check(
            name,
            "warn",
            f"{detail}: over half the watches (other programs share them)",
            fix_watches,
        )
    return Check(name, "ok", detail)


def _watched_workspaces(
    config: Config, status: Mapping[str, Any] | None
) -> dict[str, tuple[str, ...]]:
    """Workspace roots -> extra paths: the daemon's, the registry's and the config file's."""
    from memd.registry import load_registry

    roots: dict[str, tuple[str, ...]] = {}
    for entry in load_registry(config.state_dir / "workspaces.json"):
        extras = entry.get("extra_paths") or []
        roots[os.path.abspath(entry["path"])] = tuple(str(e) for e in extras)
    for ws in config.workspaces:
        root = os.path.abspath(os.path.expanduser(ws.path))
        roots.setdefault(root, ws.extra_paths)
    for w in (status or {}).get("workspaces") or []:
        if isinstance(w.get("root"), str):
            roots.setdefault(os.path.abspath(w["root"]), ())
    return roots


def _count_watches(root: str, extras: Iterable[str]) -> int:
    """The inotify watches one workspace takes: one per directory watched (recursively)."""
    from memd.watch.layout import WatchLayout

    if not os.path.isdir(root):
        return 0
    total = 0
    for path, recursive in WatchLayout.build(Path(root), list(extras)).desired().items():
        if not recursive:
            total += 1
            continue
        for _dirpath, _dirnames, _files in os.walk(path, followlinks=False):
            total += 1
    return total


# -- disk space -------------------------------------------------------------------------------


def check_disk(config: Config) -> Check:
    """Free space where the indexes live: warn below 500 MB or 5 %, fail below 50 MB."""
    name = "disk space"
    where = config.index_dir
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    used = _tree_bytes(where)
    fraction = usage.free / usage.total if usage.total else 0.0
    detail = (
        f"{_size(usage.free)} free of {_size(usage.total)} ({fraction:.0%}) at {probe}; "
        f"indexes use {_size(used)}"
    )
    fix = f"free space on the file system of {probe} (or move MEMD_HOME / XDG_STATE_HOME)"
    if usage.free < FULL_DISK_BYTES:
        return Check(name, "fail", f"{detail}: index writes will fail", fix)
    if usage.free < LOW_DISK_BYTES or fraction < LOW_DISK_FRACTION:
        return Check(name, "warn", f"{detail}: running low", fix)
    return Check(name, "ok", detail)


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


# -- the service ------------------------------------------------------------------------------


def check_service() -> Check:
    """The systemd user unit's state (informational: not installed is not a failure)."""
    name = "service"
    systemctl = shutil.which("systemctl")
    if not sys.platform.startswith("linux") or systemctl is None:
        return Check(name, "skip", "no systemctl here; run memd yourself or under launchd")
    try:
        proc = subprocess.run(
            [systemctl, "--user", "show", "memd", "--property=LoadState,ActiveState,SubState"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, "skip", f"systemctl --user did not answer: {exc}")
    props = dict(line.partition("=")[::2] for line in proc.stdout.splitlines() if "=" in line)
    if proc.returncode != 0 or "LoadState" not in props:
        why = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()
        return Check(name, "skip", f"no systemd user manager: {why[0] if why else '?'}")
    load, active = props.get("LoadState", ""), props.get("ActiveState", "")
    sub = props.get("SubState", "")
    if load == "not-found":
        return Check(name, "skip", "memd.service is not installed", "memctl service install")
    if active == "failed":
        return Check(
            name,
            "fail",
            f"memd.service has failed ({sub})",
            "journalctl --user -u memd -e; then systemctl --user restart memd",
        )
    if active == "active":
        return Check(name, "ok", f"memd.service is active ({sub})")
    return Check(
        name, "ok", f"memd.service is installed, {active or 'unknown'} ({sub or load})", None
    )
