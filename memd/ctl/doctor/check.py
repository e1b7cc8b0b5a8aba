"""What one check of ``memctl doctor`` finds: its status, what it saw, and what to do about it.

Its own module because the runner (memd.ctl.doctor) and every group of checks make these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Check", "Status"]

Status = Literal["ok", "warn", "fail", "skip"]


@dataclass
class Check:
    """The outcome of one check: what was found (``detail``) and what to do about it (``fix``)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None
