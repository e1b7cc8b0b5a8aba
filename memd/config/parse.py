"""Reading the configuration file: the TOML text, its tables and arrays, and each value checked
against the type of the field it sets.

Its own module so that memd.config holds the types and how they are loaded, and this the file
format: limits on what a file may hold, unknown keys, and the coercion of each value.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memd.config.directories import refused_extra_path
from memd.config.errors import _line, _show
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

if TYPE_CHECKING:
    from memd.config import Config

MAX_CONFIG_BYTES = 1 << 20
"""A configuration file larger than this is refused (it is a few hundred bytes)."""
# Each workspace opens an index and a watcher, each extra path is walked and watched: a file
# that lists thousands of them is a mistake (or worse), not a setup.
MAX_WORKSPACES = 1000
MAX_EXTRA_PATHS = 100
MAX_SCOPES = 1000


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
