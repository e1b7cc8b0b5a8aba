"""The error table shared by the daemon and its clients: one exception class per wire code."""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "BadRequest",
    "Busy",
    "Code",
    "ConfigError",
    "IndexError_",
    "Internal",
    "MemdError",
    "PathRefused",
    "ProviderUnavailable",
    "Timeout",
    "TooLarge",
    "Unauthorized",
    "UnknownMethod",
    "UnknownWorkspace",
    "from_wire",
    "to_wire",
]


class Code(IntEnum):
    """Stable integer codes carried on the wire as ``[code, message]``; never renumber."""

    INTERNAL = 1
    BAD_REQUEST = 2
    UNKNOWN_METHOD = 3
    UNKNOWN_WORKSPACE = 4
    PATH_REFUSED = 5
    PROVIDER_UNAVAILABLE = 6
    BUSY = 7
    TIMEOUT = 8
    TOO_LARGE = 9
    UNAUTHORIZED = 10
    INDEX = 11
    CONFIG = 12


class MemdError(Exception):
    """Base of every error memd raises on purpose; ``code`` says which one on the wire."""

    code: Code = Code.INTERNAL


class Internal(MemdError):
    """An unexpected failure inside the daemon; the details are in its log, never on the wire."""

    code = Code.INTERNAL


class BadRequest(MemdError):
    """A request whose arguments are missing, of the wrong type or out of range."""

    code = Code.BAD_REQUEST


class UnknownMethod(MemdError):
    """A request naming a method the daemon does not have."""

    code = Code.UNKNOWN_METHOD


class UnknownWorkspace(MemdError):
    """A workspace that is neither registered nor an existing directory."""

    code = Code.UNKNOWN_WORKSPACE


class PathRefused(MemdError):
    """A ``get`` path outside the memory files of a workspace (traversal, symlink out, not .md)."""

    code = Code.PATH_REFUSED


class ProviderUnavailable(MemdError):
    """An embedding provider that is required but cannot be used; the message says why."""

    code = Code.PROVIDER_UNAVAILABLE


class Busy(MemdError):
    """The daemon is at a capacity limit; retry later."""

    code = Code.BUSY


class Timeout(MemdError):
    """A deadline passed before the work was done."""

    code = Code.TIMEOUT


class TooLarge(MemdError):
    """A message or argument above the protocol's size limits."""

    code = Code.TOO_LARGE


class Unauthorized(MemdError):
    """A peer that is not the daemon's own user."""

    code = Code.UNAUTHORIZED


class IndexError_(MemdError):
    """The index could not be read or written (disk full, read-only, corrupt); files are untouched."""

    code = Code.INDEX


class ConfigError(MemdError):
    """A configuration file or ``MEMD_*`` variable with an unknown key or a bad value."""

    code = Code.CONFIG


_BY_CODE: dict[int, type[MemdError]] = {
    cls.code: cls
    for cls in (
        Internal,
        BadRequest,
        UnknownMethod,
        UnknownWorkspace,
        PathRefused,
        ProviderUnavailable,
        Busy,
        Timeout,
        TooLarge,
        Unauthorized,
        IndexError_,
        ConfigError,
    )
}


def to_wire(exc: MemdError) -> list[int | str]:
    """Turn an error into its wire form ``[code, message]``."""
    return [int(exc.code), str(exc)]


def from_wire(error: object) -> MemdError:
    """Turn a wire error ``[code, message]`` back into its exception; unknown codes are Internal."""
    if isinstance(error, (list, tuple)) and len(error) == 2:
        code, message = error
        cls = _BY_CODE.get(code, Internal) if isinstance(code, int) else Internal
        return cls(str(message))
    return Internal(f"malformed error from daemon: {error!r}")
