"""memd_client: the thin client of the memd daemon (stdlib + msgpack only).

with memd_client.connect() as c:
    hits = c.search("/home/me/agent", "when is the launch?")["results"]

``memd_client.aio`` is the asyncio twin; it is imported on first use, so the blocking client
does not pay for importing asyncio (nor for the result types, also imported when first used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from memd_client import aio
    from memd_client.types import (
        AppendResult,
        AppliedPromotion,
        ContextResult,
        ContextSection,
        DaemonStatus,
        DreamingStatus,
        DreamResult,
        EmbedderStatus,
        ExplainedCandidate,
        FlushPlan,
        Freshness,
        GetResult,
        HelloResult,
        IdentityStatus,
        ModelPullStatus,
        PromoteCandidate,
        PromoteResult,
        PromoteThresholds,
        ProviderStatus,
        RecallStoreCounts,
        RecordRecallResult,
        ReindexReport,
        ReindexResult,
        ScoreComponents,
        SearchHit,
        SearchResult,
        SkippedProvider,
        Started,
        StatusResult,
        VectorStoreStatus,
        WatcherStatus,
        WorkspaceAddResult,
        WorkspaceEntry,
        WorkspaceListResult,
        WorkspaceRemoveResult,
        WorkspaceStatus,
    )


# The result types (TypedDicts, for type checkers) are imported when first asked for: a
# client process has no use for them at run time.
_TYPE_NAMES = frozenset(
    {
        "AppendResult",
        "AppliedPromotion",
        "ContextResult",
        "ContextSection",
        "DaemonStatus",
        "DreamingStatus",
        "EmbedderStatus",
        "DreamResult",
        "ExplainedCandidate",
        "FlushPlan",
        "Freshness",
        "GetResult",
        "HelloResult",
        "IdentityStatus",
        "ModelPullStatus",
        "PromoteCandidate",
        "PromoteResult",
        "PromoteThresholds",
        "ProviderStatus",
        "RecallStoreCounts",
        "RecordRecallResult",
        "ReindexReport",
        "ReindexResult",
        "ScoreComponents",
        "SearchHit",
        "SearchResult",
        "SkippedProvider",
        "Started",
        "StatusResult",
        "VectorStoreStatus",
        "WatcherStatus",
        "WorkspaceAddResult",
        "WorkspaceEntry",
        "WorkspaceListResult",
        "WorkspaceRemoveResult",
        "WorkspaceStatus",
    }
)


def __getattr__(name: str) -> Any:
    if name == "aio":
        return importlib.import_module("memd_client.aio")
    if name in _TYPE_NAMES:
        return getattr(importlib.import_module("memd_client.types"), name)
    raise AttributeError(f"module 'memd_client' has no attribute {name!r}")


__all__ = [
    "AppendResult",
    "AppliedPromotion",
    "BadRequest",
    "Busy",
    "Client",
    "Code",
    "ConfigError",
    "ContextResult",
    "ContextSection",
    "DaemonNotRunning",
    "DaemonStatus",
    "DaemonUnavailable",
    "DreamingStatus",
    "EmbedderStatus",
    "ExplainedCandidate",
    "FlushPlan",
    "Freshness",
    "GetResult",
    "HelloResult",
    "IdentityStatus",
    "IndexError_",
    "Internal",
    "MemdError",
    "ModelPullStatus",
    "PathRefused",
    "PromoteCandidate",
    "DreamResult",
    "PromoteResult",
    "PromoteThresholds",
    "ProviderStatus",
    "ProviderUnavailable",
    "RecallStoreCounts",
    "RecordRecallResult",
    "ReindexReport",
    "ReindexResult",
    "ScoreComponents",
    "SearchHit",
    "SearchResult",
    "SkippedProvider",
    "Started",
    "StatusResult",
    "Timeout",
    "TooLarge",
    "Unauthorized",
    "UnknownMethod",
    "UnknownWorkspace",
    "VectorStoreStatus",
    "WatcherStatus",
    "WorkspaceAddResult",
    "WorkspaceEntry",
    "WorkspaceListResult",
    "WorkspaceRef",
    "WorkspaceRemoveResult",
    "WorkspaceStatus",
    "aio",
    "connect",
]
