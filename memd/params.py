"""Checks of request parameters: each error names the parameter and what it must be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memd_client.errors import BadRequest

__all__ = ["bool_param", "float_param", "int_param", "only", "str_param"]


def str_param(
    params: Mapping[str, Any], name: str, *, required: bool = True, default: str | None = None
) -> str | None:
    value = params.get(name, default)
    if value is None:
        if required:
            raise BadRequest(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    return value


def int_param(
    params: Mapping[str, Any], name: str, lo: int, hi: int, default: int | None = None
) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be a whole number from {lo} to {hi}")
    return value


def float_param(params: Mapping[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be a number from {lo} to {hi}")
    return float(value)


def bool_param(params: Mapping[str, Any], name: str) -> bool | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false")
    return value


def only(params: Mapping[str, Any], *names: str) -> None:
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise BadRequest(f"unknown parameter(s): {', '.join(unknown)}")
