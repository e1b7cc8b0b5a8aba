"""JSON over HTTPS for remote embedding providers: timeouts, retries with backoff, Retry-After.

Standard library only (http.client, over the kept-alive connections of
memd/embed/connections.py). Redirects are never followed: the key would go wherever they point.
Keys travel in headers, never in URLs, and every message that could carry server text is
redacted before it reaches a log line or an exception.
"""

from __future__ import annotations

import json
import logging
import random
import re
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from email.message import Message
from http.client import HTTPException
from typing import IO, Any

from memd.embed.connections import Connections, is_loopback, proxy_for
from memd.embed.pace import MAX_RETRY_AFTER, Pace, parse_retry_after, retry_after
from memd.embed.secrets import Secret, redact
from memd_client.errors import ConfigError, ProviderUnavailable

__all__ = [
    "RETRYABLE_STATUS",
    "BatchTooLarge",
    "MAX_RETRY_AFTER",
    "JsonClient",
    "check_base_url",
    "is_loopback",
    "parse_retry_after",
]

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
BASE_DELAY = 0.5
MAX_DELAY = 8.0
_ERROR_BODY_BYTES = 64 * 1024
_EXCERPT_CHARS = 200
# How servers say "this request holds too much": OpenAI, vLLM, TEI, Voyage, Gemini, Ollama wording.
_TOO_LARGE = re.compile(
    r"too (many|large|long)|maximum context|context (length|window)|batch size|input limit"
    r"|max(imum)? (of )?\d+ (tokens|inputs)|tokens per request|less than \d+ tokens",
    re.IGNORECASE,
)


class BatchTooLarge(ProviderUnavailable):
    """The provider refused a request for holding too much; the caller splits the batch."""


class _Retryable(Exception):
    def __init__(
        self, reason: str, retry_after: float | None = None, *, shared: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.shared = shared


def check_base_url(url: str, provider: str) -> str:
    """Return ``url`` without a trailing slash, or raise ConfigError if it is not safe to use."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{provider}: embedding.base_url must be an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"{provider}: embedding.base_url must not hold credentials; use embedding.api_key_file"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{provider}: embedding.base_url must not have a query or fragment")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigError(
            f"{provider}: refusing plain http:// to {parts.hostname}; use https:// "
            "(http is allowed only for localhost, 127.0.0.0/8 and ::1)"
        )
    return urllib.parse.urlunsplit(parts).rstrip("/")


class JsonClient:
    """Talks JSON to one provider's base URL over kept-alive connections; retries what is
    worth retrying, and keeps to the provider's pace (memd/embed/pace.py).

    Args:
        auth_header: the header the key goes in (``Authorization`` or ``x-goog-api-key``).
        auth_prefix: what precedes the key in that header (``"Bearer "`` or nothing).
        sleep: called with each backoff delay; tests pass a recorder instead of waiting.
        on_request: called once per request sent (retries included), to count them.
        keep: idle connections kept for reuse (one per request in flight is enough).
    """

    def __init__(
        self,
        provider: str,
        base_url: str,
        *,
        key: Secret | None = None,
        auth_header: str = "Authorization",
        auth_prefix: str = "Bearer ",
        timeout: float = 60.0,
        max_retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        on_request: Callable[[], None] | None = None,
        keep: int = 8,
    ) -> None:
        self.provider = provider
        self.base_url = check_base_url(base_url, provider)
        self.timeout = timeout
        self.max_retries = max_retries
        self._key = key
        self._auth_header = auth_header
        self._auth_prefix = auth_prefix
        self._sleep = sleep
        self._rng = rng
        self._on_request = on_request
        self.pace = Pace(sleep)
        parts = urllib.parse.urlsplit(self.base_url)
        host = parts.hostname or ""
        self._prefix = parts.path
        self.connections = Connections(
            parts.scheme,
            host,
            parts.port,
            timeout=timeout,
            keep=keep,
            proxy=proxy_for(parts.scheme, host),
        )

    def __repr__(self) -> str:
        return f"JsonClient({self.provider!r}, {self.base_url!r})"

    def close(self) -> None:
        self.connections.close()

    def post(self, path: str, body: object, *, tokens: int = 0) -> Any:
        """POST ``body`` to ``base_url + path``, retrying transient failures; return the JSON.
        ``tokens`` (an estimate) is what the request spends of a token rate limit."""
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        return self._json(self._retrying("POST", path, data, "application/json", tokens))

    def get(self, path: str) -> Any:
        """GET ``base_url + path`` (with retries); return the JSON."""
        return self._json(self._retrying("GET", path, None, None, 0))

    def upload(self, path: str, fields: Mapping[str, str], name: str, content: bytes) -> Any:
        """POST a multipart/form-data body: ``fields`` and one file ``name`` of ``content``."""
        boundary = "memd-" + uuid.uuid4().hex
        parts: list[bytes] = []
        for field_name, value in fields.items():
            parts.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{field_name}"\r\n\r\n'
                f"{value}\r\n".encode()
            )
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n".encode()
        )
        data = b"".join([*parts, content, f"\r\n--{boundary}--\r\n".encode()])
        content_type = f"multipart/form-data; boundary={boundary}"
        return self._json(self._retrying("POST", path, data, content_type, 0))

    def download(self, path: str, sink: IO[bytes]) -> int:
        """GET ``base_url + path`` into ``sink`` (a file: a batch's output can be large); the
        number of bytes written. Retried from the start on a transient failure."""
        attempt = 0
        while True:
            sink.seek(0)
            sink.truncate()
            try:
                return self._download_once(path, sink)
            except _Retryable as exc:
                attempt = self._next_attempt(exc, attempt)

    def _download_once(self, path: str, sink: IO[bytes]) -> int:
        self.pace.wait()
        self._count()
        try:
            with self.connections.stream("GET", self._prefix + path, self._headers(None)) as r:
                if r.status >= 300:
                    body = r.read(_ERROR_BODY_BYTES)
                    raise self._status_error(r.status, _lower(r.headers), body)
                self.pace.observe(_lower(r.headers))
                size = 0
                while chunk := r.read(1 << 20):
                    sink.write(chunk)
                    size += len(chunk)
                return size
        except (_Retryable, ProviderUnavailable):
            raise
        except (OSError, HTTPException, ValueError) as exc:
            raise self._transport_error(exc) from None

    def _json(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError:
            raise ProviderUnavailable(
                f"{self.provider} replied with something other than JSON"
            ) from None

    def _retrying(
        self, method: str, path: str, data: bytes | None, content_type: str | None, tokens: int
    ) -> bytes:
        attempt = 0
        while True:
            try:
                return self._once(method, path, data, content_type, tokens)
            except _Retryable as exc:
                attempt = self._next_attempt(exc, attempt)

    def _next_attempt(self, exc: _Retryable, attempt: int) -> int:
        """Wait before attempt ``attempt + 1`` (or raise when retries are spent). A rate limit
        holds every request to this provider; other failures back off this request alone."""
        if attempt >= self.max_retries:
            raise ProviderUnavailable(
                f"{self.provider} failed after {attempt + 1} attempts: {exc.reason}"
            ) from None
        delay = exc.retry_after if exc.retry_after is not None else self._backoff(attempt)
        logger.info(
            "%s: %s; retry %d of %d in %.1f s",
            self.provider,
            exc.reason,
            attempt + 1,
            self.max_retries,
            delay,
        )
        if exc.shared:
            self.pace.hold(delay)  # the next pace.wait() sleeps it, in every thread
        else:
            self._sleep(delay)
        return attempt + 1

    def _backoff(self, attempt: int) -> float:
        return min(MAX_DELAY, BASE_DELAY * 2.0**attempt * (1 + 0.2 * self._rng()))

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "memd"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if self._key is not None:
            headers[self._auth_header] = self._auth_prefix + self._key.reveal()
        return headers

    def _redact(self, text: str) -> str:
        return redact(text, [self._key] if self._key is not None else [])

    def _count(self) -> None:
        if self._on_request is not None:
            self._on_request()

    def _once(
        self, method: str, path: str, data: bytes | None, content_type: str | None, tokens: int
    ) -> bytes:
        self.pace.wait(tokens)
        url = self.base_url + path
        logger.debug("%s: %s %s (%d bytes)", self.provider, method, url, len(data or b""))
        self._count()
        try:
            response = self.connections.request(
                method,
                self._prefix + path,
                data,
                self._headers(content_type),
                limit=_ERROR_BODY_BYTES,
            )
        except (OSError, HTTPException, ValueError) as exc:
            raise self._transport_error(exc) from None
        headers = _lower(response.headers)
        self.pace.observe(headers)
        if response.status >= 300:
            raise self._status_error(response.status, headers, response.body)
        return response.body

    def _transport_error(self, reason: object) -> Exception:
        if isinstance(reason, TimeoutError):
            return _Retryable(f"timed out after {self.timeout:g} s")
        if isinstance(reason, ssl.SSLCertVerificationError):
            return ProviderUnavailable(
                f"{self.provider}: TLS certificate verification failed ({reason.verify_message})"
            )
        if isinstance(reason, ValueError):  # a request urllib/http.client refused to build
            return ProviderUnavailable(f"{self.provider}: could not build the request")
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
        return _Retryable(f"connection failed: {self._redact(text or type(reason).__name__)}")

    def _status_error(self, status: int, headers: Mapping[str, str], body: bytes) -> Exception:
        if status in (401, 403):
            if self._key is None:
                return ProviderUnavailable(f"{self.provider} requires an API key (HTTP {status})")
            return ProviderUnavailable(f"{self.provider} rejected the API key (HTTP {status})")
        text = body.decode("utf-8", "replace")
        excerpt = self._excerpt(text)
        if status == 413 or (status in (400, 422) and _TOO_LARGE.search(text)):
            return BatchTooLarge(f"{self.provider}: request too large (HTTP {status}): {excerpt}")
        if status in RETRYABLE_STATUS:
            wait = retry_after(headers) if status in (429, 503) else None
            # A rate limit, or an outage with a stated end, concerns every request to it.
            return _Retryable(
                f"HTTP {status}: {excerpt}", wait, shared=status == 429 or wait is not None
            )
        if 300 <= status < 400:
            return ProviderUnavailable(
                f"{self.provider} redirected the request (HTTP {status}); "
                "set embedding.base_url to the final address"
            )
        return ProviderUnavailable(f"{self.provider} returned HTTP {status}: {excerpt}")

    def _excerpt(self, text: str) -> str:
        """A short, redacted account of an error body, preferring the JSON error message."""
        message: object = text
        try:
            decoded = json.loads(text)
        except ValueError:
            decoded = None
        if isinstance(decoded, Mapping):
            error = decoded.get("error", decoded.get("message", decoded.get("detail")))
            if isinstance(error, Mapping):
                error = error.get("message", error)
            if error is not None:
                message = error
        flat = " ".join(str(message).split())
        # Redact before cutting, so a cut can never leave part of a key behind.
        flat = self._redact(flat)
        if len(flat) > _EXCERPT_CHARS:
            flat = flat[: _EXCERPT_CHARS - 1] + "…"
        return flat or "(empty body)"


def _lower(headers: Message) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}
