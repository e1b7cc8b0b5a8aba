"""memd's configuration: one frozen dataclass, read from TOML and ``MEMD_*`` variables.

Precedence is explicit argument > environment > file > default. Every key and every bad value is
named in the error, so a typo never silently falls back to a default.
Over 400 lines: one dataclass per section with its bounds, as long as the configuration is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import stat
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from memd_client.errors import ConfigError
from memd_client.paths import Dirs, user_dirs

__all__ = [
    "Config",
    "ScopeRule",
    "SessionsConfig",
    "DreamingConfig",
    "EmbeddingConfig",
    "GetConfig",
    "IndexConfig",
    "SearchConfig",
    "WatchConfig",
    "WorkspaceConfig",
    "refused_directory",
    "refused_extra_path",
]

SearchMode = Literal["hybrid", "keyword", "vector"]
ProviderName = Literal[
    "auto",
    "local",
    "openai",
    "gemini",
    "voyage",
    "mistral",
    "ollama",
    "openai-compatible",
    "fake",
    "none",
]


@dataclass(frozen=True)
class IndexConfig:
    """How files become chunks and rows."""

    chunk_tokens: int = 400
    chunk_overlap: int = 80
    max_file_bytes: int = 10 * 1024 * 1024
    # Redact secrets (API keys, tokens, passwords, private keys) before text is indexed.
    redact: bool = True
    # Keep vectors in sqlite-vec and search them with its exact scan (110 ms at 100,000 chunks).
    # False (the default): a plain table, searched through an in-memory sketch of every vector
    # (memd/index/sketch.py; 15 ms at 100,000 chunks, the same top ten).
    sqlite_vec: bool = False
    # Index DREAMS.md, the dream diary (it is written for people to read, not to be searched).
    diary: bool = False
    # A vector for each line of a chunk besides the chunk's own (memd/index/chunk.py), whatever
    # the provider: with a paid API they cost 80-100% more tokens (cents a year of notes) and
    # lift hybrid R@1 on LoCoMo from below keyword search to above it (docs/benchmarks.md).
    # False halves what a first index sends.
    line_vectors: bool = True

    def validate(self) -> None:
        _check(1 <= self.chunk_tokens <= 8192, "index.chunk_tokens", "must be from 1 to 8192")
        _check(
            0 <= self.chunk_overlap < self.chunk_tokens,
            "index.chunk_overlap",
            "must be at least 0 and below index.chunk_tokens",
        )
        _check(
            1 <= self.max_file_bytes <= 1 << 30, "index.max_file_bytes", "must be from 1 to 1 GiB"
        )


def _default_readers() -> int:
    cores = os.cpu_count() or 1
    return min(4, cores) if cores > 1 else 0


@dataclass(frozen=True)
class SearchConfig:
    """Search defaults (OpenClaw's), each overridable per request where it makes sense."""

    mode: SearchMode = "hybrid"
    max_results: int = 6
    min_score: float = 0.35
    # The weights of the two halves of a hybrid score (memd.search._merge). OpenClaw's
    # 0.7 vector / 0.3 text ranked below keyword-only search on LoCoMo; keyword 0.7 with the
    # line-aware vector half 0.3 was best on the tuning conversations and held on the others
    # (docs/benchmarks.md).
    vector_weight: float = 0.3
    text_weight: float = 0.7
    candidate_multiplier: int = 4
    snippet_chars: int = 700
    decay: bool = False
    half_life_days: float = 30.0
    mmr: bool = False
    mmr_lambda: float = 0.7
    # Processes that run searches when several overlap (memd/readers): one per core, at most
    # four; 0 runs every search in the daemon.
    reader_processes: int = field(default_factory=_default_readers)

    def validate(self) -> None:
        _check(1 <= self.max_results <= 100, "search.max_results", "must be from 1 to 100")
        _check(0 <= self.reader_processes <= 16, "search.reader_processes", "must be 0 to 16")
        _check(0.0 <= self.min_score <= 1.0, "search.min_score", "must be from 0 to 1")
        _check(0 <= self.vector_weight <= 1000, "search.vector_weight", "must be from 0 to 1000")
        _check(0 <= self.text_weight <= 1000, "search.text_weight", "must be from 0 to 1000")
        _check(
            1 <= self.candidate_multiplier <= 20, "search.candidate_multiplier", "must be 1 to 20"
        )
        _check(16 <= self.snippet_chars <= 100_000, "search.snippet_chars", "must be 16 to 100000")
        _check(
            1 <= self.half_life_days <= 36_500, "search.half_life_days", "must be from 1 to 36500"
        )
        _check(0.0 <= self.mmr_lambda <= 1.0, "search.mmr_lambda", "must be from 0 to 1")


@dataclass(frozen=True)
class EmbeddingConfig:
    """Which embedding provider to use; ``auto`` walks local, then remote, then keyword-only."""

    provider: ProviderName = "auto"
    fallback: ProviderName = "none"
    # Model name for remote providers (empty: the provider's default).
    model: str = ""
    # A GGUF file for the local provider (also MEMD_LOCAL_MODEL); empty: look in the model dir.
    model_path: str = ""
    # With llama-cpp-python installed and no model anywhere, the daemon downloads pull_uri
    # (empty: the recommended multilingual-e5-small) into the model dir in the background on
    # its first start, searching by keyword meanwhile. On by default: installing the `local`
    # extra is asking for local vectors (as OpenClaw fetches its default model on first use);
    # false: never download, `memctl model pull` does it by hand.
    auto_pull: bool = True
    pull_uri: str = ""
    # llama.cpp threads (0: half the cores, at least 1) and texts per embedding call.
    threads: int = 0
    batch_size: int = 32
    # Override the per-model query/document prefixes (empty: from the table keyed by GGUF name).
    query_prefix: str = ""
    document_prefix: str = ""
    cache_max_entries: int = 0
    # Remote providers: an explicit server (OpenAI-compatible, Ollama), a 0600 key file,
    # requested output dimensions (0: the model's default), timeouts and retries.
    base_url: str = ""
    api_key_file: str = ""
    dimensions: int = 0
    timeout_seconds: float = 60.0
    max_retries: int = 3
    # Requests in flight at once and tokens per request (0: 4 and 8192 for the cloud APIs; 1
    # and 256 for Ollama and servers of your own, which compute one request at a time).
    concurrency: int = 0
    request_tokens: int = 0
    # OpenAI's Batch API (half the price, results within 24 h) for a first index or a rebuild
    # that would send at least batch_min_tokens: "auto" uses it there, "off" never.
    batch_api: Literal["auto", "off"] = "auto"
    batch_min_tokens: int = 1_000_000
    batch_poll_seconds: float = 60.0

    def validate(self) -> None:
        _check(0 <= self.threads <= 256, "embedding.threads", "must be from 0 (automatic) to 256")
        _check(1 <= self.batch_size <= 4096, "embedding.batch_size", "must be from 1 to 4096")
        _check(
            0 <= self.cache_max_entries <= 10**9,
            "embedding.cache_max_entries",
            "must be from 0 to 1000000000",
        )
        _check(0 <= self.dimensions <= 65_536, "embedding.dimensions", "must be from 0 to 65536")
        _check(
            0 < self.timeout_seconds <= 3600, "embedding.timeout_seconds", "must be over 0, to 3600"
        )
        _check(0 <= self.max_retries <= 10, "embedding.max_retries", "must be from 0 to 10")
        _check(0 <= self.concurrency <= 64, "embedding.concurrency", "must be from 0 to 64")
        _check(
            0 <= self.request_tokens <= 1_000_000,
            "embedding.request_tokens",
            "must be from 0 (automatic) to 1000000",
        )
        _check(
            1 <= self.batch_min_tokens <= 10**12,
            "embedding.batch_min_tokens",
            "must be at least 1",
        )
        _check(
            1 <= self.batch_poll_seconds <= 86_400,
            "embedding.batch_poll_seconds",
            "must be from 1 to 86400",
        )


@dataclass(frozen=True)
class WatchConfig:
    """File watching and reconciliation."""

    debounce_ms: int = 1500
    reconcile_seconds: int = 300

    def validate(self) -> None:
        _check(0 <= self.debounce_ms <= 600_000, "watch.debounce_ms", "must be from 0 to 600000")
        _check(
            1 <= self.reconcile_seconds <= 7 * 86_400,
            "watch.reconcile_seconds",
            "must be from 1 to 604800 (a week)",
        )


@dataclass(frozen=True)
class GetConfig:
    """Limits of ``get``."""

    default_lines: int = 120
    max_chars: int = 12_000

    def validate(self) -> None:
        _check(1 <= self.default_lines <= 10_000, "get.default_lines", "must be from 1 to 10000")
        _check(100 <= self.max_chars <= 10_000_000, "get.max_chars", "must be from 100 to 10000000")


@dataclass(frozen=True)
class DreamingConfig:
    """Recall tracking and the promotion of short-term memories into MEMORY.md."""

    # Record which daily-log results each search returned (the input of promotion).
    record_recalls: bool = True
    # Run promotion on a schedule (a cron expression in the user's time zone).
    enabled: bool = False
    schedule: str = "0 3 * * *"
    # Keep MEMORY.md under this many characters by dropping the oldest promoted sections.
    memory_max_chars: int = 10_000
    # Keep DREAMS.md (the dream diary) under this many characters by dropping its oldest
    # entries that nobody edited.
    diary_max_chars: int = 20_000

    def validate(self) -> None:
        from croniter import croniter

        _check(
            croniter.is_valid(self.schedule), "dreaming.schedule", "is not a valid cron expression"
        )
        _check(
            0 <= self.memory_max_chars <= 100_000_000,
            "dreaming.memory_max_chars",
            "must be from 0 to 100000000",
        )
        _check(
            0 <= self.diary_max_chars <= 100_000_000,
            "dreaming.diary_max_chars",
            "must be from 0 to 100000000",
        )


@dataclass(frozen=True)
class WorkspaceConfig:
    """A workspace named in the configuration file."""

    path: str
    name: str = ""
    extra_paths: tuple[str, ...] = ()
    # A folder of the agent's session transcripts (*.jsonl) to index as source "sessions",
    # and the agent they belong to (only callers of that agent see them; default: the name).
    sessions_dir: str = ""
    agent_id: str = ""


@dataclass(frozen=True)
class SessionsConfig:
    """When transcripts are reindexed: after this much growth, or once they go quiet."""

    delta_bytes: int = 100_000
    delta_messages: int = 50
    idle_seconds: int = 600
    check_seconds: float = 5.0

    def validate(self) -> None:
        _check(
            1 <= self.idle_seconds <= 30 * 86_400, "sessions.idle_seconds", "must be 1 to 2592000"
        )
        _check(0 < self.check_seconds <= 3600, "sessions.check_seconds", "must be over 0, to 3600")
        _check(1 <= self.delta_bytes <= 1 << 40, "sessions.delta_bytes", "must be from 1 to 1 TiB")
        _check(
            1 <= self.delta_messages <= 10**9, "sessions.delta_messages", "must be 1 to 1000000000"
        )


@dataclass(frozen=True)
class ScopeRule:
    """Which sources a caller may search: the first rule matching the caller decides."""

    action: Literal["allow", "deny"]
    # Match fields (every one given must match; empty matches anything).
    chat_type: str = ""
    channel: str = ""
    key_prefix: str = ""
    # What the rule is about: "longterm" (MEMORY.md / memory.md), "memory" (all memory files),
    # "sessions" (transcripts).
    sources: tuple[str, ...] = ("longterm", "memory", "sessions")


@dataclass(frozen=True)
class Config:
    """Everything memd can be told; derived paths are properties."""

    index: IndexConfig = field(default_factory=IndexConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    get: GetConfig = field(default_factory=GetConfig)
    dreaming: DreamingConfig = field(default_factory=DreamingConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    scopes: tuple[ScopeRule, ...] = ()
    workspaces: tuple[WorkspaceConfig, ...] = ()
    # IANA time zone for daily-log dates; empty means the machine's local zone.
    timezone: str = ""
    dirs: Dirs = field(default_factory=user_dirs, compare=False)
    source: str = field(default="defaults", compare=False)

    @property
    def state_dir(self) -> Path:
        return self.dirs.state

    @property
    def index_dir(self) -> Path:
        return self.dirs.state / "indexes"

    @property
    def cache_path(self) -> Path:
        return self.dirs.state / "embedding-cache.sqlite"

    @property
    def config_file(self) -> Path:
        return self.dirs.config / "config.toml"

    @classmethod
    def load(
        cls,
        path: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        """Read the TOML file (if any), then ``MEMD_*`` variables, then ``overrides``.

        ``overrides`` take dotted-path keys with ``__`` for the dot, e.g. ``search__max_results=3``.
        """
        env = os.environ if env is None else env
        dirs = user_dirs(env)
        explicit = path is not None or bool(env.get("MEMD_CONFIG"))
        file = Path(path or env.get("MEMD_CONFIG") or dirs.config / "config.toml").expanduser()
        # Whatever a file holds (nesting deeper than the parser recurses, integers of
        # thousands of digits, bytes that are not UTF-8), the caller gets a ConfigError that
        # names the file: a reload keeps the old configuration, a start exits with one line.
        try:
            data = _read(file, explicit=explicit)
            try:
                values = _from_mapping(cls, data or {}, prefix="")
            except ConfigError as exc:
                raise ConfigError(f"{file}: {exc}") from None
            from_env = _apply_env(values, env)
            given = set()
            for key, value in overrides.items():
                section, _, name = key.partition("__")
                given.add(f"{section}.{name}" if name else section)
                if name:
                    values.setdefault(section, {})[name] = value
                else:
                    values[section] = value
            source = str(file) if data is not None else _no_file(file, env, explicit)
            try:
                return _build(values, dirs=dirs, source=source)
            except _BadValue as exc:  # say where the value came from
                if exc.key in from_env:
                    raise ConfigError(f"{from_env[exc.key]}: {exc}") from None
                if data is not None and exc.key not in given:
                    raise ConfigError(f"{file}: {exc}") from None
                raise ConfigError(str(exc)) from None
        except ConfigError:
            raise
        except RecursionError:
            raise ConfigError(f"{file}: nested more deeply than memd reads") from None
        except Exception as exc:  # a value no check above foresaw: still one line, no traceback
            raise ConfigError(
                f"{file}: cannot be used ({type(exc).__name__}: {_line(exc)})"
            ) from None


def _no_file(file: Path, env: Mapping[str, str], explicit: bool) -> str:
    """Where the defaults come from, said where memd looked, and a config.toml left where memd
    does not read one ($MEMD_HOME/config.toml, beside config/) named with where it belongs."""
    home = env.get("MEMD_HOME")
    stray = Path(home).expanduser() / "config.toml" if home else None
    if stray is not None and not explicit and stray != file and stray.is_file():
        logging.getLogger(__name__).warning(
            "%s is not read: memd reads %s; move it there", stray, file
        )
        return f"defaults: no file at {file} ({stray} is not read: move it there)"
    return f"defaults: no file at {file}"


class _BadValue(ConfigError):
    """A value out of its bounds, with the dotted key it was given for."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key} {why}")
        self.key = key


def _check(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise _BadValue(key, why)


def _line(what: object, limit: int = 200) -> str:
    """``what`` as one line of at most ``limit`` characters (an error names a value, it does
    not repeat a megabyte of it)."""
    try:
        text = str(what)
    except ValueError:  # an int past Python's digit limit
        text = f"<{type(what).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: object) -> str:
    """A value as an error shows it: its repr, on one line and short."""
    try:
        return _line(repr(value), 80)
    except ValueError:  # an int past Python's digit limit
        return f"<{type(value).__name__}>"


def _read(file: Path, *, explicit: bool) -> dict[str, Any] | None:
    """The parsed TOML of ``file``; None when there is none (and none was asked for)."""
    try:
        st = file.stat()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {file} does not exist") from None
        return None
    except OSError as exc:
        raise ConfigError(f"config file {file} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):  # /dev/zero would never end, a FIFO would block start-up
        raise ConfigError(f"config file {file} is not a regular file")
    try:
        with file.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {file} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{file} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file} is not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: {_line(exc)}") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"{file}: {_line(exc)}") from None


_SECTIONS: dict[str, type[Any]] = {
    "index": IndexConfig,
    "search": SearchConfig,
    "embedding": EmbeddingConfig,
    "watch": WatchConfig,
    "get": GetConfig,
    "dreaming": DreamingConfig,
    "sessions": SessionsConfig,
}
_TOP_LEVEL = {"timezone": str}


def _from_mapping(cls: type[Config], data: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key in _SECTIONS:
            if not isinstance(raw, Mapping):
                raise ConfigError(f"[{key}] must be a table")
            section_cls = _SECTIONS[key]
            hints = typing.get_type_hints(section_cls)
            section: dict[str, Any] = {}
            for name, value in raw.items():
                if name not in hints:
                    raise ConfigError(f"unknown key {key}.{_line(name, 80)}")
                section[name] = _coerce(f"{key}.{name}", hints[name], value, from_env=False)
            values[key] = section
        elif key == "workspaces":
            values[key] = _workspaces(raw)
        elif key == "scopes":
            values[key] = _scopes(raw)
        elif key in _TOP_LEVEL:
            values[key] = _coerce(key, _TOP_LEVEL[key], raw, from_env=False)
        else:
            raise ConfigError(f"unknown key {prefix}{_line(key, 80)}")
    return values


def _workspaces(raw: Any) -> tuple[WorkspaceConfig, ...]:
    if not isinstance(raw, list):
        raise ConfigError("workspaces must be an array of tables ([[workspaces]])")
    if len(raw) > MAX_WORKSPACES:
        raise ConfigError(f"workspaces: {len(raw)} given, at most {MAX_WORKSPACES}")
    hints = typing.get_type_hints(WorkspaceConfig)
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ConfigError(f"workspaces[{i}] must be a table")
        kwargs = {}
        for name, value in item.items():
            if name not in hints:
                raise ConfigError(f"unknown key workspaces[{i}].{_line(name, 80)}")
            kwargs[name] = _coerce(f"workspaces[{i}].{name}", hints[name], value, from_env=False)
        if "path" not in kwargs:
            raise ConfigError(f"workspaces[{i}].path is required")
        extra = kwargs.get("extra_paths", ())
        if len(extra) > MAX_EXTRA_PATHS:
            raise ConfigError(
                f"workspaces[{i}].extra_paths: {len(extra)} given, at most {MAX_EXTRA_PATHS}"
            )
        for entry in extra:
            why = refused_extra_path(Path(kwargs["path"]).expanduser(), entry)
            if why:
                raise ConfigError(f"workspaces[{i}].extra_paths: {why}")
        out.append(WorkspaceConfig(**kwargs))
    return tuple(out)


_SOURCE_CLASSES = {"longterm", "memory", "sessions"}


def _scopes(raw: Any) -> tuple[ScopeRule, ...]:
    if not isinstance(raw, list):
        raise ConfigError("scopes must be an array of tables ([[scopes]])")
    if len(raw) > MAX_SCOPES:
        raise ConfigError(f"scopes: {len(raw)} rules given, at most {MAX_SCOPES}")
    hints = typing.get_type_hints(ScopeRule)
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ConfigError(f"scopes[{i}] must be a table")
        kwargs = {}
        for name, value in item.items():
            if name not in hints:
                raise ConfigError(f"unknown key scopes[{i}].{_line(name, 80)}")
            kwargs[name] = _coerce(f"scopes[{i}].{name}", hints[name], value, from_env=False)
        if "action" not in kwargs:
            raise ConfigError(f"scopes[{i}].action is required (allow or deny)")
        bad = set(kwargs.get("sources", ())) - _SOURCE_CLASSES
        if bad:
            raise ConfigError(
                f"scopes[{i}].sources: unknown {sorted(bad)} (longterm, memory, sessions)"
            )
        out.append(ScopeRule(**kwargs))
    return tuple(out)


# Variables that are not ``MEMD_<SECTION>_<KEY>`` but are part of the interface.
_ENV_ALIASES = {"MEMD_LOCAL_MODEL": ("embedding", "model_path"), "MEMD_TIMEZONE": ("", "timezone")}
_ENV_RESERVED = {"MEMD_HOME", "MEMD_CONFIG", "MEMD_EMBEDDING_API_KEY"}


def setting_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The ``MEMD_*`` variables in ``env`` that set configuration keys (what a service started
    elsewhere must be given to run as configured here); never a key or a password."""
    out = {}
    for var, raw in env.items():
        if not var.startswith("MEMD_") or var in _ENV_RESERVED or not raw:
            continue
        if var in _ENV_ALIASES:
            out[var] = raw
            continue
        section, _, name = var[len("MEMD_") :].lower().partition("_")
        if section in _SECTIONS and name in typing.get_type_hints(_SECTIONS[section]):
            out[var] = raw
    return out


def _apply_env(values: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Put the ``MEMD_*`` settings of ``env`` into ``values``; return which variable set which
    dotted key."""
    given: dict[str, str] = {}
    for var, raw in env.items():
        if not var.startswith("MEMD_") or var in _ENV_RESERVED:
            continue
        if var in _ENV_ALIASES:
            section, name = _ENV_ALIASES[var]
        else:
            rest = var[len("MEMD_") :].lower()
            section, _, name = rest.partition("_")
            if section not in _SECTIONS:
                continue  # not a config variable (e.g. MEMD_TEST_MODEL)
            if name not in typing.get_type_hints(_SECTIONS[section]):
                raise ConfigError(
                    f"unknown variable {_line(var, 80)} (no key {section}.{_line(name, 80)})"
                )
        if section:
            hint = typing.get_type_hints(_SECTIONS[section])[name]
            values.setdefault(section, {})[name] = _coerce(var, hint, raw, from_env=True)
            given[f"{section}.{name}"] = var
        else:
            values[name] = _coerce(var, _TOP_LEVEL[name], raw, from_env=True)
            given[name] = var
    return given


MAX_CONFIG_BYTES = 1 << 20
"""A configuration file larger than this is refused (it is a few hundred bytes)."""
# Each workspace opens an index and a watcher, each extra path is walked and watched: a file
# that lists thousands of them is a mistake (or worse), not a setup.
MAX_WORKSPACES = 1000
MAX_EXTRA_PATHS = 100
MAX_SCOPES = 1000

# Directories that hold the system, not anyone's notes (Linux and macOS): a workspace or an
# extra path there would have memd walk and watch the system (status took 32 s with "/").
SYSTEM_DIRS = frozenset(
    {
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/media",
        "/mnt",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/snap",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/local",
        "/usr/share",
        "/var",
        "/var/tmp",
        "/Applications",
        "/Library",
        "/System",
        "/Users",
        "/Volumes",
        "/private",
        "/private/tmp",
        "/private/var",
    }
)
# Pseudo file systems: nothing under them is a note, and some of their walks never end.
_PSEUDO_FS = ("/proc", "/sys", "/dev")


@functools.lru_cache(maxsize=1)
def _system_dirs() -> frozenset[str]:
    """SYSTEM_DIRS and where they lead (``/bin`` is ``/usr/bin`` on most systems now)."""
    return SYSTEM_DIRS | {os.path.realpath(d) for d in SYSTEM_DIRS}


def refused_directory(path: str | Path) -> str | None:
    """Why ``path`` (a directory, symlinks followed) cannot be a workspace or an extra path,
    or None: the root of the file system, a system directory, or a pseudo file system."""
    real = os.path.realpath(os.path.expanduser(path))
    if real == os.path.dirname(real):
        return "it is the root of the file system"
    if real in _system_dirs():
        return "it is a system directory"
    if any(real == fs or real.startswith(fs + "/") for fs in _PSEUDO_FS):
        return "it is on a pseudo file system"
    return None


def refused_extra_path(root: Path, entry: str, what: str = "an extra path") -> str | None:
    """Why the extra path ``entry`` of the workspace at ``root`` (resolved against it, as
    discovery does) cannot be indexed, or None. Extra paths (and transcript folders) are walked
    whole: besides what no workspace may be, the home directory and its parents are refused."""
    full = os.path.normpath(os.path.join(os.path.abspath(root), os.path.expanduser(entry)))
    why = refused_directory(full)
    if why is None:
        real = os.path.realpath(full)
        home = os.path.realpath(os.path.expanduser("~"))
        if real == home or home.startswith(real.rstrip("/") + "/"):
            why = "it is the home directory or holds it"
    if why is None:
        return None
    return f"{_show(entry)} cannot be {what}: {why} (name a folder of notes instead)"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(key: str, hint: Any, value: Any, *, from_env: bool) -> Any:
    """Check ``value`` against the field type ``hint``; strings from the environment are parsed."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(
                f"{key} must be one of {', '.join(map(str, choices))}, not {_show(value)}"
            )
        return value
    if hint is bool:
        if from_env and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, not {_show(value)}")
    if hint is int:
        if from_env and isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be a whole number, not {_show(value)}")
    if hint is float:
        number: float | None = None
        if from_env and isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value.strip())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond any float
                number = math.inf
        if number is None:
            raise ConfigError(f"{key} must be a number, not {_show(value)}")
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, not {_show(value)}")
        return number
    if hint is str:
        if isinstance(value, str):
            return _no_nul(key, value)
        raise ConfigError(f"{key} must be a string, not {_show(value)}")
    if origin is tuple:
        if from_env and isinstance(value, str):
            return tuple(_no_nul(key, p) for p in value.split(os.pathsep) if p)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(_no_nul(key, v) for v in value)
        raise ConfigError(f"{key} must be a list of strings, not {_show(value)}")
    if isinstance(hint, types.UnionType):  # pragma: no cover - no such fields yet
        raise ConfigError(f"{key}: unsupported type")
    raise ConfigError(f"{key}: unsupported type {hint!r}")  # pragma: no cover


def _no_nul(key: str, value: str) -> str:
    # A NUL byte cannot be in a path, a URL or a variable: refused here, not as a ValueError
    # deep inside whatever opens it.
    if "\x00" in value:
        raise ConfigError(f"{key} holds a NUL character")
    return value


def _build(values: dict[str, Any], *, dirs: Dirs, source: str) -> Config:
    kwargs: dict[str, Any] = {"dirs": dirs, "source": source}
    for key, value in values.items():
        if key in _SECTIONS:
            if isinstance(value, Mapping):
                section = _SECTIONS[key](**value)
            elif isinstance(value, _SECTIONS[key]):
                section = value
            else:
                raise ConfigError(f"[{key}] must be a table")
            section.validate()
            kwargs[key] = section
        elif key in ("workspaces", "timezone", "scopes"):
            kwargs[key] = value
        else:
            raise ConfigError(f"unknown key {key}")
    config = Config(**kwargs)
    for key in _SECTIONS:
        if key not in kwargs:
            getattr(config, key).validate()
    if config.timezone:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(config.timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise _BadValue(
                "timezone", f"{_show(config.timezone)} is not a known IANA time zone"
            ) from None
    return config


def replace(config: Config, **changes: Any) -> Config:
    """Return a copy of ``config`` with whole sections or fields replaced."""
    return dataclasses.replace(config, **changes)
