"""The wire format: msgpack-RPC messages over a Unix stream socket, with bounded sizes.

Request ``[0, msgid, method, params]``, response ``[1, msgid, error, result]``, notification
``[2, method, params]``. ``params`` is an empty array or an array holding one map of named
arguments; ``error`` is nil or ``[code, message]`` (codes in :mod:`memd_client.errors`).
Messages follow each other on the stream with no other framing; a streaming unpacker with hard
limits decodes them, and any decoding error ends the connection (an Unpacker that raised must
not be used again).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

__all__ = [
    "MAX_ARRAY_LEN",
    "MAX_MAP_LEN",
    "MAX_REQUEST_BYTES",
    "MAX_RESPONSE_BYTES",
    "NOTIFICATION",
    "PROTOCOL_VERSION",
    "REQUEST",
    "RESPONSE",
    "Notification",
    "ProtocolError",
    "Request",
    "Response",
    "make_unpacker",
    "pack",
    "parse",
]

PROTOCOL_VERSION = 1
REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2

# A request (and any string in it) is at most 1 MiB; replies may be larger (a search returns up
# to 100 snippets of up to a few KiB each).
MAX_REQUEST_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 16 << 20
MAX_ARRAY_LEN = 10_000
MAX_MAP_LEN = 1_000
MAX_MSGID = (1 << 32) - 1


class ProtocolError(ValueError):
    """A message that is not valid msgpack-RPC; the connection that sent it is closed."""


# Named tuples, not dataclasses: importing dataclasses (and with it inspect) costs a client
# process more than the rest of the protocol.
class Request(NamedTuple):
    msgid: int
    method: str
    params: dict[str, Any]


class Response(NamedTuple):
    msgid: int
    error: list[Any] | None
    result: Any


class Notification(NamedTuple):
    method: str
    params: dict[str, Any]


def make_unpacker(max_bytes: int = MAX_REQUEST_BYTES) -> msgpack.Unpacker:
    """A streaming unpacker that refuses anything larger than ``max_bytes`` before allocating."""
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_buffer_size=max_bytes,
        max_str_len=max_bytes,
        max_bin_len=max_bytes,
        max_array_len=MAX_ARRAY_LEN,
        max_map_len=MAX_MAP_LEN,
        max_ext_len=0,
    )


def pack(message: list[Any]) -> bytes:
    """Encode one message."""
    return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]


def _params(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, list) or len(raw) > 1:
        raise ProtocolError("params must be an array holding at most one map")
    if not raw:
        return {}
    if not isinstance(raw[0], dict):
        raise ProtocolError("params must be [] or [{name: value, ...}]")
    return raw[0]


def parse(obj: Any) -> Request | Response | Notification:
    """Check the shape of a decoded message and return it typed."""
    if not isinstance(obj, list) or not obj:
        raise ProtocolError("a message must be a non-empty array")
    kind = obj[0]
    if isinstance(kind, bool) or not isinstance(kind, int):
        raise ProtocolError(f"unknown message type {kind!r}")
    if kind == REQUEST:
        if len(obj) != 4:
            raise ProtocolError("a request has 4 elements: [0, msgid, method, params]")
        _, msgid, method, params = obj
        if not isinstance(msgid, int) or isinstance(msgid, bool) or not 0 <= msgid <= MAX_MSGID:
            raise ProtocolError("msgid must be an unsigned 32-bit integer")
        if not isinstance(method, str) or not method:
            raise ProtocolError("method must be a non-empty string")
        return Request(msgid, method, _params(params))
    if kind == RESPONSE:
        if len(obj) != 4:
            raise ProtocolError("a response has 4 elements: [1, msgid, error, result]")
        _, msgid, error, result = obj
        if not isinstance(msgid, int) or isinstance(msgid, bool):
            raise ProtocolError("msgid must be an integer")
        if error is not None and not isinstance(error, list):
            raise ProtocolError("error must be nil or [code, message]")
        return Response(msgid, error, result)
    if kind == NOTIFICATION:
        if len(obj) != 3:
            raise ProtocolError("a notification has 3 elements: [2, method, params]")
        _, method, params = obj
        if not isinstance(method, str) or not method:
            raise ProtocolError("method must be a non-empty string")
        return Notification(method, _params(params))
    raise ProtocolError(f"unknown message type {kind!r}")
