"""JSON over HTTPS for remote embedding providers: timeouts, retries with backoff, Retry-After.

Standard library only. Keys travel in headers, never in URLs, and every message that could carry
server text is redacted before it reaches a log line or an exception.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import logging
import math
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.message import Message
from http.client import HTTPException
from typing import IO, Any

from memd.embed.secrets import Secret, redact
from memd_client.errors import ConfigError, ProviderUnavailable

__all__ = [
    "RETRYABLE_STATUS",
    "BatchTooLarge",
    "JsonClient",
    "check_base_url",
    "is_loopback",
    "parse_retry_after",
]

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
BASE_DELAY = 0.5
MAX_DELAY = 8.0
MAX_RETRY_AFTER = 60.0
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
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib copies every header, Authorization included, to wherever a redirect points.
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address (127.0.0.0/8, ::1).
    These are the only hosts memd talks plain http to.

    Names under ``.localhost`` are not: RFC 6761 asks resolvers to keep them on this machine,
    but a resolver that does not know the rule sends them to DNS, and with them an API key.
    """
    host = host.lower().removesuffix(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or HTTP-date), capped at 60."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


class JsonClient:
    """POSTs JSON to one provider's base URL and returns the decoded reply.

    Args:
        auth_header: the header the key goes in (``Authorization`` or ``x-goog-api-key``).
        auth_prefix: what precedes the key in that header (``"Bearer "`` or nothing).
        sleep: called with each backoff delay; tests pass a recorder instead of waiting.
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
        host = urllib.parse.urlsplit(self.base_url).hostname or ""
        # No proxy for loopback: an HTTP(S)_PROXY meant for the internet must not see local traffic.
        proxies = urllib.request.ProxyHandler({} if is_loopback(host) else None)
        self._opener = urllib.request.build_opener(proxies, _NoRedirect())

    def __repr__(self) -> str:
        return f"JsonClient({self.provider!r}, {self.base_url!r})"

    def post(self, path: str, body: object) -> Any:
        """POST ``body`` to ``base_url + path``, retrying transient failures; return the JSON."""
        url = self.base_url + path
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        attempt = 0
        while True:
            try:
                return self._once(url, data)
            except _Retryable as exc:
                if attempt >= self.max_retries:
                    raise ProviderUnavailable(
                        f"{self.provider} failed after {attempt + 1} attempts: {exc.reason}"
                    ) from None
                delay = exc.retry_after if exc.retry_after is not None else self._backoff(attempt)
                attempt += 1
                logger.info(
                    "%s: %s; retry %d of %d in %.1f s",
                    self.provider,
                    exc.reason,
                    attempt,
                    self.max_retries,
                    delay,
                )
                self._sleep(delay)

    def _backoff(self, attempt: int) -> float:
        return min(MAX_DELAY, BASE_DELAY * 2.0**attempt * (1 + 0.2 * self._rng()))

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "memd",
        }
        if self._key is not None:
            headers[self._auth_header] = self._auth_prefix + self._key.reveal()
        return headers

    def _redact(self, text: str) -> str:
        return redact(text, [self._key] if self._key is not None else [])

    def _once(self, url: str, data: bytes) -> Any:
        logger.debug("%s: POST %s (%d bytes)", self.provider, url, len(data))
        request = urllib.request.Request(url, data=data, headers=self._headers(), method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                raw: bytes = response.read()
        except urllib.error.HTTPError as exc:
            try:
                body = exc.read(_ERROR_BODY_BYTES)
            except (OSError, HTTPException):
                body = b""
            finally:
                exc.close()
            raise self._status_error(exc.code, exc.headers, body) from None
        except urllib.error.URLError as exc:
            raise self._transport_error(exc.reason) from None
        except (OSError, HTTPException, ValueError) as exc:
            raise self._transport_error(exc) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise ProviderUnavailable(
                f"{self.provider} replied with something other than JSON"
            ) from None

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

    def _status_error(self, status: int, headers: Message, body: bytes) -> Exception:
        if status in (401, 403):
            if self._key is None:
                return ProviderUnavailable(f"{self.provider} requires an API key (HTTP {status})")
            return ProviderUnavailable(f"{self.provider} rejected the API key (HTTP {status})")
        text = body.decode("utf-8", "replace")
        excerpt = self._excerpt(text)
        if status == 413 or (status in (400, 422) and _TOO_LARGE.search(text)):
            return BatchTooLarge(f"{self.provider}: request too large (HTTP {status}): {excerpt}")
        if status in RETRYABLE_STATUS:
            wait = parse_retry_after(headers.get("Retry-After")) if status in (429, 503) else None
            return _Retryable(f"HTTP {status}: {excerpt}", wait)
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
