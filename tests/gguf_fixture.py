"""Write minimal GGUF headers (metadata only, no tensors) for tests that need no real model."""

from __future__ import annotations

import struct
from pathlib import Path


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
