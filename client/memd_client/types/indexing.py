"""The result maps of reindex (its reports and dry-run estimates) and of the workspace methods.

Its own module: one family of methods, as the daemon groups them (memd/ipc/); memd_client.types
imports every name from here.

No ``from __future__ import annotations`` here (see memd_client.types).
"""

from typing import Any, NotRequired, TypedDict


class ReindexReport(TypedDict):
    workspace: str
    scanned: int
    indexed: int
    unchanged: int
    removed: int
    embedded: int
    pending_files: int
    rebuilt: bool
    errors: list[list[str]]
    seconds: float


class ReindexEstimate(TypedDict):
    """What a rebuild would send: ``texts`` distinct texts (chunks, and their lines when
    ``line_vectors``), of which ``cached`` are in the embedding cache and ``send_texts`` (about
    ``send_tokens`` tokens, in ``requests`` requests, or through the Batch API when ``batch``)
    would go to the provider."""

    workspace: str
    provider: str
    model: str
    files: int
    chunks: int
    texts: int
    line_vectors: bool
    cached: int
    send_texts: int
    send_tokens: int
    requests: int
    batch: bool


class ReindexResult(TypedDict, total=False):
    """``workspaces`` when the call waited, ``queued`` (the names) when it did not,
    ``estimates`` for a dry run."""

    workspaces: list[ReindexReport]
    queued: list[str]
    estimates: list[ReindexEstimate]


class WorkspaceEntry(TypedDict):
    """A registered workspace; ``sessions_dir`` and ``agent_id`` when transcripts are indexed."""

    name: str
    path: str
    extra_paths: list[str]
    sessions_dir: NotRequired[str]
    agent_id: NotRequired[str]


class WorkspaceAddResult(WorkspaceEntry):
    """The workspace as registered; ``added`` is false when the directory already was, and
    ``updated`` names the settings that call changed."""

    added: NotRequired[bool]
    updated: NotRequired[list[str]]


class WorkspaceRemoveResult(TypedDict):
    removed: bool


class WorkspaceListResult(TypedDict):
    workspaces: list[WorkspaceEntry]
    # Registered workspaces whose directory is not there (an unmounted drive), as registered.
    missing: NotRequired[list[dict[str, Any]]]
