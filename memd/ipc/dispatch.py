"""Method name -> Api call; exceptions -> ``[code, message]`` on the wire (never a traceback)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from memd.ipc.methods import Methods
from memd.scopes import ANONYMOUS, Caller, caller_field
from memd_client.errors import BadRequest, Code, MemdError, UnknownMethod, to_wire
from memd_client.protocol import RESPONSE, Request

__all__ = ["Dispatcher"]

logger = logging.getLogger(__name__)


class Dispatcher:
    """Turns one request into one response message."""

    def __init__(self, methods: Methods) -> None:
        self.methods = methods
        self.calls = 0  # requests answered (racy increments: the daemon only asks "any since?")
        self._table: dict[str, Callable[..., Any]] = dict(methods.table)

    def __call__(self, request: Request, state: dict[str, Any] | None = None) -> list[Any]:
        handler = self._table.get(request.method)
        self.calls += 1
        state = {} if state is None else state
        try:
            if handler is None:
                raise UnknownMethod(f"unknown method {request.method!r}")
            override = request.params.get("caller")
            if override is not None and (
                not isinstance(override, dict) or any(caller_field(k) is None for k in override)
            ):
                raise BadRequest(
                    "caller must be a map of agent_id, session_key, chat_type and channel"
                )
            hello = request.method == "hello"
            if hello and any(
                key != "caller" and isinstance(value, dict) and any(map(caller_field, value))
                for key, value in request.params.items()
            ):
                raise BadRequest("identity fields go at the top of hello or in its caller map")
            # Every method runs for a caller: the connection's (what hello declared, at the top
            # or in its caller map), or that with one request's caller map over it.
            caller = Caller.from_params(request.params) if hello else state.get("caller")
            caller = caller or ANONYMOUS
            if override is not None:
                caller = caller.merged(Caller.from_params(override))
            if hello:
                state["caller"] = caller
            params = {k: v for k, v in request.params.items() if k != "caller"}
            return [RESPONSE, request.msgid, None, handler(params, caller)]
        except MemdError as exc:
            return [RESPONSE, request.msgid, to_wire(exc), None]
        except Exception as exc:
            logger.exception("%s failed", request.method)
            message = (
                f"internal error in {request.method} ({type(exc).__name__}); see the daemon log"
            )
            return [RESPONSE, request.msgid, [int(Code.INTERNAL), message], None]
