"""How fast one provider may be asked: its ``Retry-After`` and rate-limit headers, shared by
every request to it.

A provider that answers 429 (or 503 with ``Retry-After``) is not asked again by any thread
until the time it named; one whose rate-limit headers say no request or too few tokens are left
is not asked until they reset. Each provider has a pace of its own: one provider's limit never
slows another.
"""

from __future__ import annotations

import email.utils
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

__all__ = ["MAX_RETRY_AFTER", "Pace", "parse_duration", "parse_retry_after"]

MAX_RETRY_AFTER = 60.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


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


def parse_duration(value: str | None) -> float | None:
    """Seconds from a rate-limit reset header: ``"1s"``, ``"6m0s"``, ``"20ms"``, ``"0.5"``."""
    if not value:
        return None
    value = value.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            return None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER)


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a reply asks for: ``retry-after-ms`` (OpenAI, Azure) or ``Retry-After``."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            seconds = float(ms) / 1000
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds):
            return min(max(seconds, 0.0), MAX_RETRY_AFTER)
    return parse_retry_after(headers.get("retry-after"))


class Pace:
    """The shared gate in front of one provider's requests.

    Args:
        clock: monotonic seconds; tests pass their own with ``sleep``.
    """

    def __init__(
        self,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._hold_until = 0.0
        self._requests_left: int | None = None
        self._requests_reset = 0.0
        self._tokens_left: int | None = None
        self._tokens_reset = 0.0
        self.waited = 0.0  # seconds spent waiting, all threads together (status shows it)

    def hold(self, seconds: float) -> None:
        """Ask no request of this provider for ``seconds`` (a 429, a 503 with Retry-After)."""
        with self._lock:
            self._hold_until = max(self._hold_until, self._clock() + seconds)

    def held(self) -> float:
        """Seconds until the provider may be asked again (0: now)."""
        with self._lock:
            return max(0.0, self._hold_until - self._clock())

    def wait(self, tokens: int = 0) -> None:
        """Wait until a request of about ``tokens`` may go, then count it against the limits.

        Waits once at most: after it, the provider's next reply says where the limits are (a
        429 holds everyone again if they have not reset).
        """
        with self._lock:
            now = self._clock()
            delay = self._hold_until - now
            if self._requests_left is not None and self._requests_left <= 0:
                delay = max(delay, self._requests_reset - now)
            if self._tokens_left is not None and self._tokens_left < tokens:
                delay = max(delay, self._tokens_reset - now)
            delay = min(delay, MAX_RETRY_AFTER)
            if delay <= 0:
                self._spend(tokens)
                return
        self._sleep(delay)
        with self._lock:
            self.waited += delay
            if self._requests_left is not None and self._requests_left <= 0:
                self._requests_left = None
            if self._tokens_left is not None and self._tokens_left < tokens:
                self._tokens_left = None
            self._spend(tokens)

    def _spend(self, tokens: int) -> None:
        if self._requests_left is not None:
            self._requests_left -= 1
        if self._tokens_left is not None:
            self._tokens_left -= tokens

    def observe(self, headers: Mapping[str, str]) -> None:
        """Learn the limits a reply states (``x-ratelimit-*`` as OpenAI, Voyage and Mistral
        send them, or the IETF ``ratelimit-*`` fields); ``headers`` keys are lower case."""
        requests = _int(headers.get("x-ratelimit-remaining-requests"))
        tokens = _int(headers.get("x-ratelimit-remaining-tokens"))
        requests_reset = parse_duration(headers.get("x-ratelimit-reset-requests"))
        tokens_reset = parse_duration(headers.get("x-ratelimit-reset-tokens"))
        if requests is None and tokens is None:  # draft-ietf-httpapi-ratelimit-headers
            requests = _int(headers.get("ratelimit-remaining"))
            requests_reset = parse_duration(headers.get("ratelimit-reset"))
        if requests is None and tokens is None:
            return
        with self._lock:
            now = self._clock()
            if requests is not None:
                self._requests_left = requests
                self._requests_reset = now + (requests_reset or 1.0)
            if tokens is not None:
                self._tokens_left = tokens
                self._tokens_reset = now + (tokens_reset or 1.0)
