"""The workspace methods: ``workspace_add`` (or change a registered one's settings),
``workspace_remove`` and ``workspace_list``. A workspace's life (open, watch, sync, save,
forget) is the registry's (memd/registry/); these check the request and shape the reply."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from memd.ipc.context import Context
from memd.params import only, str_param
from memd.scopes import Caller
from memd.workspace import workspace_entry
from memd_client.errors import BadRequest
from memd_client.types import WorkspaceAddResult, WorkspaceListResult, WorkspaceRemoveResult

__all__ = ["Workspaces"]


class Workspaces:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def workspace_add(self, params: Mapping[str, Any], caller: Caller) -> WorkspaceAddResult:
        only(params, "path", "name", "extra_paths", "sessions_dir", "agent_id")
        path = str_param(params, "path")
        assert path is not None
        if not os.path.isabs(path):
            raise BadRequest("path must be absolute")
        extra = params.get("extra_paths") or []
        if not isinstance(extra, list) or not all(isinstance(e, str) for e in extra):
            raise BadRequest("extra_paths must be a list of strings")
        sessions_dir = str_param(params, "sessions_dir", required=False) or ""
        if sessions_dir and not os.path.isabs(sessions_dir):
            raise BadRequest("sessions_dir must be absolute")
        ws, added, changed = self.ctx.service.registry.add_or_update(
            path,
            name=str_param(params, "name", required=False) or "",
            extra_paths=tuple(extra) if "extra_paths" in params else None,
            sessions_dir=sessions_dir,
            agent_id=str_param(params, "agent_id", required=False) or "",
        )
        return {**workspace_entry(ws), "added": added, "updated": changed}

    def workspace_remove(self, params: Mapping[str, Any], caller: Caller) -> WorkspaceRemoveResult:
        only(params, "workspace")
        ref = str_param(params, "workspace")
        assert ref is not None
        return {"removed": self.ctx.service.registry.forget(ref)}

    def workspace_list(self, params: Mapping[str, Any], caller: Caller) -> WorkspaceListResult:
        only(params)
        registry = self.ctx.service.registry
        return {
            "workspaces": [workspace_entry(ws) for ws in registry.all()],
            "missing": list(registry.missing.values()),
        }
