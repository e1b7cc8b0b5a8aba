"""Write minimal GGUF headers (metadata only, no tensors) for tests that need no real model, and
damaged copies of a real one (its weights' scales set to NaN or zero)."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import pytest

# Tests that load a GGUF through llama-cpp-python (the [local] extra) skip without it, saying
# so; under CI, where .ci/run installs it, a missing llama-cpp-python fails them instead.
needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None and not os.environ.get("CI"),
    reason="llama-cpp-python is not installed (pip install -e '.[local]')",
)


def _string(s: str) -> bytes:
    data = s.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: Path, meta: dict[str, str | int]) -> Path:
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta))
    for key, value in meta.items():
        out += _string(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + _string(value)
        else:
            out += struct.pack("<I", 4) + struct.pack("<I", value)
    path.write_bytes(out)
    return path


def bert_header(path: Path, dims: int = 8, context: int = 64, name: str = "Tiny Test") -> Path:
    return write_gguf(
        path,
        {
            "general.architecture": "bert",
            "general.name": name,
            "bert.embedding_length": dims,
            "bert.context_length": context,
        },
    )


# -- damaged copies of a real model -----------------------------------------------------------

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
Q8_0 = 8  # ggml type: blocks of an fp16 scale and 32 int8 weights
_Q8_0_BLOCK = 34


def _read_value(f: BinaryIO, vtype: int) -> object:
    if vtype in _SCALAR_SIZES:
        return f.read(_SCALAR_SIZES[vtype])
    if vtype == 8:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", "replace")
    (item, count) = struct.unpack("<IQ", f.read(12))
    return [_read_value(f, item) for _ in range(count)]


def gguf_layout(path: Path) -> tuple[int, dict[str, tuple[tuple[int, ...], int, int]], list[str]]:
    """(offset of the tensor data, {tensor name: (dims, ggml type, offset)}, vocabulary)."""
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
        _version, n_tensors, n_meta = struct.unpack("<IQQ", f.read(20))
        tokens: list[str] = []
        alignment = 32
        for _ in range(n_meta):
            (n,) = struct.unpack("<Q", f.read(8))
            key = f.read(n).decode()
            (vtype,) = struct.unpack("<I", f.read(4))
            value = _read_value(f, vtype)
            if key == "tokenizer.ggml.tokens":
                tokens = [str(t) for t in value]  # type: ignore[attr-defined]
            elif key == "general.alignment":
                (alignment,) = struct.unpack("<I", value)  # type: ignore[arg-type]
        tensors: dict[str, tuple[tuple[int, ...], int, int]] = {}
        for _ in range(n_tensors):
            (n,) = struct.unpack("<Q", f.read(8))
            name = f.read(n).decode()
            (ndims,) = struct.unpack("<I", f.read(4))
            dims = struct.unpack(f"<{ndims}Q", f.read(8 * ndims))
            gtype, offset = struct.unpack("<IQ", f.read(12))
            tensors[name] = (dims, gtype, offset)
        start = -(-f.tell() // alignment) * alignment
    return start, tensors, tokens


def damaged_copy(
    model: Path, dst: Path, scale: float, *, tokens: tuple[str, ...] | None = None
) -> Path:
    """Copy ``model`` (a Q8_0 GGUF) with the scales of its Q8_0 weights set to ``scale``: of
    every such tensor, or with ``tokens`` only of those words' rows of the token embeddings
    (texts holding one of them then embed to NaN, other texts as before)."""
    shutil.copyfile(model, dst)
    start, tensors, vocab = gguf_layout(dst)
    value = struct.pack("<e", scale)
    with open(dst, "r+b") as f:
        for name, (dims, gtype, offset) in tensors.items():
            if gtype != Q8_0 or (tokens is not None and name != "token_embd.weight"):
                continue
            per_row = dims[0] // 32
            blocks: Sequence[int]
            if tokens is None:
                blocks = range(per_row * math.prod(dims[1:]))
            else:
                rows = [vocab.index("\u2581" + word) for word in tokens]
                blocks = [r * per_row + b for r in rows for b in range(per_row)]
            for block in blocks:
                f.seek(start + offset + block * _Q8_0_BLOCK)
                f.write(value)
    return dst
