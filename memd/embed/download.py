"""Downloading a model over HTTP into its locked ``.part`` file.

A download resumes with a Range request, starts over when the server will not resume, follows
redirects (recording their headers, refusing plain http off loopback), reads the sha256 a
server publishes for the file, and says what went wrong in words a user can act on (offline,
gated, a web page instead of a file). pull (memd/embed/models.py) owns the model directory, the
lock and the checks of the finished file; this module only fills the ``.part``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from email.message import Message
from http.client import HTTPMessage
from typing import IO

from memd.embed.checksums import _SHA256, BLOCK, _hash_file, _hash_into
from memd.embed.http import is_loopback
from memd.embed.model_uri import ModelSource
from memd.embed.progress import Progress
from memd_client.errors import ProviderUnavailable

__all__ = ["OFFLINE_ROUTES"]

logger = logging.getLogger(__name__)


_USER_AGENT = "memd (model pull)"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-\d+/(\d+|\*)")
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d+)")
# Headers carrying the sha256 of the whole file, most trusted first. Hugging Face sends
# X-Linked-ETag on the redirect from huggingface.co to its CDN, so redirects are recorded too.
_SHA_HEADERS = ("X-Linked-ETag", "x-amz-meta-sha256", "x-goog-meta-sha256")


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
