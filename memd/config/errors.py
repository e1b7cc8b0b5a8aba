"""How a bad setting is reported: the dotted key it was given for, and its value on one short line.

Every part of memd.config names keys and values in its errors the same way; these helpers are
what they share.
"""

from __future__ import annotations

from memd_client.errors import ConfigError


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
