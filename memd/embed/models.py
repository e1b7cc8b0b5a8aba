"""The model directory: pull GGUF files into it (resume, checksums) and list what it holds.

Stdlib HTTP only, so ``memctl model pull`` works before any optional dependency is installed.
Pulling, verifying and listing share the directory's naming rules (partial files, checksum
sidecars, the lock), so they stay here; filling a ``.part`` over HTTP is memd/embed/download.py
and hashing files and their sidecars is memd/embed/checksums.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from memd.atomicfile import fsync_dir
from memd.embed.checksums import (
    _SHA256,
    BLOCK,
    _hash_file,
    _read_sidecar,
    _sha256_of,
    _write_sidecar,
)
from memd.embed.download import _download
from memd.embed.model_uri import ModelSource, resolve_uri
from memd.embed.progress import Progress, progress_bar
from memd_client.errors import Busy, ConfigError, ProviderUnavailable

# resolve_uri, ModelSource and progress_bar are re-exported: callers need only this module.
__all__ = [
    "RECOMMENDED_MODEL_URI",
    "ModelInfo",
    "ModelSource",
    "Progress",
    "find_default_model",
    "list_models",
    "local_file",
    "progress_bar",
    "pull",
    "resolve_uri",
]

logger = logging.getLogger(__name__)

RECOMMENDED_MODEL_URI = "hf:cstr/multilingual-e5-small-GGUF/multilingual-e5-small-q8_0.gguf"
"""What `memctl model pull` fetches with no argument: multilingual-e5-small (94 languages, CJK
included; its vectors alone find 0.823 of LoCoMo's questions in the top 5, MiniLM's 0.719, and
hybrid search with it 0.918; see docs/benchmarks.md)."""

_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelInfo:
    """One model file in the model directory; ``partial`` marks an unfinished ``.part`` download."""

    name: str
    path: Path
    size: int
    sha256: str | None
    partial: bool


def pull(
    uri: str,
    models_dir: Path,
    *,
    sha256: str | None = None,
    progress: Progress | None = None,
    timeout: float = 30.0,
    opener: urllib.request.OpenerDirector | None = None,
) -> Path:
    """Bring the model ``uri`` names into ``models_dir``: download it (``hf:`` or an http(s)
    URL), resuming a partial download, or copy a GGUF file on this machine (a path, or
    ``file://``).

    Args:
        sha256: the expected checksum; else the URI's ``#sha256=`` or one the server publishes.
        progress: called with (bytes done, total bytes or None) as the download goes.
        timeout: seconds allowed for connecting and for each read.
        opener: a urllib opener to use instead of the default one (proxies, tests).
    """
    local = local_file(uri)
    if local is not None:
        return _copy_in(
            local, models_dir, sha256=_expected_sha256(sha256, None, uri), progress=progress
        )
    source = resolve_uri(uri)
    expected = _expected_sha256(sha256, source, uri)
    models_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = models_dir / source.filename
    if _already_present(final, expected):
        logger.info("%s is already present", final)
        return final
    part = _sibling(final, ".part")
    with open(part, "a+b") as f:  # append mode: every write lands at the end of the .part
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another pull of {source.filename} is running") from None
        try:
            got, published = _download(source, f, progress, timeout, opener)
        except BaseException:
            if os.fstat(f.fileno()).st_size == 0:
                part.unlink(missing_ok=True)
            raise
        _verify(f, part, source, expected or published, got)
        os.replace(part, final)
    _write_sidecar(_sibling(final, ".sha256"), got, final.name)
    fsync_dir(models_dir)
    logger.info("pulled %s (sha256 %s)", final, got)
    return final


def local_file(uri: str) -> Path | None:
    """The file ``uri`` names on this machine (a path, ``~/...``, ``file:///...``), or None
    when it is a download (``hf:``, ``http(s)://``)."""
    text = uri.strip()
    if text.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path))
    if text.startswith(("hf:", "http://", "https://")):
        return None
    path = Path(text).expanduser()
    if text.startswith(("/", ".", "~")) or os.sep in text or path.exists():
        return path
    return None


def _copy_in(
    source: Path, models_dir: Path, *, sha256: str | None, progress: Progress | None
) -> Path:
    """Copy the GGUF file ``source`` into ``models_dir`` (whole or not at all), with its
    checksum beside it; a file already there is only checked."""
    try:
        st = source.stat()
        with open(source, "rb") as f:
            magic = f.read(len(_MAGIC))
    except FileNotFoundError:
        raise ConfigError(f"no model file at {source}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc.strerror or exc}") from None
    if not source.is_file():
        raise ConfigError(f"{source} is not a file")
    if magic != _MAGIC:
        raise ConfigError(f"{source} is not a GGUF model file (it starts with {magic!r})")
    name = source.name if source.name.lower().endswith(".gguf") else source.name + ".gguf"
    models_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = models_dir / name
    if final.exists() and os.path.samefile(final, source):
        got = _sha256_of(final)
    else:
        part = _sibling(final, ".part")
        with open(source, "rb") as src, open(part, "wb") as out:
            hasher, done = hashlib.sha256(), 0
            while block := src.read(BLOCK):
                out.write(block)
                hasher.update(block)
                done += len(block)
                if progress:
                    progress(done, st.st_size)
            out.flush()
            os.fsync(out.fileno())
        got = hasher.hexdigest()
        if sha256 is not None and got != sha256:
            part.unlink(missing_ok=True)
            raise ProviderUnavailable(
                f"checksum mismatch for {source}: expected {sha256}, got {got}; nothing copied"
            )
        os.replace(part, final)
    if sha256 is not None and got != sha256:
        raise ProviderUnavailable(f"checksum mismatch for {final}: expected {sha256}, got {got}")
    _write_sidecar(_sibling(final, ".sha256"), got, final.name)
    fsync_dir(models_dir)
    logger.info("copied %s into %s (sha256 %s)", source, final, got)
    return final


def _expected_sha256(sha256: str | None, source: ModelSource | None, uri: str) -> str | None:
    if sha256 is None:
        return source.sha256 if source else None
    if not _SHA256.fullmatch(sha256.lower()):
        raise ConfigError(f"bad sha256 {sha256!r}: expected 64 hex digits")
    if source and source.sha256 and source.sha256 != sha256.lower():
        raise ConfigError(f"the sha256 given and the one in {uri!r} differ")
    return sha256.lower()


def _already_present(final: Path, expected: str | None) -> bool:
    """True when ``final`` exists and its recorded (or, failing that, computed) sha256 fits."""
    if not final.is_file():
        return False
    recorded = _read_sidecar(_sibling(final, ".sha256"))
    if recorded is not None:
        return expected is None or recorded == expected
    if expected is None:
        return False  # nothing to trust it by: fetch it again
    with open(final, "rb") as f:
        if _hash_file(f) != expected:
            return False
    _write_sidecar(_sibling(final, ".sha256"), expected, final.name)
    return True


def _verify(f: IO[bytes], part: Path, source: ModelSource, expected: str | None, got: str) -> None:
    """Check the finished .part: the right checksum (if known), and GGUF; delete it otherwise."""
    f.seek(0)
    magic = f.read(len(_MAGIC))
    problem = None
    if expected is not None and got != expected:
        problem = f"checksum mismatch for {source.filename}: expected {expected}, got {got}"
    elif magic != _MAGIC:
        problem = f"{source.filename} is not a GGUF file (it starts with {magic!r})"
    if problem:
        part.unlink(missing_ok=True)
        raise ProviderUnavailable(f"{problem}; the download was deleted")
    if expected is None:
        logger.info("%s: no checksum published; recorded sha256 %s", source.filename, got)


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def list_models(models_dir: Path) -> list[ModelInfo]:
    """List the GGUF files and unfinished downloads in ``models_dir``, sorted by name."""
    if not models_dir.is_dir():
        return []
    found = []
    for path in models_dir.iterdir():
        name = path.name
        partial = name.lower().endswith(".gguf.part")
        if partial:
            name = name[: -len(".part")]
        elif not name.lower().endswith(".gguf"):
            continue
        try:
            if name.startswith(".") or not path.is_file():
                continue
            size = path.stat().st_size
        except FileNotFoundError:  # a .part renamed by a pull finishing as we look
            continue
        sha = None if partial else _read_sidecar(_sibling(path, ".sha256"))
        found.append(ModelInfo(name, path, size, sha, partial))
    return sorted(found, key=lambda m: (m.name, m.partial))


def find_default_model(models_dir: Path) -> Path | None:
    """Return the only complete model in ``models_dir``, or the newest of several; None if none."""
    complete = [m.path for m in list_models(models_dir) if not m.partial]
    if not complete:
        return None
    return max(complete, key=lambda p: (p.stat().st_mtime_ns, p.name))
