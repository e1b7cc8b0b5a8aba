"""The ``MEMD_*`` environment variables that set configuration keys: ``MEMD_<SECTION>_<KEY>``,
a few aliases, and the variables that are not settings.

Its own module because a service file carries these variables (memd.ctl.servicebase) without
loading a configuration.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from memd.config.errors import _line
from memd.config.parse import _SECTIONS, _TOP_LEVEL, _coerce
from memd_client.errors import ConfigError

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
