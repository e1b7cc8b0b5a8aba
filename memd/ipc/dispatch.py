"""Method name -> Api call; exceptions -> ``[code, message]`` on the wire (never a traceback)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from memd.api import METHODS, Api
from memd_client.errors import Code, MemdError, UnknownMethod, to_wire
from memd_client.protocol import RESPONSE, Request

__all__ = ["Dispatcher"]

logger = logging.getLogger(__name__)


class Dispatcher:
    """Turns one request into one response message."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._table: dict[str, Callable[[Mapping[str, Any]], Any]] = {
            name: getattr(api, name) for name in METHODS
        }

    def __call__(self, request: Request) -> list[Any]:
        handler = self._table.get(request.method)
        try:
            if handler is None:
                raise UnknownMethod(f"unknown method {request.method!r}")
            return [RESPONSE, request.msgid, None, handler(request.params)]
        except MemdError as exc:
            return [RESPONSE, request.msgid, to_wire(exc), None]
        except Exception as exc:
            logger.exception("%s failed", request.method)
            message = (
                f"internal error in {request.method} ({type(exc).__name__}); see the daemon log"
            )
            return [RESPONSE, request.msgid, [int(Code.INTERNAL), message], None]
