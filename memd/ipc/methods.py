"""The protocol's methods, by family, as one table: name -> the call that answers it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memd.ipc.context import Context
from memd.ipc.dreams import Dreams
from memd.ipc.read import Read
from memd.ipc.status import Status
from memd.ipc.workspaces import Workspaces
from memd.ipc.write import Write
from memd.scopes import Caller

__all__ = ["METHODS", "Method", "Methods"]

# Every method's name (14); docs/protocol.md describes each.
METHODS = (
    "hello",
    "status",
    "search",
    "get",
    "context",
    "flush_plan",
    "append",
    "reindex",
    "record_recall",
    "promote",
    "dream",
    "workspace_add",
    "workspace_remove",
    "workspace_list",
)

Method = Callable[[Mapping[str, Any], Caller], Any]


class Methods:
    """The families, built once over one :class:`Context`; ``table`` maps names to calls."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.status = Status(ctx, list(METHODS))
        self.read = Read(ctx)
        self.write = Write(ctx)
        self.dreams = Dreams(ctx)
        self.workspaces = Workspaces(ctx)
        families = (self.status, self.read, self.write, self.dreams, self.workspaces)
        self.table: dict[str, Method] = {}
        for name in METHODS:
            (family,) = (f for f in families if hasattr(f, name))
            self.table[name] = getattr(family, name)
