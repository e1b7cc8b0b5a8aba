"""The model worker: a process of its own that runs llama.cpp for the daemon.

Started by memd/embed/process.py as ``python -m memd.embed.host``. It reads requests from
stdin and writes replies to the stdout it was given; its own fd 1 is pointed at stderr first,
so nothing a native library prints can corrupt the protocol. Frames as memd/frames.py says.
Requests: ``{"op": "load", ...}`` (once, first), ``{"op": "embed",
"texts": [...], "kind": "query"|"document"}``, ``{"op": "tokens", "text": ...}`` (or
``"texts": [...]``: a list of counts). Replies:
``{"ok": result}`` or ``{"error": [code, message]}`` for errors the model reports in an orderly way
(an input too long); a crash is the process dying, which the supervisor sees and handles. An
embedding's result is ``{"rows", "data"}``, and for a query ``"threads"`` and ``"seconds"``
too: the llama.cpp threads it was given (:class:`_QueryCores`) and the time it took them.

A document embedding can be stopped for a query: the daemon sends SIGUSR1, llama.cpp's abort
callback sees it between two steps of the decode, and the reply is ``{"preempted": true}``;
the daemon sends the query, then the documents again.

Once no request has come for ``IDLE_SHRINK_S`` after an embedding, the worker gives back the
output buffer llama.cpp grew for it (``LlamaEmbedder.shrink``; see memd/embed/llama.py).

It exits when stdin closes (the daemon stopped or died), and on Linux also when the daemon dies
while the worker is stuck in native code (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from memd import frames

if TYPE_CHECKING:
    from memd.embed.llama import LlamaEmbedder

__all__ = ["FAULT_ENV"]

FAULT_ENV = "MEMD_TEST_WORKER_FAULT"
"""Test-only: make the worker crash or hang on purpose (see ``_Faults``). Never set in use."""

IDLE_SHRINK_S = 2.0
"""Seconds without a request, after an embedding, before the worker shrinks the model's output
buffer (hundreds of MB with a large vocabulary, milliseconds to give back)."""


class _Preemption:
    """SIGUSR1 asks (``asked``); a document embedding (``armed``) stops at the next step of its
    decode, which takes the request (so a late signal stops at most one job)."""

    def __init__(self) -> None:
        self.asked = self.armed = self.fired = False

    def on_signal(self, signum: int, frame: object) -> None:
        self.asked = True

    def abort(self) -> bool:
        if self.armed and self.asked:
            self.asked, self.fired = False, True
            return True
        return False


_preemption = _Preemption()


class _Faults:
    """Crashes and hangs on demand, for the supervisor's tests (a native crash in llama.cpp
    cannot be triggered at will on every CPU, so the tests ask for one here).

    ``MEMD_TEST_WORKER_FAULT`` holds rules separated by ``;``, each ``ACTION:WHEN[:MODE]``:
    ACTION is ``segv``, ``ill`` (die by that signal), ``exit`` (exit 3) or ``hang``; WHEN is
    ``load``, ``embedN`` (the Nth embed request of this process), ``query`` or ``document``
    (every embed request of that kind); MODE limits the rule to one load mode (``default``,
    ``safe``, ``safe-1-thread``).
    """

    def __init__(self, spec: str, mode: str) -> None:
        self.rules: list[tuple[str, str]] = []
        for rule in filter(None, (r.strip() for r in spec.split(";"))):
            action, when, *only = rule.split(":")
            if not only or only[0] == mode:
                self.rules.append((action, when))

    def at(self, when: str) -> None:
        for action, rule_when in self.rules:
            if rule_when == when:
                _fail(action)


def _fail(action: str) -> None:
    if action == "hang":
        while True:
            time.sleep(3600)
    if action == "exit":
        os._exit(3)
    sig = {"segv": signal.SIGSEGV, "ill": signal.SIGILL}[action]
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(10)  # the signal is delivered before this returns


class _Idle:
    """Runs ``action`` once no request has come for ``seconds`` since the last ``arm()``.

    One thread for the worker's life: a timer thread started per embedding made every answer
    wait for that thread's start (0.5-1 ms of a query's 3-5 on a 2-core VM whose other core
    slept; docs/benchmarks.md)."""

    def __init__(self, seconds: float, action: Any) -> None:
        self.seconds, self.action = seconds, action
        self._due: float | None = None
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="memd-worker-idle", daemon=True).start()

    def cancel(self) -> None:
        with self._changed:
            self._due = None

    def arm(self) -> None:
        with self._changed:
            self._due = time.monotonic() + self.seconds
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._due is None or time.monotonic() < self._due:
                    wait = None if self._due is None else self._due - time.monotonic()
                    self._changed.wait(wait)
                self._due = None
            self.action()


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return  # elsewhere the closed stdin ends the worker once native code returns
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)


def serve(inp: IO[bytes], out: IO[bytes]) -> int:
    from memd.embed.llama import LlamaEmbedder
    from memd_client.errors import ProviderUnavailable

    engine: LlamaEmbedder | None = None
    faults = _Faults("", "")
    embeds = 0
    idle: _Idle | None = None
    cores = _QueryCores()
    while True:
        request = frames.read(inp)
        if request is None:
            return 0
        if idle is not None:
            idle.cancel()
        op = request.get("op")
        try:
            if op == "load":
                faults = _Faults(os.environ.get(FAULT_ENV, ""), str(request["mode"]))
                faults.at("load")
                engine = LlamaEmbedder(
                    request["path"],
                    threads=int(request["threads"]),
                    query_threads=int(request.get("query_threads", 0)),
                    query_prefix=request["query_prefix"],
                    document_prefix=request["document_prefix"],
                    extra_bufts=bool(request["extra_bufts"]),
                )
                engine.load()
                engine.allow_abort(_preemption.abort)
                idle = _Idle(IDLE_SHRINK_S, engine.shrink)
                reply: dict[str, Any] = {"ok": {"pid": os.getpid(), "dims": engine.dims}}
            elif engine is None:
                raise ProviderUnavailable(f"{op!r} before the model was loaded")
            elif op == "embed":
                embeds += 1
                faults.at(f"embed{embeds}")
                faults.at(str(request["kind"]))
                threads, took, began = 0, 0.0, 0.0
                if request["kind"] == "query":
                    threads = cores.threads(engine, bool(request.get("crowded")))
                    began = time.monotonic()
                    vectors = _embed(engine, request["texts"], "query", threads)
                    took = time.monotonic() - began
                    chars = sum(len(t) for t in request["texts"])
                    cores.took(engine, threads, chars, took)
                else:
                    vectors = _embed(engine, request["texts"], str(request["kind"]), 0)
                if vectors is None:
                    reply = {"preempted": True}
                else:
                    ok = {"rows": int(vectors.shape[0]), "data": vectors.tobytes()}
                    if threads:  # the clock is the machine's: the daemon sets its own beside it
                        ok.update(threads=threads, seconds=took, began=began, ended=began + took)
                    reply = {"ok": ok}
            elif op == "tokens":
                if "texts" in request:
                    reply = {"ok": [engine.count_tokens(t) for t in request["texts"]]}
                else:
                    reply = {"ok": engine.count_tokens(request["text"])}
            else:
                raise ProviderUnavailable(f"unknown request {op!r}")
        except ProviderUnavailable as exc:
            reply = frames.error_frame(exc)
        except Exception as exc:  # reported to the daemon, which keeps the worker
            reply = frames.error_frame(ProviderUnavailable(f"{type(exc).__name__}: {exc}"))
        frames.write(out, reply)
        if op == "embed" and idle is not None:
            idle.arm()  # once answered: the countdown is none of the caller's wait


class _QueryCores:
    """How many llama.cpp threads a query gets: every core (``engine.query_threads``) only
    when nothing else wants them.

    llama.cpp's threads wait for each other by spinning, so one that shares a core with other
    work stalls the rest: on a 2-core AMD EPYC two busy loops made a two-thread MiniLM query
    take 844 ms against 9 on one thread (docs/benchmarks.md). So a query takes the documents'
    share when other searches run in the daemon (``crowded``), when more tasks are runnable
    than its threads and one more (this worker's thread and the searching thread are two; a
    third is often a moment's work of the daemon's), and for a while (``BACK_OFF_S``, doubling
    while it happens again) after an all-core query that stalled: ``SLOW`` times as long as the
    fastest one (in proportion, if longer) and ``STALL_S`` more. Such a stall costs tens to
    hundreds of milliseconds, one thread about 2 ms a query; a query of 10 ms where the
    fastest took 2 is a wake-up or a page fault, not a stall (in a quiet daemon, a factor of 4
    alone sent 96 % of the queries to one thread).
    """

    SLOW = 8.0  # a stall: this many times the expected time, and STALL_S more
    STALL_S = 0.025
    BACK_OFF_S = 30.0  # doubling with each stall in a row, to BACK_OFF_MAX_S
    BACK_OFF_MAX_S = 600.0

    def __init__(self) -> None:
        self.best: tuple[float, int] | None = None  # the fastest all-core query: seconds, chars
        self.until = 0.0  # monotonic: no all-core query before this
        self.back_off = self.BACK_OFF_S

    def threads(self, engine: LlamaEmbedder, crowded: bool) -> int:
        if crowded or engine.query_threads <= engine.threads or time.monotonic() < self.until:
            return engine.threads
        fits = _runnable() <= engine.query_threads + 1
        return engine.query_threads if fits else engine.threads

    def took(self, engine: LlamaEmbedder, threads: int, chars: int, seconds: float) -> None:
        if threads <= engine.threads:
            return
        if self.best is None or seconds < self.best[0]:
            self.best = (seconds, max(chars, 1))
            return
        # A longer text may take longer in proportion; a shorter one no less than the best.
        best, best_chars = self.best
        expected = best * max(1.0, chars / best_chars)
        if seconds > max(self.SLOW * expected, expected + self.STALL_S):
            self.until = time.monotonic() + self.back_off
            self.back_off = min(self.BACK_OFF_MAX_S, 2 * self.back_off)
        else:
            self.back_off = self.BACK_OFF_S


def _runnable() -> float:
    """Tasks runnable on this machine now, this worker's thread among them: the kernel's count
    (/proc/loadavg, about 20 µs to read); elsewhere one more than the last minute's load."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return float(f.read().split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return 1.0 + os.getloadavg()[0]


def _embed(engine: LlamaEmbedder, texts: list[str], kind: str, threads: int) -> Any:
    """The vectors of ``texts``, or None when a query asked the document embedding to stop."""
    if kind == "query":
        _preemption.asked = False  # the query that asked is served now
        return engine.embed_batch(texts, kind="query", threads=threads)
    _preemption.armed, _preemption.fired = True, False
    try:
        return engine.embed_batch(texts, kind="document")
    except RuntimeError:
        if _preemption.fired:
            return None
        raise
    finally:
        _preemption.armed = False


def main() -> int:
    out = frames.begin_child()
    signal.signal(signal.SIGUSR1, _preemption.on_signal)
    _die_with_parent()
    # A core file per native crash of a 100 MB model process helps nobody; the daemon logs it.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        return serve(sys.stdin.buffer, out)
    except (EOFError, BrokenPipeError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
