"""The model directory: pull GGUF files into it (resume, checksums) and list what it holds.

Stdlib HTTP only, so ``memctl model pull`` works before any optional dependency is installed.
Over 400 lines: pulling, resuming, verifying and listing share the directory's naming rules
(partial files, checksum sidecars, the lock), which would otherwise be split across modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from memd.atomicfile import fsync_dir, write_atomic
from memd.embed.http import is_loopback
from memd.embed.model_uri import ModelSource, resolve_uri
from memd.embed.progress import Progress, progress_bar
from memd_client.errors import Busy, ConfigError, ProviderUnavailable

# resolve_uri, ModelSource and progress_bar are re-exported: callers need only this module.
__all__ = [
    "OFFLINE_ROUTES",
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

BLOCK = 1 << 20
_MAGIC = b"GGUF"
_USER_AGENT = "memd (model pull)"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-\d+/(\d+|\*)")
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d+)")
# Headers carrying the sha256 of the whole file, most trusted first. Hugging Face sends
# X-Linked-ETag on the redirect from huggingface.co to its CDN, so redirects are recorded too.
_SHA_HEADERS = ("X-Linked-ETag", "x-amz-meta-sha256", "x-goog-meta-sha256")


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


def _sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return _hash_file(f)


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


class _RedirectRecorder(urllib.request.HTTPRedirectHandler):
    """Follow redirects, keeping their headers and refusing a hop to plain http off loopback."""

    def __init__(self) -> None:
        self.seen: list[Message] = []

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        target = urllib.parse.urlsplit(newurl)
        if target.scheme != "https" and not is_loopback(target.hostname or ""):
            raise urllib.error.URLError(f"refused a redirect to {_display(newurl)}")
        self.seen.append(headers)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _download(
    source: ModelSource,
    f: IO[bytes],
    progress: Progress | None,
    timeout: float,
    opener: urllib.request.OpenerDirector | None,
) -> tuple[str, str | None]:
    """Fill the locked .part ``f``; return (its sha256, the sha256 the server published)."""
    recorder = _RedirectRecorder()
    opener = opener or urllib.request.build_opener(recorder)
    offset = os.fstat(f.fileno()).st_size
    while True:  # at most twice: a resume attempt, then a fresh start
        request = urllib.request.Request(source.url, headers={"User-Agent": _USER_AGENT})
        request.add_header("Accept-Encoding", "identity")
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            response = opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            with contextlib.closing(exc):
                match = _UNSATISFIED.fullmatch(exc.headers.get("Content-Range", "").strip())
                if exc.code != 416 or not offset:
                    raise _http_error(source, exc, offset) from None
                if match is None or int(match[1]) == offset:
                    logger.info("%s: the partial download is already complete", source.filename)
                    if progress:
                        progress(offset, offset)
                    trust_etag = exc.geturl() == source.url
                    published = _published_sha256([exc.headers, *recorder.seen], trust_etag)
                    return _hash_file(f), published
            logger.info("%s: partial download larger than the file; starting over", source.filename)
            f.truncate(0)
            offset = 0
            continue
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise _offline(source, exc, offset) from exc
        with contextlib.closing(response):
            headers = response.headers
            match = _CONTENT_RANGE.match(headers.get("Content-Range", "").strip())
            resumed = response.status == 206 and match is not None and int(match[1]) == offset
            if offset and not resumed:
                f.truncate(0)
                offset = 0
                if response.status == 206:  # a range we did not ask for: ask for the whole file
                    continue
                logger.info("%s: the server ignored the range; starting over", source.filename)
            if headers.get_content_type() == "text/html":
                raise ProviderUnavailable(
                    f"cannot download {_display(source.url)}: the server sent a web page, "
                    "not a GGUF file"
                )
            total = _total(headers, match if offset else None, recorder.seen, offset)
            redirected = response.geturl() != source.url
            published = _published_sha256([headers, *recorder.seen], not redirected)
            return _stream(response, f, source, offset, total, progress), published


def _total(
    headers: Message, match: re.Match[str] | None, seen: Sequence[Message], offset: int
) -> int | None:
    if match is not None:
        return int(match[2]) if match[2] != "*" else None
    length = headers.get("Content-Length")
    if length and length.isdigit() and headers.get("Content-Encoding", "identity") == "identity":
        return offset + int(length)
    for redirect in seen:
        size = redirect.get("X-Linked-Size", "")
        if size.isdigit():
            return int(size)
    return None


def _stream(
    response: http.client.HTTPResponse,
    f: IO[bytes],
    source: ModelSource,
    offset: int,
    total: int | None,
    progress: Progress | None,
) -> str:
    """Append the body to ``f``; return the sha256 of the whole .part.

    ``read1`` hands over what has arrived (up to a block), so a stalled or reset connection
    loses nothing already received: all of it is in the .part for the next pull to resume.
    """
    hasher = hashlib.sha256()
    if offset:
        f.seek(0)
        _hash_into(f, hasher, limit=offset)
    done = offset
    if progress:
        progress(done, total)
    while True:
        try:
            block = response.read1(BLOCK)
        except (OSError, http.client.HTTPException) as exc:
            f.flush()
            raise _offline(source, exc, done) from exc
        if not block:
            break
        try:
            f.write(block)
        except OSError as exc:
            raise ProviderUnavailable(f"cannot write {f.name}: {exc}") from exc
        hasher.update(block)
        done += len(block)
        if progress:
            progress(done, total)
    try:
        f.flush()
        if total is not None and done < total:
            raise _offline(source, f"connection closed after {done} of {total} bytes", done)
        os.fsync(f.fileno())
    except OSError as exc:
        raise ProviderUnavailable(f"cannot write {f.name}: {exc}") from exc
    return hasher.hexdigest()


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


def _published_sha256(headers: Sequence[Message], trust_etag: bool) -> str | None:
    """The sha256 a server states for the file; a plain ETag only when no redirect happened."""
    names = (*_SHA_HEADERS, "ETag") if trust_etag else _SHA_HEADERS
    for name in names:
        for message in headers:
            value = message.get(name, "").strip()
            if value.startswith("W/"):  # a weak validator says nothing about the bytes
                continue
            value = value.strip('"').lower()
            if _SHA256.fullmatch(value):
                return value
    return None


def _http_error(
    source: ModelSource, exc: urllib.error.HTTPError, offset: int
) -> ProviderUnavailable:
    hint = ""
    if exc.code in (401, 403):
        hint = "; the file may be gated or private (memd sends no credentials)"
    elif exc.code >= 500:
        hint = "; try again later" + ("; the partial file is kept" if offset else "")
    return ProviderUnavailable(
        f"cannot download {_display(source.url)}: HTTP {exc.code} {exc.reason}{hint}"
    )


OFFLINE_ROUTES = (
    "without a network, a GGUF file on this machine works: `memctl model pull "
    "/path/to/model.gguf` copies it into the model directory, or MEMD_LOCAL_MODEL="
    "/path/to/model.gguf points memd at it"
)


def _offline(source: ModelSource, exc: object, done: int) -> ProviderUnavailable:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    text = str(reason) or type(reason).__name__
    kept = "; the partial file is kept and the next pull resumes" if done else ""
    return ProviderUnavailable(
        f"cannot download {_display(source.url)}: {text}{kept}; are you offline? Until then "
        f"memd searches by keyword; {OFFLINE_ROUTES}"
    )


def _display(url: str) -> str:
    """The URL without its query, which may carry a signature or token."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


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
