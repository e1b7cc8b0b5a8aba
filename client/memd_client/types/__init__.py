"""The result maps of the daemon's methods, as TypedDicts (docs/protocol.md, "Methods").

They are plain dicts at run time, so indexing a result works as before; a type checker now
knows each key. A key the protocol documents and the daemon always sends is required; one it
sends only sometimes, or that docs/protocol.md calls informational, is ``NotRequired``. The
daemon may add keys: a client ignores those it does not know.

No ``from __future__ import annotations`` here: with string annotations, ``NotRequired`` is
not seen at run time and ``__required_keys__`` would list every key.

This package is that reference: every name is imported from here, as ``from memd_client.types
import SearchResult``. The maps live by family of methods, as the daemon's own modules do: the
memory methods (memd_client.types.memory), hello and status (.status), promote and dream
(.dreaming), reindex and the workspace methods (.indexing).
The parts of maps that ``__all__`` does not list (``ReadersStatus``, the dreaming phases) are
imported ``as`` themselves: importable from here as before, not listed.
"""

from memd_client.types.dreaming import (
    AppliedPromotion,
    DreamResult,
    ExplainedCandidate,
    PromoteCandidate,
    PromoteResult,
    PromoteThresholds,
    ScoreComponents,
)
from memd_client.types.dreaming import DreamCandidate as DreamCandidate
from memd_client.types.dreaming import DreamDeep as DreamDeep
from memd_client.types.dreaming import DreamGroup as DreamGroup
from memd_client.types.dreaming import DreamLight as DreamLight
from memd_client.types.dreaming import DreamRem as DreamRem
from memd_client.types.dreaming import DreamTheme as DreamTheme
from memd_client.types.dreaming import DreamTruth as DreamTruth
from memd_client.types.dreaming import HeldBack as HeldBack
from memd_client.types.indexing import (
    ReindexEstimate,
    ReindexReport,
    ReindexResult,
    WorkspaceAddResult,
    WorkspaceEntry,
    WorkspaceListResult,
    WorkspaceRemoveResult,
)
from memd_client.types.memory import (
    AppendResult,
    ContextResult,
    ContextSection,
    FlushPlan,
    Freshness,
    GetResult,
    RecordRecallResult,
    SearchHit,
    SearchResult,
)
from memd_client.types.status import (
    BatchesStatus,
    BatchJobStatus,
    DaemonStatus,
    DreamingStatus,
    EmbedderStatus,
    EmbeddingCosts,
    HelloResult,
    IdentityStatus,
    ModelPullStatus,
    ProviderRequests,
    ProviderStatus,
    ProviderUsage,
    RecallStoreCounts,
    SentCounts,
    SkippedProvider,
    Started,
    StatusResult,
    VectorStoreStatus,
    WatcherStatus,
    WorkspaceStatus,
)
from memd_client.types.status import ReadersStatus as ReadersStatus

__all__ = [
    "AppendResult",
    "AppliedPromotion",
    "BatchJobStatus",
    "BatchesStatus",
    "ContextResult",
    "ContextSection",
    "DaemonStatus",
    "DreamResult",
    "DreamingStatus",
    "EmbedderStatus",
    "EmbeddingCosts",
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
    "ProviderRequests",
    "ProviderStatus",
    "ProviderUsage",
    "RecallStoreCounts",
    "RecordRecallResult",
    "ReindexEstimate",
    "ReindexReport",
    "ReindexResult",
    "ScoreComponents",
    "SearchHit",
    "SearchResult",
    "SentCounts",
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
]
