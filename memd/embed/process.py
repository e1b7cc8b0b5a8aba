"""The local provider as the daemon sees it: llama.cpp in a supervised worker process.

A native crash or hang inside llama.cpp (SIGILL from the AMX kernels of some Xeon CPUs is the
one seen in the field) must cost the vectors, never the daemon or keyword search. So the model
runs in a child process (memd/embed/host.py, started with exec, not fork), and this class:

- speaks to it over its stdin/stdout with length-prefixed msgpack frames, every answer awaited
  under a deadline;
- on a death (any signal, any exit) or a missed deadline kills and reaps it and raises
  ProviderUnavailable, so files stay pending and searches fall back to keyword mode; the next
  call starts a new worker after a backoff (1 s doubling to 60 s);
- when the worker dies while loading or on its first embedding, retries at once with safer load
  modes (extra buffer types off, then one thread as well) before it gives up on the model; the
  mode that worked is remembered per model file and CPU, so the next start does not crash first
  (the modes and that memory are memd/embed/load_modes.py);
- lets a search send its query to an idle worker itself and read the reply when it wants the
  vector (:meth:`ProcessEmbedder.send_query`): the model embeds while the search runs its
  keyword half, and no other thread has to be woken, nor win the GIL from that search, before
  the request leaves (1.5 ms of a 3.5 ms query on 2 cores; docs/benchmarks.md).

Over 400 lines: those are one state machine (starting, loading, serving, dead, backing off)
whose parts share every field (the lock, the process, its pipe, the query in flight).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from memd import frames
from memd.embed.base import BadVectors, Embedder, Kind, Preempted, Vectors, check_vectors
from memd.embed.llama import LlamaEmbedder
from memd.embed.load_modes import _MODE_INDEX, MODES, LoadMode, ModeMemory, cpu_signature
from memd.embed.sent import QueryLog, Searches, SentQuery
from memd_client.errors import ProviderUnavailable, from_wire

__all__ = ["ProcessEmbedder"]

logger = logging.getLogger(__name__)


BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


class WorkerDied(Exception):
    """The worker process died or stopped answering; ``cause`` says how ("SIGILL", "exit 3")."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class ProcessEmbedder(Embedder):
    """A local GGUF model served by a supervised worker process; same identity as in-process.

    Args:
        memory: where the working load mode is remembered (None: nowhere).
        load_timeout: seconds a worker may take to start and load the model.
        timeout: seconds allowed for one embedding call, plus ``per_text`` for each text.
    """

    provider = "local"

    def __init__(
        self,
        model_path: str | Path,
        *,
        threads: int = 0,
        query_threads: int = 0,
        batch_size: int = 32,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        memory: ModeMemory | None = None,
        load_timeout: float = 120.0,
        timeout: float = 60.0,
        per_text: float = 2.0,
    ) -> None:
        # The header is read here, in the daemon; nothing is loaded until the worker starts.
        spec = LlamaEmbedder(
            model_path,
            threads=threads,
            query_threads=query_threads,
            query_prefix=query_prefix,
            document_prefix=document_prefix,
        )
        self.path = spec.path
        self.model = spec.model
        self.dims = spec.dims
        self.max_tokens = spec.max_tokens
        self.batch_size = batch_size
        self.threads = spec.threads
        self.query_threads = spec.query_threads
        self.prefixes = spec.prefixes
        self._settings = spec.settings()
        self.memory = memory
        self.memory_key = f"{spec.fingerprint}:{cpu_signature()}"
        self.load_timeout = load_timeout
        self.timeout = timeout
        self.per_text = per_text

        self._lock = threading.Lock()
        # Queries embedded: the llama.cpp threads each had (every core only while nothing else
        # wants one, memd/embed/host.py) and the time it took them, for status.
        self.queries = QueryLog()
        self._proc: subprocess.Popen[bytes] | None = None
        # The worker that has loaded its model, and so handles SIGUSR1 (before, it would die).
        self._loaded: subprocess.Popen[bytes] | None = None
        self._pipe: frames.Pipe | None = None
        self._sent: SentQuery | None = None  # a query whose reply is still in the pipe
        self._searches = Searches()
        self._mode = 0
        self.mode_reason = ""
        remembered = memory.get(self.memory_key) if memory else None
        if remembered:
            self._mode = _MODE_INDEX[remembered["mode"]]
            self.mode_reason = str(remembered.get("reason", ""))
        self._proven = False  # the current mode has embedded something
        self._failures = 0  # deaths in a row since the last success
        self._retry_at = 0.0
        self.restarts = 0
        self.last_exit: str | None = None
        self.failed: str | None = None
        # One per death, "default settings: SIGILL", for doctor and the final error.
        self.crashes: list[str] = []

    # -- Embedder ---------------------------------------------------------------------------------

    def settings(self) -> dict[str, object]:
        # The load mode is left out: it changes how llama.cpp computes, not what it computes,
        # and a fallback must not cost a rebuild of every index.
        return dict(self._settings)

    def embed_batch(self, texts: Sequence[str], *, kind: Kind = "document") -> Vectors:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        deadline = self.timeout + self.per_text * len(texts)
        result = self._request(self._embed_request(texts, kind), deadline)
        return self._vectors(result, len(texts))

    def searching(self) -> AbstractContextManager[None]:
        return self._searches.one()

    def query_takes_every_core(self) -> bool:
        # The worker decides per query (memd/embed/host.py); what it gave the last one is the
        # likeliest answer, and a query while other searches run never gets every core.
        every = self.query_threads > self.threads and self.queries.last == self.query_threads
        return every and self._searches.count <= 1

    def _embed_request(self, texts: Sequence[str], kind: Kind) -> dict[str, Any]:
        """A query while other searches run takes the documents' share of the cores (the
        searches need the rest), else every core; documents always take their share."""
        request: dict[str, Any] = {"op": "embed", "texts": list(texts), "kind": kind}
        if kind == "query" and self._searches.count > 1:
            request["crowded"] = True
        return request

    def send_query(self, text: str) -> Future[Vectors] | None:
        """Send ``text`` to a worker that serves and has nothing to do, and return at once;
        the future's result reads the reply. None when the worker is busy (a document job, a
        query before this one), not started or failed: the caller queues the query instead
        (which also starts the worker, or says why it cannot)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._proc is None or self._pipe is None or not self._proven or self.failed:
                return None
            if self._sent is not None:
                return None
            timeout = self.timeout + self.per_text
            now = time.monotonic()
            sent = SentQuery(self, now + timeout, now)
            try:
                self._pipe.send(self._embed_request([text], "query"), timeout)
            except frames.ChildFailed as exc:
                with contextlib.suppress(ProviderUnavailable):
                    self._failed_pipe(exc)  # the queued query says what became of the worker
                return None
            self._sent = sent
            return sent
        finally:
            self._lock.release()

    def collect(self, sent: SentQuery, timeout: float | None) -> None:
        """Read the reply to ``sent``, or, while another request holds the pipe, wait for it to
        do so: every request reads the reply sent ahead before its own (:meth:`_drain`)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not sent.done():
            if self._lock.acquire(blocking=False):
                try:
                    self._drain()
                finally:
                    self._lock.release()
                return
            # (Polled: a query being sent holds the lock for microseconds and reads nothing.)
            wait = 0.001 if end is None else min(0.001, end - time.monotonic())
            if wait <= 0:
                return
            with contextlib.suppress(TimeoutError):
                sent.exception(wait)

    def _drain(self) -> None:
        """Under the lock, before anything else is sent: read the reply to the query sent ahead,
        and settle its future whatever happens."""
        sent, self._sent = self._sent, None
        if sent is None:
            return
        assert self._pipe is not None
        try:
            try:
                reply = _stamped(
                    self._pipe.receive(max(0.0, sent.deadline - time.monotonic())), sent.sent_at
                )
            except frames.ChildFailed as exc:
                self._failed_pipe(exc)
            if "error" in reply:
                raise ProviderUnavailable(_named(str(from_wire(reply["error"]))))
            vector = self._vectors(reply["ok"], 1)[0]
        except ProviderUnavailable as exc:
            sent.set_exception(exc)
        except Exception as exc:  # a whole frame was read: the pipe is still in step
            why = f"local model {self.path.name}: an unreadable reply ({exc!r})"
            sent.set_exception(ProviderUnavailable(why))
        except BaseException as exc:
            sent.set_exception(exc)
            raise
        else:
            self._succeeded()
            sent.set_result(vector)

    def _failed_pipe(self, exc: frames.ChildFailed) -> None:
        """A send or read that failed outside the request loop: the worker is dead or hung,
        and is handled as the loop would (it was proven, so this always raises)."""
        try:
            self._exchange_failed(exc)
        except WorkerDied as died:
            self._died(died.cause)
        raise ProviderUnavailable(f"local model worker: {exc}")  # not reached once proven

    def _vectors(self, result: dict[str, Any], count: int) -> Vectors:
        if "threads" in result:  # a query, and the llama.cpp threads the worker gave it
            self.queries.add(int(result["threads"]), result.get("seconds"), result.get("outside"))
        flat = np.frombuffer(result["data"], dtype=np.float32)
        rows = int(result["rows"])
        try:
            if flat.size != rows * self.dims:
                raise BadVectors(f"{flat.size} values for {rows} vector(s) of {self.dims} dims")
            vectors = flat.reshape(rows, self.dims).copy()
            check_vectors(vectors, count, self.dims)
        except BadVectors as exc:
            raise ProviderUnavailable(f"local model {self.path.name}: {exc}") from None
        return vectors

    def count_tokens(self, text: str) -> int:
        return int(self._request({"op": "tokens", "text": text}, self.timeout))

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        counts = self._request({"op": "tokens", "texts": list(texts)}, self.timeout)
        return [int(n) for n in counts]

    def preempt(self) -> None:
        """Ask the worker to stop the document embedding it runs (SIGUSR1): the call raises
        Preempted and the query queued behind it goes first."""
        proc = self._loaded
        if proc is not None and proc is self._proc and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR1)

    def probe(self) -> None:
        """Start the worker and embed one text, walking the load modes if it dies doing so."""
        self.embed_batch(["memd probe"], kind="query")

    def close(self) -> None:
        with self._lock:
            self._stop(graceful=True)

    def describe(self) -> str:
        return f"local:{self.path.name} ({self.dims} dims)"

    # -- what status shows ------------------------------------------------------------------------

    @property
    def mode(self) -> LoadMode:
        return MODES[min(self._mode, len(MODES) - 1)]

    def health(self) -> dict[str, Any]:
        """The worker as status shows it: state, pid, restarts, last exit, load mode and why."""
        proc = self._proc
        state = "failed" if self.failed else "running" if proc is not None else "stopped"
        if state == "stopped" and self._retry_at > time.monotonic():
            state = "restarting"
        return {
            "state": state,
            "pid": proc.pid if proc is not None else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "mode": self.mode.name,
            "settings": self.mode.label,
            "reason": self.mode_reason or None,
            "error": self.failed,
            "query_threads": self.queries.counts(),
            "query_ms": self.queries.times_ms(),
        }

    # -- supervision ------------------------------------------------------------------------------

    def _request(self, message: dict[str, Any], timeout: float) -> Any:
        with self._lock:
            while True:
                if self.failed:
                    raise ProviderUnavailable(self.failed)
                try:
                    self._drain()  # a query sent ahead is answered before this is asked
                    if self._proc is None:
                        wait = self._retry_at - time.monotonic()
                        if wait > 0:
                            raise ProviderUnavailable(
                                f"local model worker died ({self.last_exit}); "
                                f"restarting in {wait:.0f} s"
                            )
                        self._start()
                    reply = self._exchange(message, timeout)
                except WorkerDied as exc:
                    self._died(exc.cause)  # raises unless a safer mode is to be tried now
                    continue
                if "error" in reply:
                    raise ProviderUnavailable(_named(str(from_wire(reply["error"]))))
                if reply.get("preempted"):
                    raise Preempted()
                if message["op"] == "embed":
                    self._succeeded()
                return reply["ok"]

    def _start(self) -> None:
        mode = self.mode
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._proc = frames.start_child("memd.embed.host", env=env)
        assert self._proc.stdout is not None
        assert self._proc.stdin is not None
        self._pipe = frames.Pipe(self._proc.stdin, self._proc.stdout)
        load = {
            "op": "load",
            "path": str(self.path),
            "threads": 1 if mode.one_thread else self.threads,
            "query_threads": 1 if mode.one_thread else self.query_threads,
            "query_prefix": self.prefixes.query,
            "document_prefix": self.prefixes.document,
            "extra_bufts": mode.extra_bufts,
            "mode": mode.name,
        }
        reply = self._exchange(load, self.load_timeout)
        if "error" in reply:
            self._stop(graceful=True)
            error = str(reply["error"])
            # The worker's own refusals already name the model (a damaged file, wrong dims).
            named = error.startswith(f"local model {self.path.name}")
            self._give_up(
                error if named else f"local model {self.path.name} failed to load: {error}"
            )
        self._loaded = self._proc
        logger.info(
            "local model worker %d started: %s (%s)", self._proc.pid, self.path.name, mode.label
        )

    def _exchange(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self._pipe is not None
        sent = time.monotonic()
        try:
            return _stamped(self._pipe.exchange(message, timeout), sent)
        except frames.ChildFailed as exc:
            self._exchange_failed(exc)
            raise  # not reached

    def _exchange_failed(self, exc: frames.ChildFailed) -> None:
        if exc.why == "closed":
            raise WorkerDied(self._reap()) from None
        self._kill()  # hung, or talking nonsense
        raise WorkerDied(str(exc)) from None

    def _died(self, cause: str) -> None:
        """Clean up after a dead worker; return to retry at once in a safer mode, else raise."""
        self._stop(graceful=False)
        self.last_exit = cause
        self.restarts += 1
        mode = self.mode
        self.crashes.append(f"{mode.label}: {cause}")
        if not self._proven:
            logger.error(
                "local model worker died (%s) loading or on its first embedding (%s)",
                cause,
                mode.label,
            )
            if self._mode + 1 < len(MODES):
                self._mode += 1
                self.mode_reason = cause
                if self.memory is not None:
                    with contextlib.suppress(OSError):
                        self.memory.put(self.memory_key, self.mode.name, cause)
                logger.warning("retrying %s in %s", self.path.name, self.mode.label)
                return
            self._give_up(
                f"local model {self.path.name} crashed in every load mode "
                f"({'; '.join(self.crashes)})"
            )
        self._failures += 1
        wait = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self._failures - 1))
        self._retry_at = time.monotonic() + wait
        logger.error("local model worker died (%s); restarting in %.0f s", cause, wait)
        raise ProviderUnavailable(f"local model worker died ({cause}); restarting in {wait:.0f} s")

    def _give_up(self, why: str) -> None:
        self.failed = why
        logger.error("%s", why)
        raise ProviderUnavailable(why)

    def _succeeded(self) -> None:
        self._failures = 0
        if not self._proven:
            self._proven = True
            if self._mode and self.memory is not None:
                with contextlib.suppress(OSError):
                    self.memory.put(self.memory_key, self.mode.name, self.mode_reason)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def _reap(self) -> str:
        """Wait for the worker that closed its pipe; say how it ended."""
        assert self._proc is not None
        try:
            code = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self._proc.wait()
            return "closed its pipe and was killed"
        return frames.describe_exit(code)

    def _stop(self, *, graceful: bool) -> None:
        sent, self._sent = self._sent, None
        if sent is not None and not sent.done():
            sent.set_exception(ProviderUnavailable("local model worker stopped"))
        proc, self._proc = self._proc, None
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if graceful:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _named(error: str) -> str:
    """A worker's error as a ProviderUnavailable message: it names the local model."""
    return error if error.startswith("local model") else f"local model: {error}"


def _stamped(reply: dict[str, Any], sent: float) -> dict[str, Any]:
    """A query's reply with ``outside``: the seconds from its sending to its reading that the
    worker was not in llama.cpp (the pipe both ways, the wake-ups, a reader busy elsewhere)."""
    ok = reply.get("ok")
    if isinstance(ok, dict) and "began" in ok:
        ok["outside"] = max(0.0, ok["began"] - sent) + max(0.0, time.monotonic() - ok["ended"])
    return reply
