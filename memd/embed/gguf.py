"""Read the key/value metadata of a GGUF file without loading the model (dims, context, name)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUFError", "read_metadata"]

_MAGIC = b"GGUF"
# GGUF value types: uint8 int8 uint16 int16 uint32 int32 float32 bool string array uint64 int64 float64
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a readable GGUF model."""


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("truncated GGUF header")
    return data


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", _read(f, 8))
    if length > 1 << 24:
        raise GGUFError("implausible string length in GGUF header")
    return _read(f, length).decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int, keep: bool) -> object:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        (item_type,) = struct.unpack("<I", _read(f, 4))
        (count,) = struct.unpack("<Q", _read(f, 8))
        if item_type in _SCALARS and not keep:
            f.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
            return None
        items = [_value(f, item_type, keep) for _ in range(count)]
        return items if keep else None
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_metadata(path: Path | str) -> dict[str, object]:
    """Return the metadata of a GGUF file; arrays (the vocabulary) are skipped, not kept."""
    try:
        with open(path, "rb") as f:
            if _read(f, 4) != _MAGIC:
                raise GGUFError(f"{path} is not a GGUF file")
            (version,) = struct.unpack("<I", _read(f, 4))
            if version < 2:
                raise GGUFError(f"{path}: GGUF version {version} is too old")
            _tensors, count = struct.unpack("<QQ", _read(f, 16))
            meta: dict[str, object] = {"gguf.version": version}
            for _ in range(count):
                key = _string(f)
                (vtype,) = struct.unpack("<I", _read(f, 4))
                value = _value(f, vtype, keep=False)
                if value is not None:
                    meta[key] = value
            return meta
    except OSError as exc:
        raise GGUFError(f"cannot read {path}: {exc.strerror or exc}") from None
