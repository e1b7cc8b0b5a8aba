"""memd_client: the thin client of the memd daemon (stdlib + msgpack only)."""

from memd_client.errors import (
    BadRequest,
    Busy,
    Code,
    ConfigError,
    IndexError_,
    Internal,
    MemdError,
    PathRefused,
    ProviderUnavailable,
    Timeout,
    TooLarge,
    Unauthorized,
    UnknownMethod,
    UnknownWorkspace,
)

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
]
