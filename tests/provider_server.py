"""A real HTTP server on 127.0.0.1 standing in for a remote embedding provider in tests."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG = object()
Reply = tuple[int, dict[str, str], Any]


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class FakeProvider:
    """A threaded HTTP server whose replies come from ``responder``; it records every request."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.responder: Callable[[Seen], Any] = lambda seen: (404, {}, {"error": "no responder"})
        self.release = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                seen = Seen(
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    json.loads(self.rfile.read(length) or b"null"),
                )
                with outer._lock:
                    outer.requests.append(seen)
                reply = outer.responder(seen)
                if reply is HANG:
                    outer.release.wait(10)  # longer than any client timeout; released at teardown
                    return
                status, headers, payload = reply
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                with contextlib.suppress(OSError):  # a late answer may find the client gone
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # so server_close() joins the handler threads
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-provider"
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
