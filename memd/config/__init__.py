"""memd's configuration: one frozen dataclass, read from TOML and ``MEMD_*`` variables.

Precedence is explicit argument > environment > file > default. Every key and every bad value is
named in the error, so a typo never silently falls back to a default.

This package's face is the configuration itself: ``Config``, how it is loaded, and (re-exported,
the names of ``__all__``) its sections and the directory checks. Each part lives in a module of
its own: the sections (memd.config.sections), the file format (memd.config.parse), the
``MEMD_*`` variables (memd.config.env), the refused directories (memd.config.directories) and
how errors name a bad value (memd.config.errors).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.config.directories import refused_directory, refused_extra_path
from memd.config.env import _apply_env
from memd.config.errors import _BadValue, _line, _show
from memd.config.parse import _SECTIONS, _from_mapping, _read
from memd.config.sections import (
    DreamingConfig,
    EmbeddingConfig,
    GetConfig,
    IndexConfig,
    ScopeRule,
    SearchConfig,
    SessionsConfig,
    WatchConfig,
    WorkspaceConfig,
)
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
