"""Write minimal GGUF headers (metadata only, no tensors) for tests that need no real model."""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path

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
