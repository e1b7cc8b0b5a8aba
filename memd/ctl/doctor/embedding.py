"""The checks of what memd embeds and searches vectors with: sqlite-vec, the local model (or
what the running daemon serves), and the remote providers' keys.

Its own module: these checks load libraries and models and read key files, the others look at
the machine and at the running memd (memd.ctl.doctor.system).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memd.config import Config
from memd.ctl.doctor.check import Check
from memd.dist import install_hint
from memd.embed.models import RECOMMENDED_MODEL_URI
from memd_client.errors import ConfigError

SQLITE_VEC_ENV = "MEMD_SQLITE_VEC_PATH"
"""An explicit sqlite-vec library for the extension check (default: the sqlite-vec package's)."""

DEFAULT_MODEL_URI = RECOMMENDED_MODEL_URI


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
        from memd.embed.select import missing_model

        return Check(name, "fail", missing_model(path), fix_path)
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
    from memd.ctl.display_status import model_pull_text
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
