"""Logging set-up for the memd command: one stderr handler on the ``memd`` logger."""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_logging"]


def configure_logging(level: str = "info") -> None:
    """Send memd's log records to stderr (journald and launchd capture it)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("memd")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
