"""The sha256 of model files: hashing them in blocks, and the ``sha256sum``-style sidecar beside
each file that records it.

Both a pull and a copy into the model directory (memd/embed/models.py) and the download itself
(memd/embed/download.py) hash what they write, and listing the directory reads the sidecars;
they share these helpers, which know nothing of where the bytes came from.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import IO

from memd.atomicfile import write_atomic

BLOCK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return _hash_file(f)


def _hash_into(f: IO[bytes], hasher: hashlib._Hash, limit: int | None = None) -> None:
    left = limit
    while left is None or left > 0:
        block = f.read(BLOCK if left is None else min(BLOCK, left))
        if not block:
            break
        hasher.update(block)
        if left is not None:
            left -= len(block)


def _hash_file(f: IO[bytes]) -> str:
    hasher = hashlib.sha256()
    f.seek(0)
    _hash_into(f, hasher)
    return hasher.hexdigest()


def _read_sidecar(path: Path) -> str | None:
    """The sha256 in a ``sha256sum``-style file, or None when there is none or it is malformed."""
    try:
        words = path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return None
    return words[0].lower() if words and _SHA256.fullmatch(words[0].lower()) else None


def _write_sidecar(path: Path, sha: str, name: str) -> None:
    """Record ``sha`` in the format of ``sha256sum``, so ``sha256sum -c`` can check it too."""
    write_atomic(path, f"{sha}  {name}\n".encode())
