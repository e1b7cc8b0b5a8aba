"""A real memd daemon on a short temporary socket, for tests that talk to it over the socket."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from memd.clock import Clock
from memd.config import Config
from memd.daemon import Daemon
from memd.embed.fake import FakeEmbedder
from memd.embed.select import Choice

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; fail naming
    ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def short_socket_dir() -> Path:
    """AF_UNIX paths must stay under ~100 bytes: pytest's tmp_path is often longer."""
    return Path(tempfile.mkdtemp(prefix="memd-", dir="/tmp"))


@contextmanager
def running_daemon(
    config: Config | None = None,
    *,
    embedder: FakeEmbedder | None = None,
    socket_dir: Path | None = None,
    debounce_ms: int = 100,
    clock: Clock | None = None,
    choose_embedder: bool = False,
) -> Iterator[Daemon]:
    """Start a Daemon on a thread (no signal handlers), yield it ready, always stop it.

    Its embedder is ``embedder`` (a FakeEmbedder by default), or with ``choose_embedder`` the
    one ``config`` selects, the way `memd run` chooses.
    """
    config = config or Config.load()
    own_dir = socket_dir is None
    directory = socket_dir or short_socket_dir()
    choice = None if choose_embedder else Choice(embedder or FakeEmbedder(), "fake", protect=False)
    daemon = Daemon(
        config, choice=choice, socket=directory / "memd.sock", debounce_ms=debounce_ms, clock=clock
    )
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(daemon.run(install_signals=False)), name="test-daemon"
    )
    thread.start()
    try:
        while not daemon.ready.wait(0.05):
            if not thread.is_alive():
                raise RuntimeError(f"daemon did not start (exit code {codes})")
        yield daemon
    finally:
        daemon.request_stop()
        thread.join(30)
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
