"""Kept-alive HTTP(S) connections to one provider, through the environment's proxy if any.

Standard library only (http.client): a connection is reused for the next request, so a first
index costs one TLS handshake per request in flight, not one per request. ``HTTPS_PROXY`` /
``https_proxy`` (and ``NO_PROXY``) are honoured as urllib honours them, through a CONNECT
tunnel; loopback hosts never go through a proxy. Certificates are checked against the
system's CA store, or the bundle named by ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``.
"""

from __future__ import annotations

import base64
import http.client
import logging
import ssl
import threading
import urllib.parse
import urllib.request
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message

from memd_client.errors import ConfigError

__all__ = ["Connections", "Proxy", "Response", "is_loopback", "proxy_for"]

logger = logging.getLogger(__name__)

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address (127.0.0.0/8, ::1).
    These are the only hosts memd talks plain http to.

    Names under ``.localhost`` are not: RFC 6761 asks resolvers to keep them on this machine,
    but a resolver that does not know the rule sends them to DNS, and with them an API key.
    """
    import ipaddress

    host = host.lower().removesuffix(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # a Proxy-Authorization header value, from the proxy URL

    def __repr__(self) -> str:
        return f"Proxy({self.host}:{self.port}{', with credentials' if self.authorization else ''})"


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The proxy a request to ``scheme://host`` goes through (None: direct), from the
    environment as urllib reads it (``https_proxy``, ``no_proxy``); never one for loopback."""
    if is_loopback(host):
        return None
    url = urllib.request.getproxies().get(scheme)
    if not url or urllib.request.proxy_bypass(host):
        return None
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(
            f"{scheme}_proxy must be an http:// proxy (memd opens a CONNECT tunnel through it)"
        )
    auth = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return Proxy(parts.hostname, parts.port or 8080, auth)


@dataclass
class Response:
    status: int
    headers: Message
    body: bytes


class Connections:
    """Up to ``keep`` idle connections to ``scheme://host:port``, reused by any thread."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int | None,
        *,
        timeout: float,
        keep: int = 8,
        proxy: Proxy | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port or (443 if scheme == "https" else 80)
        self.timeout = timeout
        self.keep = keep
        self.proxy = proxy
        self._context = (
            context
            if context is not None
            else (ssl.create_default_context() if scheme == "https" else None)
        )
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.opened = 0  # connections made (status and tests read it)
        # An embedder dropped without close() still closes its kept connections.
        weakref.finalize(self, _close_all, self._idle)

    def _new(self) -> http.client.HTTPConnection:
        target: tuple[str, int] = (self.host, self.port)
        if self.proxy is not None:
            target = (self.proxy.host, self.proxy.port)
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(*target, timeout=self.timeout, context=self._context)
        else:
            conn = http.client.HTTPConnection(*target, timeout=self.timeout)
        if self.proxy is not None:
            headers = (
                {"Proxy-Authorization": self.proxy.authorization}
                if self.proxy.authorization
                else None
            )
            conn.set_tunnel(self.host, self.port, headers=headers)
        with self._lock:
            self.opened += 1
        return conn

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(conn)
                return
        conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        limit: int | None = None,
    ) -> Response:
        """Send one request and read its reply (at most ``limit`` bytes of an error's body).

        A kept connection the server has closed meanwhile fails before any reply: the request
        goes again once, on a new connection, as every keep-alive client does.
        """
        with self._open(method, path, body, headers) as response:
            size = limit if limit is not None and response.status >= 400 else None
            data = response.read(size) if size is not None else response.read()
            return Response(response.status, response.headers, data)

    @contextmanager
    def stream(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> Iterator[http.client.HTTPResponse]:
        """The reply to a bodiless request, to be read by the caller (a large download)."""
        with self._open(method, path, None, headers) as response:
            yield response

    @contextmanager
    def _open(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Iterator[http.client.HTTPResponse]:
        conn, reused = self._take()
        try:
            try:
                conn.request(method, path, body=body, headers=dict(headers))
                response = conn.getresponse()
            except _STALE:
                conn.close()
                if not reused:
                    raise
                conn = self._new()
                conn.request(method, path, body=body, headers=dict(headers))
                response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        try:
            yield response
        except BaseException:
            conn.close()
            raise
        if response.will_close or not response.isclosed():
            conn.close()  # the server closes it, or the caller left part of the body unread
        else:
            self._give(conn)

    def close(self) -> None:
        with self._lock:
            idle = list(self._idle)
            self._idle.clear()
        _close_all(idle)


def _close_all(connections: list[http.client.HTTPConnection]) -> None:
    for conn in connections:
        conn.close()
