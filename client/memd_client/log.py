"""The client's loggers, which cost nothing until an application has set logging up.

Importing :mod:`logging` takes longer than the rest of a ``memctl search``; the client logs
only connection details (debug) and the start of a memd (info), which nobody sees unless the
application configured logging, and then :mod:`logging` is loaded already. So a record is
passed on to ``logging.getLogger(name)`` when the application has imported logging, and
dropped otherwise (as logging itself would drop it, with no handler and the default level).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Logger", "get_logger"]


class Logger:
    """``logging.getLogger(name)`` once the application has imported logging."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _log(self, level: str, msg: str, args: tuple[Any, ...]) -> None:
        logging = sys.modules.get("logging")
        if logging is not None:
            getattr(logging.getLogger(self.name), level)(msg, *args, stacklevel=3)

    def debug(self, msg: str, *args: Any) -> None:
        self._log("debug", msg, args)

    def info(self, msg: str, *args: Any) -> None:
        self._log("info", msg, args)

    def warning(self, msg: str, *args: Any) -> None:
        self._log("warning", msg, args)


def get_logger(name: str) -> Logger:
    return Logger(name)
