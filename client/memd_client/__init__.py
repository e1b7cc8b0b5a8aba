"""memd_client: the thin client of the memd daemon (stdlib + msgpack only).

with memd_client.connect() as c:
    hits = c.search("/home/me/agent", "when is the launch?")["results"]
"""

from memd_client.connection import (
    Client,
    DaemonNotRunning,
    DaemonUnavailable,
    WorkspaceRef,
    connect,
)
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
    "Client",
    "Code",
    "ConfigError",
    "DaemonNotRunning",
    "DaemonUnavailable",
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
    "WorkspaceRef",
    "connect",
]
