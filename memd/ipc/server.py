"""The Unix-socket listener: private directory, stale-socket check, peer uid, one thread per client.

Bad input costs only its own connection: a malformed or oversized message, or one that dribbles
in slower than the frame deadline, closes that connection and nothing else. A client that does
not read its replies stops being served and is closed (memd/ipc/outbox.py), and a new client
that finds every slot taken gets the slot of such a client.

Over 400 lines: accepting, peer checks, framing deadlines and slot reuse share one lock and one
list of connections, and are easier to check together.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from memd.ipc.outbox import Outbox, Outgoing, Shed
from memd_client.errors import Busy, Code, to_wire
from memd_client.protocol import (
    MAX_REQUEST_BYTES,
    RESPONSE,
    Notification,
    ProtocolError,
    Request,
    make_unpacker,
    pack,
    parse,
)

__all__ = ["AlreadyRunning", "Server", "StartupError", "peer_uid"]

logger = logging.getLogger(__name__)

# A client over the connection limit waits this long for a slot (one freed, or one taken from a
# client that does not read its replies), then gets BUSY in reply to its first request; at most
# this many threads do this at once.
BUSY_READ_SECONDS = 2.0
BUSY_THREADS = 16
# With this share of the limit in use, connections idle for CROWDED_IDLE_SECONDS are closed
# (otherwise after idle_timeout), so forgotten clients do not hold the slots new ones need.
CROWDED_SHARE = 0.75
CROWDED_IDLE_SECONDS = 30.0
# Connections the kernel queues until the accept loop takes them: a burst of clients (hundreds
# of agents starting at once) past a full queue is refused at once (EAGAIN), however idle memd.
LISTEN_BACKLOG = 1024


class StartupError(Exception):
    """The socket cannot be set up (directory not private, path in use by something else)."""


class AlreadyRunning(StartupError):
    """Another memd answers on the socket."""


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end (SO_PEERCRED on Linux, LOCAL_PEERCRED on BSDs)."""
    if hasattr(socket, "SO_PEERCRED"):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return int(uid)
    if sys.platform == "darwin" or "bsd" in sys.platform:  # pragma: no cover - not Linux
        local_peercred, xucred_size = 0x001, 76
        data = conn.getsockopt(0, local_peercred, xucred_size)
        _version, uid = struct.unpack_from("Ii", data)
        return int(uid)
    return None  # pragma: no cover


def prepare_directory(directory: Path) -> None:
    """Create the socket directory 0700, or refuse one that others can enter."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"{directory} is not a directory")
    if st.st_uid != os.getuid():
        raise StartupError(f"socket directory {directory} belongs to uid {st.st_uid}, not to you")
    if st.st_mode & 0o077:
        raise StartupError(
            f"socket directory {directory} is not private (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run: chmod 700 {directory}"
        )


class Server:
    """Accepts clients on ``path`` and answers their requests with ``handle``."""

    def __init__(
        self,
        path: Path,
        handle: Callable[[Request, dict[str, Any]], list[Any]],
        *,
        max_connections: int = 256,
        frame_timeout: float = 10.0,
        idle_timeout: float = 600.0,
        write_timeout: float = 30.0,
        on_count: Callable[[int], None] | None = None,
        listening: socket.socket | None = None,
    ) -> None:
        self.path = path
        # A socket a service manager opened and passed (memd/ipc/activation.py): served as
        # it is, and its file is the manager's, never unlinked here.
        self._given = listening
        # Held while a connection is accepted and admitted; pause_accepting() takes it, and
        # the accept loop takes no new turn while it is asked to (``_pausing``).
        self._accepting = threading.Lock()
        self._pausing = threading.Event()
        self._paused = False
        self.handle = handle
        self.max_connections = max_connections
        self.frame_timeout = frame_timeout
        self.idle_timeout = idle_timeout
        self.on_count = on_count
        self.uid = os.getuid()
        self._sock: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._clients: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.closed_bad = 0
        self._bound: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self._busy_slots = threading.BoundedSemaphore(BUSY_THREADS)
        self._turned_away: dict[threading.Thread, socket.socket] = {}  # until their thread ends
        self.outbox = Outbox(write_timeout=write_timeout)

    # -- lifecycle ------------------------------------------------------------------------------

    def bind(self) -> None:
        """Bind the socket (0600 in a 0700 directory), removing a stale one left by a crash;
        or take the one a service manager passed."""
        prepare_directory(self.path.parent)
        if self._given is not None:
            self._given.settimeout(0.25)
            self._sock, self._given = self._given, None
            return
        if os.path.lexists(self.path):
            st = os.lstat(self.path)
            if not stat.S_ISSOCK(st.st_mode):
                # Only ever a socket is removed: MEMD_SOCKET=~/notes.md must not cost the notes.
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a socket"
                raise StartupError(
                    f"{self.path} exists and is {kind}; memd will not replace it "
                    "(choose another MEMD_SOCKET or move the file)"
                )
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(self.path))
            except (ConnectionRefusedError, FileNotFoundError):
                self.path.unlink(missing_ok=True)  # nobody listens: a stale socket
            except OSError as exc:
                raise StartupError(f"cannot check {self.path}: {exc}") from None
            else:
                raise AlreadyRunning(f"memd is already running (socket {self.path})")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot bind {self.path}: {exc}") from None
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        st = os.lstat(self.path)
        self._bound = (st.st_dev, st.st_ino)
        sock.listen(min(socket.SOMAXCONN, LISTEN_BACKLOG))
        sock.settimeout(0.25)
        self._sock = sock

    def start(self) -> None:
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="memd-accept", daemon=True
        )
        self._accept_thread.start()

    def _unlink_own_socket(self) -> None:
        """Remove the socket this server bound, and nothing else (not a file put there since,
        nor whatever was at the path when binding was refused)."""
        if self._bound is None:
            return
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._bound:
                self.path.unlink()
        self._bound = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, close every client, unlink the socket and join the threads."""
        self._stopping.set()
        self.resume_accepting()  # a paused accept loop sees the stop
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._unlink_own_socket()
        with self._lock:
            clients = list(self._clients.values()) + [
                (conn, thread) for thread, conn in self._turned_away.items()
            ]
        for conn, _ in clients:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for _, thread in clients:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._clients)

    # -- accepting ------------------------------------------------------------------------------

    def pause_accepting(self) -> None:
        """Stop taking connections from the socket's queue, once no accept is under way: for
        a socket-activated memd deciding to stop when idle, what waits in the queue is served
        by the next memd its manager starts, and nothing is accepted only to be dropped.

        The accept loop is asked first, then its turn is waited for: a lock is not fair, and
        the loop, releasing it at the end of each turn and taking it again at once, kept this
        call waiting for minutes on an idle machine (an idle memd that never stopped)."""
        self._pausing.set()
        self._accepting.acquire()
        self._paused = True

    def resume_accepting(self) -> None:
        if self._paused:
            self._paused = False
            self._accepting.release()
        self._pausing.clear()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            if self._pausing.is_set():
                time.sleep(0.05)  # paused, or about to be: the turn is pause_accepting's
                continue
            with self._accepting:
                if self._stopping.is_set():
                    return
                if not self._pausing.is_set():
                    self._accept_one()

    def _accept_one(self) -> None:
        assert self._sock is not None
        try:
            conn, _ = self._sock.accept()
        except TimeoutError:
            return
        except OSError as exc:
            if self._stopping.is_set():
                return
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                logger.warning("out of file descriptors; not accepting for a moment")
                time.sleep(0.5)
                return
            logger.warning("accept failed: %s", exc)
            return
        uid = peer_uid(conn)
        if uid is not None and uid != self.uid:
            logger.warning("refused a connection from uid %d", uid)
            conn.close()
            return
        if not self._has_slot():
            self._turn_away(conn)
            return
        thread = threading.Thread(target=self._serve, args=(conn,), name="memd-conn", daemon=True)
        self._admit(conn, thread)
        try:
            thread.start()
        except RuntimeError:  # the system refused a thread: this client only is closed
            logger.warning("could not start a thread for a connection; closing it")
            with self._lock:
                self._clients.pop(conn.fileno(), None)
            conn.close()
            time.sleep(0.5)

    def _has_slot(self) -> bool:
        """Whether a new client may be served now: a slot is free, or one was taken from a
        client that does not read its replies (its thread is ending)."""
        with self._lock:
            if len(self._clients) < self.max_connections:
                return True
        return self.outbox.shed_stalled()

    def _admit(self, conn: socket.socket, thread: threading.Thread) -> None:
        with self._lock:
            self._clients[conn.fileno()] = (conn, thread)
            count = len(self._clients)
        if self.on_count:
            self.on_count(count)

    def _turn_away(self, conn: socket.socket) -> None:
        """Serve a client over the connection limit as soon as a slot is free or taken from a
        client that does not read, within BUSY_READ_SECONDS; else answer it BUSY, as the reply
        to its own first request (a reply with a msgid it never sent reads as a broken
        connection), then close. A few threads do this at most; past them the connection is
        closed unanswered."""
        if not self._busy_slots.acquire(blocking=False):
            conn.close()
            return

        def answer() -> None:
            admitted = False
            try:
                deadline = time.monotonic() + BUSY_READ_SECONDS
                while time.monotonic() < deadline and not self._stopping.is_set():
                    if self._has_slot():
                        admitted = True
                        break
                    time.sleep(0.05)
                if admitted:
                    self._admit(conn, threading.current_thread())
                    self._busy_slots.release()
                    self._serve(conn)
                    return
                conn.settimeout(BUSY_READ_SECONDS)
                unpacker = make_unpacker(MAX_REQUEST_BYTES)
                deadline = time.monotonic() + BUSY_READ_SECONDS
                while time.monotonic() < deadline:
                    data = conn.recv(65536)
                    if not data:
                        return
                    unpacker.feed(data)
                    for obj in unpacker:
                        message = parse(obj)
                        if isinstance(message, Request):
                            busy = Busy(
                                f"too many connections ({self.max_connections}); retry shortly"
                            )
                            conn.sendall(pack([RESPONSE, message.msgid, to_wire(busy), None]))
                            return
            except (OSError, ValueError, ProtocolError, msgpack.UnpackException):
                return
            finally:
                if not admitted:
                    conn.close()
                    self._busy_slots.release()
                with self._lock:
                    self._turned_away.pop(threading.current_thread(), None)

        thread = threading.Thread(target=answer, name="memd-busy", daemon=True)
        with self._lock:
            self._turned_away[thread] = conn
        try:
            thread.start()
        except RuntimeError:  # no thread to spare: closed unanswered, as past BUSY_THREADS
            with self._lock:
                self._turned_away.pop(thread, None)
            conn.close()
            self._busy_slots.release()

    def _idle_limit(self) -> float:
        """Idle connections are reaped sooner once the limit is near."""
        with self._lock:
            crowded = len(self._clients) >= CROWDED_SHARE * self.max_connections
        return min(self.idle_timeout, CROWDED_IDLE_SECONDS) if crowded else self.idle_timeout

    # -- one client -----------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        key = conn.fileno()
        out = self.outbox.open(conn)
        try:
            self._conversation(conn, out)
        except Shed as exc:
            logger.info("closing a connection: %s", exc)
        except OSError:
            pass  # the peer went away (or was shut down to make room)
        except Exception:
            logger.exception("connection handler failed")
        finally:
            self.outbox.close(out)
            with self._lock:
                self._clients.pop(key, None)
                count = len(self._clients)
            if self.on_count:
                self.on_count(count)
            conn.close()

    def _conversation(self, conn: socket.socket, out: Outgoing) -> None:
        conn.settimeout(0.5)
        unpacker = make_unpacker(MAX_REQUEST_BYTES)
        state: dict[str, Any] = {}  # what this connection told us about itself (hello)
        fed = 0
        complete = 0  # stream offset where the last whole message ended
        partial_since: float | None = None
        last_activity = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            try:
                data = conn.recv(65536)
            except TimeoutError:
                if partial_since is not None and now - partial_since > self.frame_timeout:
                    return self._bad("a message did not arrive within the frame deadline")
                if now - last_activity > self._idle_limit():
                    return None
                continue
            if not data:
                return None
            last_activity = now
            try:
                unpacker.feed(data)
                fed += len(data)
                for obj in unpacker:
                    complete = unpacker.tell()
                    message = parse(obj)
                    if isinstance(message, Request):
                        # Its requests wait while the replies of all are over the budget, and
                        # while its own reply waits for it to read (send() returns then).
                        self.outbox.wait_for_room(out, self._stopping.is_set)
                        self.outbox.send(out, self._respond(message, state), self._stopping.is_set)
                        conn.settimeout(0.5)
                    elif isinstance(message, Notification):
                        continue  # none are defined yet; ignored as msgpack-RPC allows
                    else:
                        return self._bad("clients do not send responses")
            except msgpack.BufferFull:
                return self._bad(f"message larger than {MAX_REQUEST_BYTES} bytes")
            except (
                ValueError,
                msgpack.ExtraData,
                msgpack.FormatError,
                msgpack.StackError,
                ProtocolError,
            ) as exc:
                return self._bad(f"malformed message: {exc}")
            partial = fed > complete
            if partial and partial_since is None:
                partial_since = now
            elif not partial:
                partial_since = None
        return None

    def _respond(self, request: Request, state: dict[str, Any]) -> bytes:
        response = self.handle(request, state)
        try:
            return pack(response)
        except (TypeError, ValueError, OverflowError) as exc:
            logger.error("cannot encode the reply to %s: %s", request.method, exc)
            return pack(
                [RESPONSE, request.msgid, [int(Code.INTERNAL), "reply could not be encoded"], None]
            )

    def _bad(self, why: str) -> None:
        self.closed_bad += 1
        logger.info("closing a connection: %s", why)
        return None
