"""A real HTTP server on 127.0.0.1 standing in for a remote embedding provider in tests.

It counts what a client sends (requests, texts, estimated tokens, connections opened, the most
requests in flight at once), can take a set time per embedding request, and serves OpenAI's
Batch API in the documented shapes: ``POST /v1/files`` (multipart, ``purpose=batch``, a JSONL
file of requests), ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``POST
/v1/batches/{id}/cancel`` and ``GET /v1/files/{id}/content``. Each line of a batch is answered
by the same ``responder`` as a live request, when the batch completes.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import itertools
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memd.text import estimate_tokens

HANG = object()
Reply = tuple[int, dict[str, str], Any]

_EMBEDDING_PATHS = ("/embeddings", ":batchEmbedContents", "/api/embed")


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any
    method: str = "POST"


@dataclass
class Counts:
    """What the server was sent; ``peak`` is the most embedding requests in flight at once."""

    requests: int = 0  # embedding requests (live ones; batch endpoints are counted apart)
    texts: int = 0
    tokens: int = 0
    connections: int = 0
    peak: int = 0
    batch_calls: int = 0  # requests to the Batch API's endpoints
    batch_texts: int = 0
    batch_tokens: int = 0
    per_request_texts: list[int] = field(default_factory=list)


def inputs_of(body: Any) -> list[str]:
    """The texts of an embedding request, whatever the provider's shape."""
    if not isinstance(body, dict):
        return []
    if isinstance(body.get("input"), list):
        return [t for t in body["input"] if isinstance(t, str)]
    if isinstance(body.get("input"), str):
        return [body["input"]]
    if isinstance(body.get("requests"), list):  # Gemini
        return [
            p.get("text", "")
            for r in body["requests"]
            for p in (r.get("content") or {}).get("parts", [])
        ]
    return []


class FakeProvider:
    """A threaded HTTP/1.1 server whose replies come from ``responder``; it records every
    request. ``latency`` seconds are spent on each embedding request before it is answered."""

    def __init__(self, *, latency: float = 0.0, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Seen] = []
        self.responder: Callable[[Seen], Any] = lambda seen: (404, {}, {"error": "no responder"})
        self.release = threading.Event()
        self.latency = latency
        # Hold each embedding request until this many are in flight (5 s at most), so that
        # the most a client sends at once shows whatever the machine's speed.
        self.gather = 0
        self._arrived = threading.Condition()
        self.counts = Counts()
        self.batches = BatchApi(self)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._sockets: set[socket.socket] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real APIs

            def setup(self) -> None:
                super().setup()
                with outer._lock:
                    outer.counts.connections += 1
                    outer._sockets.add(self.connection)

            def finish(self) -> None:
                with outer._lock:
                    outer._sockets.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def do_GET(self) -> None:
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, None, "GET")
                with outer._lock:
                    outer.requests.append(seen)
                self._reply(outer.batches.handle(seen))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                if headers.get("content-type", "").startswith("multipart/form-data"):
                    body: Any = _multipart(headers["content-type"], raw)
                else:
                    body = json.loads(raw or b"null")
                seen = Seen(self.path, headers, body)
                with outer._lock:
                    outer.requests.append(seen)
                if outer.batches.owns(self.path):
                    self._reply(outer.batches.handle(seen))
                    return
                embedding = self.path.endswith(_EMBEDDING_PATHS)
                if embedding:
                    outer._enter(inputs_of(body))
                try:
                    if embedding and outer.gather:
                        outer._gather()
                    if embedding and outer.latency:
                        time.sleep(outer.latency)
                    reply = outer.responder(seen)
                finally:
                    if embedding:
                        outer._leave()
                if reply is HANG:
                    self.close_connection = True
                    outer.release.wait(10)  # longer than any client timeout; released at teardown
                    return
                self._reply(reply)

            def _reply(self, reply: Reply) -> None:
                status, headers, payload = reply
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                with contextlib.suppress(OSError):  # a late answer may find the client gone
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    if "Content-Type" not in headers:
                        self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # so server_close() joins the handler threads
        if tls is not None:  # https: the handshake happens in each handler's thread
            self.httpd.socket = tls.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-provider"
        )
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _enter(self, texts: list[str]) -> None:
        with self._lock:
            self._in_flight += 1
            c = self.counts
            c.peak = max(c.peak, self._in_flight)
            c.requests += 1
            c.texts += len(texts)
            c.tokens += sum(estimate_tokens(t) for t in texts)
            c.per_request_texts.append(len(texts))
        with self._arrived:
            self._arrived.notify_all()

    def _gather(self) -> None:
        with self._arrived:
            self._arrived.notify_all()
            self._arrived.wait_for(lambda: self._in_flight >= self.gather, timeout=5)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def reset_counts(self) -> None:
        with self._lock:
            self.counts = Counts()
            self.requests.clear()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        with self._lock:  # idle keep-alive connections: their handlers wait for a request
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self.httpd.server_close()
        self.thread.join(5)


def _multipart(content_type: str, raw: bytes) -> dict[str, Any]:
    """The fields of a multipart/form-data body: text fields as str, files as (name, bytes)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        payload = part.get_payload(decode=True) or b""
        if filename is not None:
            fields[str(name)] = (filename, payload)
        else:
            assert isinstance(payload, bytes)
            fields[str(name)] = payload.decode("utf-8")
    return fields


class BatchApi:
    """OpenAI's Files and Batch endpoints, in memory. A batch is ``validating`` when created,
    ``in_progress`` from its first poll, and completes at the poll after ``hold`` is cleared
    (set: it stays in progress, as a real one does for minutes or hours)."""

    def __init__(self, server: FakeProvider) -> None:
        self.server = server
        self.files: dict[str, tuple[str, bytes]] = {}  # id -> (purpose, content)
        self.batches: dict[str, dict[str, Any]] = {}
        self.hold = threading.Event()
        self.fail_with: str | None = None  # the status a batch ends in instead ("failed", ...)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @staticmethod
    def owns(path: str) -> bool:
        return path.startswith(("/v1/files", "/v1/batches"))

    def _count(self) -> None:
        with self.server._lock:
            self.server.counts.batch_calls += 1

    def handle(self, seen: Seen) -> Reply:
        path = seen.path.split("?", 1)[0]
        self._count()
        with self._lock:
            if seen.method == "POST" and path == "/v1/files":
                return self._upload(seen.body)
            if seen.method == "POST" and path == "/v1/batches":
                return self._create(seen.body)
            parts = path.strip("/").split("/")
            if seen.method == "GET" and len(parts) == 3 and parts[1] == "batches":
                return self._retrieve(parts[2])
            if seen.method == "POST" and len(parts) == 4 and parts[3] == "cancel":
                batch = self.batches.get(parts[2])
                if batch is None:
                    return 404, {}, {"error": {"message": "No such batch"}}
                batch["status"] = "cancelled"
                return 200, {}, batch
            if seen.method == "GET" and len(parts) == 4 and parts[3] == "content":
                found = self.files.get(parts[2])
                if found is None:
                    return 404, {}, {"error": {"message": "No such file"}}
                return 200, {"Content-Type": "application/octet-stream"}, found[1]
        return 404, {}, {"error": {"message": f"unknown endpoint {seen.method} {path}"}}

    def _upload(self, form: Any) -> Reply:
        if not isinstance(form, dict) or form.get("purpose") != "batch" or "file" not in form:
            return 400, {}, {"error": {"message": "expected purpose=batch and a file"}}
        filename, content = form["file"]
        for n, line in enumerate(content.splitlines(), 1):
            try:
                request = json.loads(line)
            except ValueError:
                return 400, {}, {"error": {"message": f"line {n} is not JSON"}}
            if not {"custom_id", "method", "url", "body"} <= set(request):
                return 400, {}, {"error": {"message": f"line {n} lacks a field"}}
        file_id = f"file-{next(self._ids)}"
        self.files[file_id] = ("batch", content)
        reply = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": "batch",
        }
        return 200, {}, reply

    def _create(self, body: Any) -> Reply:
        file_id = body.get("input_file_id") if isinstance(body, dict) else None
        if file_id not in self.files or body.get("endpoint") != "/v1/embeddings":
            return 400, {}, {"error": {"message": "unknown input_file_id or endpoint"}}
        if body.get("completion_window") != "24h":
            return 400, {}, {"error": {"message": "completion_window must be 24h"}}
        lines = self.files[file_id][1].splitlines()
        texts = [inputs_of(json.loads(line)["body"]) for line in lines]
        with self.server._lock:
            c = self.server.counts
            c.batch_texts += sum(len(t) for t in texts)
            c.batch_tokens += sum(estimate_tokens(x) for t in texts for x in t)
        batch_id = f"batch_{next(self._ids)}"
        self.batches[batch_id] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": "/v1/embeddings",
            "errors": None,
            "input_file_id": file_id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(time.time()),
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        return 200, {}, self.batches[batch_id]

    def _retrieve(self, batch_id: str) -> Reply:
        batch = self.batches.get(batch_id)
        if batch is None:
            return 404, {}, {"error": {"message": "No such batch"}}
        if batch["status"] == "validating":
            batch["status"] = "in_progress"
        elif batch["status"] == "in_progress" and not self.hold.is_set():
            self._finish(batch)
        return 200, {}, batch

    def _finish(self, batch: dict[str, Any]) -> None:
        if self.fail_with is not None:
            batch["status"] = self.fail_with
            if self.fail_with == "failed":
                batch["errors"] = {"object": "list", "data": [{"message": "the batch failed"}]}
            return
        out: list[str] = []
        errors: list[str] = []
        for n, line in enumerate(self.files[batch["input_file_id"]][1].splitlines()):
            request = json.loads(line)
            seen = Seen(request["url"], {}, request["body"])
            status, _, payload = self.server.responder(seen)
            entry = {
                "id": f"batch_req_{n}",
                "custom_id": request["custom_id"],
                "response": {"status_code": status, "request_id": f"req_{n}", "body": payload},
                "error": None,
            }
            (out if status == 200 else errors).append(json.dumps(entry))
        counts = batch["request_counts"]
        counts["completed"], counts["failed"] = len(out), len(errors)
        batch["status"] = "completed"
        batch["completed_at"] = int(time.time())
        if out:
            batch["output_file_id"] = f"file-{next(self._ids)}"
            self.files[batch["output_file_id"]] = ("batch_output", "\n".join(out).encode())
        if errors:
            batch["error_file_id"] = f"file-{next(self._ids)}"
            self.files[batch["error_file_id"]] = ("batch_output", "\n".join(errors).encode())


class ConnectProxy:
    """An HTTP proxy on 127.0.0.1 that only tunnels (CONNECT), always to ``port`` on this
    machine whatever host it is asked for; it records each CONNECT's target and headers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.tunnels: list[tuple[str, dict[str, str]]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._closing = threading.Event()
        self._accept = threading.Thread(target=self._serve, name="connect-proxy")
        self._accept.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        self._listener.settimeout(0.05)
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._tunnel, args=(client,), name="connect-tunnel")
            self._threads.append(t)
            t.start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        self.tunnels.append((target, {k.lower(): v for k, v in headers.items()}))
        upstream = socket.create_connection(("127.0.0.1", self.port))
        self._open += [client, upstream]
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        back = threading.Thread(target=_pipe, args=(upstream, client), name="connect-back")
        back.start()
        _pipe(client, upstream)
        back.join(10)

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        self._accept.join(5)
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(5)
        for sock in self._open:
            sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
