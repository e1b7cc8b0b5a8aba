"""Fuzzing (reliability notes G4.1 and G5.1): the msgpack-RPC decoder, ``get`` path validation,
and a live daemon fed thousands of malformed frames.

Budgets come from the environment so CI can run small and a soak can run large:
``MEMD_FUZZ_EXAMPLES`` (Hypothesis examples per property, default 300), ``MEMD_FUZZ_FRAMES``
(malformed frames in the live run, default 10,000), ``MEMD_FUZZ_SEED`` (the live run's seed,
random by default and named in every failure) and ``MEMD_FUZZ_ATHERIS_RUNS`` (default 5,000).
Nothing here asserts on timing; hang guards are socket timeouts and pytest-timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import itertools
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memd_client
from memd.daemon import Daemon
from memd.ipc.methods import METHODS
from memd.markdown.read import GetResult, read_lines, resolve_memory_path
from memd_client.errors import BadRequest, Code, MemdError, PathRefused
from memd_client.protocol import (
    MAX_MSGID,
    MAX_REQUEST_BYTES,
    Notification,
    ProtocolError,
    Request,
    Response,
    make_unpacker,
    pack,
    parse,
)

from .daemon_fixture import running_daemon

FUZZ_EXAMPLES = int(os.environ.get("MEMD_FUZZ_EXAMPLES", "300"))
FUZZ_FRAMES = int(os.environ.get("MEMD_FUZZ_FRAMES", "10000"))
ATHERIS_RUNS = int(os.environ.get("MEMD_FUZZ_ATHERIS_RUNS", "5000"))

FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)

# What the server loop catches (memd/ipc/server.py); msgpack.OutOfData must never escape iteration.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    msgpack.ExtraData,
    msgpack.FormatError,
    msgpack.StackError,
    msgpack.BufferFull,
    ProtocolError,
)


# -- 1. the decoder -----------------------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**64 - 1)


def msgpack_values(allow_nan: bool = True) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        INT64,
        st.floats(allow_nan=allow_nan),
        st.text(max_size=20),
        st.binary(max_size=20),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5),
            st.dictionaries(st.text(max_size=8), inner, max_size=5),
        ),
        max_leaves=25,
    )


ANY_VALUE = msgpack_values()
MESSAGE_KINDS = st.sampled_from([0, 1, 2, 3, -1, 0.0, True, False, None, "0", 2**32])
# Arbitrary values, plus arrays shaped like messages so parse() gets past its first checks.
MESSAGE_LIKE = st.one_of(
    ANY_VALUE,
    st.builds(lambda kind, rest: [kind, *rest], MESSAGE_KINDS, st.lists(ANY_VALUE, max_size=4)),
    st.builds(
        lambda kind, msgid, method, params: [kind, msgid, method, params],
        MESSAGE_KINDS,
        st.one_of(INT64, ANY_VALUE),
        st.one_of(st.text(max_size=12), ANY_VALUE),
        st.one_of(
            st.just([]), st.lists(ANY_VALUE, max_size=2), st.builds(lambda d: [d], ANY_VALUE)
        ),
    ),
)

# Byte soup that is mostly msgpack: packed values, hostile headers, raw noise, then mutated.
HOSTILE_HEADERS = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 2^32-1 items
    b"\xdc\xff\xff",  # array16 over MAX_ARRAY_LEN
    b"\xdf\x00\x0f\x42\x40",  # map32 of 10^6 pairs
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 4 GiB
    b"\xd4\x01\x00",  # fixext1
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp ext
    b"\xc1",  # never used
    b"\x81\xc0\xc0",  # {nil: nil}
    b"\x81\x90\xc0",  # {[]: nil}
    b"\xa2\xff\xfe",  # invalid UTF-8
    b"\x94\x00\x01\xa5hello\x90",  # a valid request
    b"\x91" * 2000 + b"\xc0",  # nesting deeper than the C stack
]
FRAGMENTS = st.one_of(
    st.builds(msgpack.packb, MESSAGE_LIKE),
    st.sampled_from(HOSTILE_HEADERS),
    st.binary(max_size=64),
)


@st.composite
def msgpackish_bytes(draw: st.DrawFn) -> bytes:
    data = bytearray(b"".join(draw(st.lists(FRAGMENTS, max_size=6))))
    for _ in range(draw(st.integers(0, 3))):  # flip, drop or cut
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "drop", "cut"]))
        if op == "flip":
            data[i] = draw(st.integers(0, 255))
        elif op == "drop":
            del data[i]
        else:
            del data[i:]
    return bytes(data[:4096])


STREAMS = st.one_of(st.binary(max_size=4096), msgpackish_bytes())
CHUNKS = st.lists(st.integers(1, 700), min_size=1, max_size=12)


def decode_stream(data: bytes, chunks: list[int], max_bytes: int) -> tuple[list[Any], Any]:
    """Feed ``data`` in chunks the way the server does; return (messages, error or None)."""
    unpacker = make_unpacker(max_bytes)
    out: list[Any] = []
    pos = 0
    sizes = itertools.cycle(chunks)
    try:
        while pos < len(data):
            n = next(sizes)
            unpacker.feed(data[pos : pos + n])
            pos += n
            for obj in unpacker:
                # Every message takes at least one byte: more than that means a loop.
                assert len(out) < len(data), "the unpacker yields more messages than bytes fed"
                try:
                    out.append(parse(obj))
                except ProtocolError as exc:
                    return out, exc
    except DECODE_ERRORS as exc:
        return out, exc
    return out, None


@FUZZ_SETTINGS
@given(data=STREAMS, chunks=CHUNKS, max_bytes=st.sampled_from([MAX_REQUEST_BYTES, 512, 16]))
def test_decoder_raises_only_documented_errors(
    data: bytes, chunks: list[int], max_bytes: int
) -> None:
    messages, error = decode_stream(data, chunks, max_bytes)
    assert error is None or isinstance(error, DECODE_ERRORS)
    assert not isinstance(error, msgpack.OutOfData)
    assert all(isinstance(m, Request | Response | Notification) for m in messages)


@FUZZ_SETTINGS
@given(data=STREAMS, chunks=CHUNKS)
def test_decoder_does_not_depend_on_chunking(data: bytes, chunks: list[int]) -> None:
    """However the bytes are split across recv() calls, the same messages come out (the limit is
    far above 4 KiB here, so BufferFull cannot depend on the split)."""
    chunked, chunked_error = decode_stream(data, chunks, MAX_REQUEST_BYTES)
    whole, whole_error = decode_stream(data, [max(1, len(data))], MAX_REQUEST_BYTES)
    assert repr(chunked) == repr(whole)
    assert type(chunked_error) is type(whole_error)


@FUZZ_SETTINGS
@given(obj=MESSAGE_LIKE)
def test_parse_returns_a_message_or_raises_protocol_error(obj: Any) -> None:
    try:
        message = parse(obj)
    except ProtocolError:
        return
    assert isinstance(obj, list)
    if isinstance(message, Request):
        assert obj[0] == 0 and len(obj) == 4
        assert type(message.msgid) is int and 0 <= message.msgid <= MAX_MSGID
        assert isinstance(message.method, str) and message.method
        assert isinstance(message.params, dict)
    elif isinstance(message, Response):
        assert obj[0] == 1 and len(obj) == 4
        assert type(message.msgid) is int
        assert message.error is None or isinstance(message.error, list)
    else:
        assert isinstance(message, Notification)
        assert obj[0] == 2 and len(obj) == 3
        assert isinstance(message.method, str) and message.method
        assert isinstance(message.params, dict)


EXACT_VALUES = msgpack_values(allow_nan=False)
PARAMS = st.dictionaries(st.text(max_size=12), EXACT_VALUES, max_size=5)


@st.composite
def well_formed(draw: st.DrawFn) -> tuple[list[Any], Request | Response | Notification]:
    kind = draw(st.sampled_from(["request", "response", "notification"]))
    params = draw(PARAMS)
    wire_params = [params] if params or draw(st.booleans()) else []
    if kind == "request":
        msgid = draw(st.integers(0, MAX_MSGID))
        method = draw(st.text(min_size=1, max_size=30))
        return [0, msgid, method, wire_params], Request(msgid, method, params)
    if kind == "response":
        msgid = draw(INT64)
        error = draw(st.one_of(st.none(), st.tuples(st.integers(0, 99), st.text()).map(list)))
        result = draw(EXACT_VALUES)
        return [1, msgid, error, result], Response(msgid, error, result)
    method = draw(st.text(min_size=1, max_size=30))
    return [2, method, wire_params], Notification(method, params)


@FUZZ_SETTINGS
@given(messages=st.lists(well_formed(), min_size=1, max_size=4), chunks=CHUNKS)
def test_well_formed_messages_round_trip(
    messages: list[tuple[list[Any], Request | Response | Notification]], chunks: list[int]
) -> None:
    stream = b"".join(pack(wire) for wire, _ in messages)
    decoded, error = decode_stream(stream, chunks, MAX_REQUEST_BYTES)
    assert error is None
    assert decoded == [expected for _, expected in messages]


# -- 2. get path validation ----------------------------------------------------------------------

MARKER = f"FUZZ-SECRET-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def path_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace, an outside secret (a .md file, so only containment protects it) and hostile
    links and special files inside the workspace pointing at it."""
    base = tmp_path_factory.mktemp("fuzzpaths")
    ws = base / "ws"
    (ws / "memory" / "sub").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\nevergreen one\nevergreen two\n")
    (ws / "memory" / "a.md").write_text("alpha\nbeta\n")
    (ws / "memory" / "sub" / "b.md").write_text("gamma\n")
    (ws / "SOUL.md").write_text("not a memory file\n")
    outside = base / "outside"
    outside.mkdir()
    for secret in (outside / "secret.md", base / "secret.md", base / "MEMORY.md"):
        secret.write_text(f"{MARKER}\nsecond line {MARKER}\n")
    (ws / "memory" / "evil.md").symlink_to(outside / "secret.md")
    (ws / "memory" / "up.md").symlink_to("../../secret.md")  # relative, out of the root
    (ws / "memory" / "out").symlink_to(outside, target_is_directory=True)
    (ws / "memory" / "loop.md").symlink_to("loop.md")
    (ws / "memory" / "inside.md").symlink_to("a.md")  # allowed: lands on a memory file
    os.mkfifo(ws / "memory" / "fifo.md")  # opening it must not block
    return ws


def path_fragments(ws: Path) -> list[str]:
    base = ws.parent
    return [
        *("", ".", "..", "...", "/", "//", "memory", "sub", "out", "outside", "ws"),
        *("MEMORY.md", "memory.md", "MEMORY.MD", "DREAMS.md", "SOUL.md", "a.md", "A.MD"),
        *("evil.md", "up.md", "loop.md", "inside.md", "fifo.md", "secret.md", "b.md", ".md"),
        *("~", "~root", "%2e", "%2e%2e", "%2E%2E%2F", "..%2f", "%c0%ae%c0%ae", "%00"),
        *("\x00", "\\", "..\\", " ", "\t", "\n", "\x7f", "\u200b", "\ufeff"),
        # Unicode look-alikes of '.', '..' and '/'.
        *("\u2024", "\u2025", "\uff0e", "\uff0e\uff0e", "\u3002", "\ufe52", "\u2215", "\u2044"),
        *("\uff0f", "\u0338", "e\u0301.md", "\u00e9.md"),
        str(ws),
        str(base),
        str(base / "outside"),
        str(ws / "memory"),
    ]


@st.composite
def hostile_paths(draw: st.DrawFn, ws: Path) -> str:
    piece = st.one_of(st.sampled_from(path_fragments(ws)), st.text(max_size=8))
    parts = draw(st.lists(piece, max_size=8))
    sep = draw(st.sampled_from(["/", "/", "//", "/./", ""]))
    prefix = draw(st.sampled_from(["", "", "/", "./", "memory/", f"{ws}/", f"{ws.parent}/"]))
    suffix = draw(st.sampled_from(["", "", ".md", "/a.md", "/..", "\x00.md", "/evil.md"]))
    return prefix + sep.join(parts) + suffix


def long_paths() -> st.SearchStrategy[str]:
    unit = st.sampled_from(["../", "a/", "memory/", "\uff0e\uff0e/", "x" * 255 + "/", "./"])
    return st.builds(
        lambda head, u, n, tail: head + u * n + tail,
        st.sampled_from(["", "memory/", "/"]),
        unit,
        st.integers(10, 2500),
        st.sampled_from(["a.md", "evil.md", "secret.md", ""]),
    )


@FUZZ_SETTINGS
@given(data=st.data())
def test_get_paths_never_leave_the_workspace(path_ws: Path, data: st.DataObject) -> None:
    path = data.draw(
        st.one_of(
            hostile_paths(path_ws),
            hostile_paths(path_ws),
            st.text(max_size=60),
            st.text(alphabet="./~%2e\x00\\memoryMEMORY.md\uff0e", max_size=60),
            long_paths(),
        ),
        label="path",
    )
    from_line = data.draw(st.integers(1, 3), label="from")
    lines = data.draw(st.integers(1, 200), label="lines")
    try:
        result = read_lines(path_ws, path, from_line=from_line, lines=lines)
    except (PathRefused, BadRequest):
        return
    assert isinstance(result, GetResult)
    assert MARKER not in result.text
    rel, real = resolve_memory_path(path_ws, path)
    root = path_ws.resolve()
    assert result.path == rel
    assert real.is_relative_to(root) and real != root, f"{path!r} resolved to {real}"
    if not result.missing:
        assert result.text in real.read_text(encoding="utf-8")


def test_get_hostile_corner_cases(path_ws: Path) -> None:
    """The entries planted in the fixture, each on its own (the property explores around them)."""
    refused = [
        "memory/evil.md",
        "memory/up.md",
        "memory/out/secret.md",
        "memory/loop.md",
        "memory/fifo.md",
        "../secret.md",
        "../MEMORY.md",
        str(path_ws.parent / "outside" / "secret.md"),
        "memory/a.md\x00",
        "~/MEMORY.md",
        "memory/" + "../" * 3000 + "secret.md",
    ]
    for path in refused:
        with pytest.raises(PathRefused):
            read_lines(path_ws, path)
    assert read_lines(path_ws, "memory/inside.md").text == "alpha\nbeta"
    with pytest.raises(BadRequest):
        read_lines(path_ws, 42)  # type: ignore[arg-type]


# -- 3. live frames against a running daemon -----------------------------------------------------

THREADS = 8
PROBE_EVERY = 500
SOCKET_TIMEOUT = 60.0  # a hang guard, not a timing assertion
FD_SLACK = 5
RSS_BUDGET = 20 * 1024 * 1024

BLOCK_64K = b"x" * 65536  # reused for the one oversized push, so clients allocate little
WORKSPACE = "fz"

# Wrong-typed values, each invalid for every parameter of every method: strings never appear,
# so a "workspace" can never name a real directory (which memd would add as a workspace).
GARBAGE: list[Any] = [
    -1,
    2**40,
    -(2**63),
    2**64 - 1,
    1.5,
    -0.5,
    float("nan"),
    float("inf"),
    [],
    [1, "x"],
    {},
    {"k": [None]},
    b"\x00\xff",
    b"",
]
METHOD_PARAMS: dict[str, list[str]] = {
    "hello": ["client", "protocol", "agent_id", "session_key", "chat_type", "channel"],
    "status": ["workspace"],
    "search": [
        *("workspace", "query", "max_results", "min_score", "mode"),
        *("wait_ms", "decay", "mmr", "sources", "caller"),
    ],
    "get": ["workspace", "path", "from", "lines", "caller"],
    "append": ["workspace", "text", "path", "flush", "caller"],
    "context": ["workspace", "max_chars"],  # (caller {} is a valid caller: no garbage here)
    "flush_plan": ["workspace"],
    "record_recall": ["workspace", "query", "results"],
    "promote": [
        *("workspace", "apply", "explain", "include_promoted", "limit"),
        *("min_score", "min_recall_count", "min_unique_queries"),
    ],
    "dream": ["workspace", "phase", "apply"],
    "reindex": ["workspace", "force", "wait"],
    "workspace_add": ["path", "name", "extra_paths", "sessions_dir", "agent_id"],
    "workspace_remove": ["workspace"],
    "workspace_list": [],
}
# Strings that must each get a typed error; none names a real directory, which memd would add as
# a workspace. ("~user" forms are left to test_workspace_naming_an_unknown_user_is_a_typed_error.)
HOSTILE_WORKSPACES = [
    *("", " ", "FZ", " fz", "fz ", "fz\x00", "\x00", "../fz", "fz/..", "./fz", "%66z"),
    *("/nonexistent-memd-fuzz", "/nonexistent-memd-fuzz/fz", "/\x00", "\uff0e\uff0e/fz"),
    "x" * 5000,
]
# Each must be refused ("memory/%2e%2e/x.md" and fullwidth dots are plain, missing names).
HOSTILE_GET_PATHS = [
    *("../../etc/passwd", "/etc/passwd", "/etc/passwd.md", "memory/../../secret.md", "~/x.md"),
    *("memory/a.md\x00", "memory\\a.md", "SOUL.md", "memory", "", " ", "..", "/", "\x00"),
    *("memory/../MEMORY.md", "//etc/passwd.md", "memory/a.md\x07", "a" * 5000 + ".md"),
]
WORKSPACE_METHODS = [m for m, names in METHOD_PARAMS.items() if "workspace" in names]
UNKNOWN_METHODS = ["drop_tables", "HELLO", "hello ", "__init__", "_ws", "../get", "\u0000", "é"]


def _msgid(rng: random.Random) -> int:
    return rng.randrange(MAX_MSGID + 1)


def reply_frame(rng: random.Random) -> tuple[bytes, int, str]:
    """A well-formed request the daemon must answer (with an error, never an internal one)."""
    msgid = _msgid(rng)
    if rng.random() < 0.3:
        method = rng.choice(UNKNOWN_METHODS + [f"m{rng.getrandbits(32):x}"])
        params: list[Any] = rng.choice([[], [{"x": rng.choice(GARBAGE)}], [{}]])
        return pack([0, msgid, method, params]), msgid, method
    assert set(METHOD_PARAMS) == set(METHODS), "update METHOD_PARAMS for the new methods"
    if rng.random() < 0.15:  # a wrong workspace or get path of the right type
        method = rng.choice(WORKSPACE_METHODS)
        args: dict[str, Any] = {"workspace": rng.choice(HOSTILE_WORKSPACES)}
        if method == "get" and rng.random() < 0.7:
            args = {"workspace": WORKSPACE, "path": rng.choice(HOSTILE_GET_PATHS)}
        return pack([0, msgid, method, [args]]), msgid, method
    method = rng.choice(sorted(METHOD_PARAMS))
    names = METHOD_PARAMS[method] + ["colour", "", "workspace\x00"]
    chosen = rng.sample(names, rng.randint(1, min(3, len(names))))
    args = {name: rng.choice(GARBAGE) for name in chosen}
    if "workspace" not in args and rng.random() < 0.7:
        args["workspace"] = WORKSPACE
    return pack([0, msgid, method, [args]]), msgid, method


def _valid_request(rng: random.Random) -> bytes:
    choice = rng.choice(
        [
            [0, _msgid(rng), "hello", []],
            [0, _msgid(rng), "get", [{"workspace": WORKSPACE, "path": "MEMORY.md"}]],
            [0, _msgid(rng), "search", [{"workspace": WORKSPACE, "query": "orion"}]],
        ]
    )
    return pack(choice)


def bad_frame(rng: random.Random) -> bytes:
    """A frame the daemon must refuse by closing the connection, without reading more."""
    msgid = _msgid(rng)
    kind = rng.randrange(12)
    if kind == 0:
        return b"\xdd\xff\xff\xff\xff"  # array header claiming 2^32-1 items
    if kind == 1:
        return rng.choice([b"\xdf\x00\x0f\x42\x40", b"\xdf\xff\xff\xff\xff", b"\xdc\xff\xff"])
    if kind == 2:
        depth = rng.choice([10_000, 1_025, 5_000])
        return b"\x91" * depth + b"\xc0"  # nested arrays
    if kind == 3:
        prefix = b"\x94\x00" + msgpack.packb(msgid) + b"\xa3get\x91"  # nesting inside params
        return prefix + b"\x81\xa1k" * 3000 + b"\xc0"
    if kind == 4:  # maps with keys that are not strings
        return rng.choice(
            [
                msgpack.packb({rng.randint(-5, 5): "x"}),
                msgpack.packb([0, msgid, "get", [{1: "MEMORY.md"}]]),
                msgpack.packb([0, msgid, "hello", [{1.5: None}]]),
                b"\x81\xc0\xc0",
                b"\x94\x00\x01\xa5hello\x91\x81\x90\xc0",
            ]
        )
    if kind == 5:  # invalid UTF-8 in the method name or a parameter
        return rng.choice(
            [
                b"\x94\x00\x01\xa2\xff\xfe\x90",
                b"\x94\x00\x01\xa3get\x91\x81\xa4path\xa3\xed\xa0\x80",  # an encoded surrogate
            ]
        )
    if kind == 6:  # ext types, which the protocol never uses
        return rng.choice([b"\xd4\x01\x00", b"\xd6\xff\x00\x00\x00\x00", b"\xc7\x01\x05\x00"])
    if kind == 7:
        return b"\xc1"
    wrong = [
        [1, msgid, None, None],  # clients do not send responses
        [True, msgid, None, {}],
        [3, msgid, "hello", []],
        [-1, "hello"],
        [],
        {},
        {"method": "hello"},
        5,
        None,
        "hello",
        [0, msgid, "hello"],
        [0, msgid, "hello", [], "extra"],
        [0, -1, "hello", []],
        [0, MAX_MSGID + 1, "hello", []],
        [0, True, "hello", []],
        [0, 1.5, "hello", []],
        [0, str(msgid), "hello", []],
        [0, msgid, "", []],
        [0, msgid, 7, []],
        [0, msgid, b"hello", []],
        [0, msgid, "hello", "params"],
        [0, msgid, "hello", {"client": "x"}],
        [0, msgid, "hello", [1]],
        [0, msgid, "hello", [{}, {}]],
        [0, msgid, "get", [None]],
        [2, "note", "params"],
        [2, 5, []],
        [2, "note"],
    ]
    return msgpack.packb(rng.choice(wrong))


def open_ended_frame(rng: random.Random) -> bytes:
    """A frame whose fate depends on bytes that never come: sent, then the write side closed."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randint(1, 256))
    if kind == 1:
        frame = _valid_request(rng)
        return frame[: rng.randrange(1, len(frame))]  # truncated
    if kind == 2:  # str32 / bin32 claiming 4 GiB, with a little of the body
        return (
            rng.choice([b"\xdb", b"\xc6"]) + b"\xff\xff\xff\xff" + rng.randbytes(rng.randint(0, 64))
        )
    if kind == 3:
        return _valid_request(rng) + rng.randbytes(rng.randint(1, 32))
    if kind == 4:  # a valid frame with a few bytes flipped
        frame = bytearray(_valid_request(rng))
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        return bytes(frame)
    return msgpack.packb([2, "note", [{"x": 1}]]) + rng.randbytes(rng.randint(0, 16))


def drain_until_closed(sock: socket.socket) -> None:
    """Read until the daemon closes the connection (EOF or reset); a hang fails the test."""
    while True:
        try:
            if not sock.recv(65536):
                return
        except ConnectionResetError:
            return


def read_reply(sock: socket.socket, unpacker: msgpack.Unpacker) -> Any:
    while True:
        for obj in unpacker:
            return obj
        data = sock.recv(65536)
        if not data:
            raise AssertionError("the daemon closed a connection that sent a well-formed request")
        unpacker.feed(data)


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frames = 0
        self.connections = 0
        self.bad_connections = 0
        self.next_probe = PROBE_EVERY
        self.probes = 0
        self.errors: list[str] = []
        self.stop = threading.Event()

    def done(self, frames: int, bad: bool) -> bool:
        """Count one finished connection; True when this caller should run a health probe."""
        with self.lock:
            self.frames += frames
            self.connections += 1
            self.bad_connections += bad
            if self.frames >= self.next_probe:
                self.next_probe = (self.frames // PROBE_EVERY + 1) * PROBE_EVERY
                return True
            return False


def probe(daemon: Daemon) -> None:
    with memd_client.connect(daemon.socket_path, timeout=SOCKET_TIMEOUT) as c:
        assert c.hello()["server"] == "memd"


def one_connection(rng: random.Random, path: str, budget: int) -> tuple[int, bool]:
    """Up to three answered requests, then one bad or open-ended frame; returns (frames, bad)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(SOCKET_TIMEOUT)
        sock.connect(path)
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        sent = 0
        for _ in range(min(rng.choice([0, 0, 1, 2, 3]), budget - 1)):
            frame, msgid, method = reply_frame(rng)
            sock.sendall(frame)
            sent += 1
            reply = read_reply(sock, unpacker)
            assert isinstance(reply, list) and reply[:2] == [1, msgid], f"{method}: {reply!r}"
            error = reply[2]
            if method not in METHOD_PARAMS:
                assert error and error[0] == Code.UNKNOWN_METHOD, f"{method!r}: {reply!r}"
            elif method != "hello":  # hello ignores what it does not check (client, protocol)
                assert error is not None, f"{method} accepted garbage: {reply!r}"
            if error is not None:
                assert isinstance(error[1], str) and error[0] != Code.INTERNAL, (
                    f"{method}: {error!r}"
                )
        if rng.random() < 0.55:
            sock.sendall(bad_frame(rng))
            drain_until_closed(sock)  # the daemon must close it: we keep our side open
            return sent + 1, True
        if rng.random() < 0.005:  # an over-limit message: BufferFull on the daemon's side
            try:
                sock.sendall(b"\xdb" + (MAX_REQUEST_BYTES + 65536).to_bytes(4, "big"))
                for _ in range(MAX_REQUEST_BYTES // len(BLOCK_64K) + 2):
                    sock.sendall(BLOCK_64K)
            except (BrokenPipeError, ConnectionResetError):
                pass
            drain_until_closed(sock)
            return sent + 1, True
        try:
            sock.sendall(open_ended_frame(rng))
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        drain_until_closed(sock)
        return sent + 1, False
    finally:
        sock.close()


def fuzz_client(daemon: Daemon, stats: Stats, seed: int, quota: int) -> None:
    rng = random.Random(seed)
    path = str(daemon.socket_path)
    left = quota
    try:
        while left > 0 and not stats.stop.is_set():
            frames, bad = one_connection(rng, path, left)
            left -= frames
            if stats.done(frames, bad):
                probe(daemon)
                with stats.lock:
                    stats.probes += 1
    except BaseException:
        stats.errors.append(f"client seed {seed}:\n{traceback.format_exc()}")
        stats.stop.set()


def trimmed_rss(proc: psutil.Process) -> int:
    """RSS after asking glibc to return free heap pages (for failure messages only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(proc.memory_info().rss)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    done = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if check():
            return True
        done.wait(0.05)
    return check()


@pytest.fixture
def fuzz_ws(tmp_path: Path) -> Path:
    root = tmp_path / "fz"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    (root / "memory" / "2026-03-01.md").write_text("- billing moved to Postgres 16\n")
    return root


def warm_up(daemon: Daemon) -> None:
    """A few hundred good requests from as many threads as the fuzz run uses."""
    errors: list[str] = []

    def worker() -> None:
        try:
            for _ in range(4):
                with memd_client.connect(daemon.socket_path, timeout=SOCKET_TIMEOUT) as c:
                    for _ in range(3):
                        c.hello()
                        c.call("workspace_list")
                        c.call("get", workspace=WORKSPACE, path="MEMORY.md")
                        c.call("search", workspace=WORKSPACE, query="staging", mode="keyword")
                        c.call("status", workspace=WORKSPACE)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=worker, name=f"warm-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_live_malformed_frames(fuzz_ws: Path, memd_log: pytest.LogCaptureFixture) -> None:
    seed = int(os.environ.get("MEMD_FUZZ_SEED") or random.randrange(1 << 32))
    where = f"(MEMD_FUZZ_SEED={seed})"
    proc = psutil.Process()
    with running_daemon() as daemon:
        server = daemon.parts.server if daemon.parts else None
        assert server is not None
        with memd_client.connect(daemon.socket_path, timeout=SOCKET_TIMEOUT) as c:
            c.call("workspace_add", path=str(fuzz_ws), name=WORKSPACE)
            c.call("reindex", workspace=WORKSPACE)
        warm_up(daemon)
        assert wait_for(lambda: server.connections == 0, 5.0)
        gc.collect()
        rss_before = proc.memory_info().rss
        fds_before = fd_count()
        bad_before = server.closed_bad

        stats = Stats()
        quotas = [FUZZ_FRAMES // THREADS + (i < FUZZ_FRAMES % THREADS) for i in range(THREADS)]
        threads = [
            threading.Thread(
                target=fuzz_client, args=(daemon, stats, seed + i, quotas[i]), name=f"fuzz-{i}"
            )
            for i in range(THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not stats.errors, f"{where} {len(stats.errors)} client(s) failed:\n{stats.errors[0]}"
        assert stats.frames == FUZZ_FRAMES
        probe(daemon)  # still serving at the end

        # The daemon's connection threads notice closed sockets within their 0.5 s recv timeout.
        settled = wait_for(
            lambda: server.connections == 0 and abs(fd_count() - fds_before) <= FD_SLACK, 5.0
        )
        fds_after = fd_count()
        assert settled, f"{where} fds {fds_before} -> {fds_after}, {server.connections} open"
        gc.collect()
        growth = proc.memory_info().rss - rss_before
        if growth >= RSS_BUDGET:  # say how much of it is memory malloc kept but could give back
            trimmed = trimmed_rss(proc) - rss_before
            pytest.fail(
                f"{where} RSS grew by {growth / 2**20:.1f} MiB "
                f"({trimmed / 2**20:.1f} MiB after malloc_trim)"
            )
        closed_bad = server.closed_bad - bad_before
        assert closed_bad > 0, f"{where} the daemon closed no connection for bad input"
        assert stats.probes >= FUZZ_FRAMES // PROBE_EVERY - THREADS

    crashes = [r for r in memd_log.records if r.exc_info]
    assert not crashes, f"{where} traceback in the log: {crashes[0].getMessage()}"
    print(
        f"\nfuzz {where}: {stats.frames} frames on {stats.connections} connections, "
        f"{stats.bad_connections} with a bad frame, daemon closed {closed_bad} for bad input, "
        f"{stats.probes} probes, RSS {growth / 2**20:+.1f} MiB, fds {fds_before} -> {fds_after}"
    )


def test_workspace_naming_an_unknown_user_is_a_typed_error(
    memd_log: pytest.LogCaptureFixture,
) -> None:
    """Found by the live run (a flipped byte turned "fz" into "~z"): ``Path.expanduser`` raises
    RuntimeError for an unknown user, which reached the client as INTERNAL with a traceback logged.
    A wrong workspace string must be a typed error like any other."""
    with running_daemon() as daemon:
        with memd_client.connect(daemon.socket_path, timeout=SOCKET_TIMEOUT) as c:
            for ref in ("~memd-fuzz-no-such-user", "~memd-fuzz-no-such-user/memory"):
                with pytest.raises(MemdError) as caught:
                    c.call("status", workspace=ref)
                assert caught.value.code in (Code.UNKNOWN_WORKSPACE, Code.BAD_REQUEST), (
                    f"{ref!r}: {caught.value.code.name}: {caught.value}"
                )
            assert c.hello()["server"] == "memd"
    crashes = [r for r in memd_log.records if r.exc_info]
    assert not crashes, f"traceback in the log: {crashes[0].getMessage()}"


# -- 4. atheris (libFuzzer), when it is installed ------------------------------------------------

ATHERIS_HARNESS = textwrap.dedent(
    """
    import sys

    import atheris

    with atheris.instrument_imports():
        import msgpack
        from memd_client.protocol import ProtocolError, make_unpacker, parse


    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        chunk = fdp.ConsumeIntInRange(1, 64)
        limit = fdp.PickValueInList([1 << 20, 512, 16])
        payload = fdp.ConsumeBytes(fdp.remaining_bytes())
        unpacker = make_unpacker(limit)
        try:
            for i in range(0, len(payload), chunk):
                unpacker.feed(payload[i : i + chunk])
                for n, obj in enumerate(unpacker):
                    assert n <= len(payload), "more messages than bytes"
                    try:
                        parse(obj)
                    except ProtocolError:
                        pass
        except (ValueError, msgpack.BufferFull):
            pass  # documented; anything else is a finding


    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
    """
)


def test_atheris_decoder(tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris not installed")
    # libFuzzer exits the process when it is done, so the harness runs in a child interpreter.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds = [
        b"\x01" + pack([0, 1, "hello", []]),
        b"\x07" + pack([0, 2, "get", [{"workspace": "w", "path": "MEMORY.md", "from": 1}]]),
        b"\x03" + pack([1, 3, [2, "bad"], None]) + pack([2, "note", [{}]]),
        b"\x02" + b"\x91" * 50 + b"\xc0",
        b"\x05" + b"\xdd\xff\xff\xff\xff",
    ]
    for i, seed in enumerate(seeds):
        (corpus / f"seed{i}").write_bytes(seed)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            ATHERIS_HARNESS,
            f"-runs={ATHERIS_RUNS}",
            "-max_len=4096",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    tail = run.stderr[-4000:]
    assert run.returncode == 0, f"atheris found a crash (exit {run.returncode}):\n{tail}"
    assert f"Done {ATHERIS_RUNS} runs" in run.stderr, tail
