"""Crash consistency (reliability notes G1.1, G2.1): SIGKILL `memd run` at random points.

Each test is one kill point: a fresh MEMD_HOME, the daemon started as a real process, an
operation begun (first index, forced rebuild, or promotion under a search loop), SIGKILL after
a random delay, then a restart. Once the restarted daemon has reconciled it is stopped and:

- the index passes SQLite's quick_check, FTS5's integrity-check and row agreement;
- vector rows == embedded chunk rows == chunk rows;
- the logical dump equals the dump of a fresh index of the same files (the oracle);
- no ``*.tmp-*`` leftovers of a rebuild remain in the index directory;
- the recall store's JSON parses and ``RecallStore.load()`` works;
- (promotion) MEMORY.md still holds every line the human wrote.

Points per phase: ``MEMD_CRASH_POINTS`` (default 4, for CI). The full run uses
``MEMD_CRASH_POINTS=70`` (3 phases x 70 = 210 kill points)::

    MEMD_CRASH_POINTS=70 .venv/bin/pytest tests/test_crash.py

The delays come from an RNG seeded with ``MEMD_CRASH_SEED`` (random if unset); every failure
message names the seed, so a failing point can be replayed (timing permitting) with
``MEMD_CRASH_SEED=<seed> pytest 'tests/test_crash.py::test_kill_point[<phase>-<n>]'``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import memd_client

from .crash_helpers import (
    SEARCH_QUERIES,
    WS_NAME,
    Daemon,
    check_human_lines,
    check_index,
    check_recall_store,
    daemon_env,
    wait_reconciled,
    write_corpus,
    write_promotion_workspace,
)

POINTS = int(os.environ.get("MEMD_CRASH_POINTS", "4"))
SEED = int(os.environ.get("MEMD_CRASH_SEED") or random.SystemRandom().randrange(2**31))


@pytest.fixture(autouse=True)
def no_autostart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client must not start a daemon of its own while the test's is dead."""
    monkeypatch.setenv("MEMD_AUTOSTART", "0")


def _indexing(daemon: Daemon, ws: Path, rng: random.Random, notes: dict[str, Any]) -> None:
    """Kill during the first index of a new workspace (queued by workspace_add)."""
    write_corpus(ws)
    daemon.start()
    with daemon.client() as c:
        c.workspace_add(str(ws), name=WS_NAME)
    delay = notes["delay"] = rng.uniform(0.0, 1.5)
    time.sleep(delay)
    daemon.kill()


def _rebuild(daemon: Daemon, ws: Path, rng: random.Random, notes: dict[str, Any]) -> None:
    """Kill during a forced rebuild of a fully indexed workspace."""
    write_corpus(ws)
    daemon.start()
    with daemon.client() as c:
        c.workspace_add(str(ws), name=WS_NAME)
    wait_reconciled(daemon)
    with daemon.client() as c:
        c.reindex(WS_NAME, force=True, wait=False)
    delay = notes["delay"] = rng.uniform(0.0, 1.0)
    time.sleep(delay)
    daemon.kill()


def _promotion(daemon: Daemon, ws: Path, rng: random.Random, notes: dict[str, Any]) -> None:
    """Kill during `promote --apply` while searches keep recording recalls."""
    write_promotion_workspace(ws)
    daemon.start()
    with daemon.client() as c:
        c.workspace_add(str(ws), name=WS_NAME)
    wait_reconciled(daemon)
    stop = threading.Event()
    errors: list[BaseException] = []

    def search_loop() -> None:
        try:
            with daemon.client(timeout=10) as c:
                i = 0
                while not stop.is_set():
                    c.search(WS_NAME, SEARCH_QUERIES[i % len(SEARCH_QUERIES)])
                    i += 1
                    # promote first waits for the recall recorder to go idle (up to 10 s);
                    # back-to-back searches keep it busy, so leave it gaps.
                    stop.wait(0.02)
        except memd_client.MemdError:
            pass  # the daemon was killed under us
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    def promote() -> None:
        try:
            with daemon.client(timeout=30) as c:
                result = c.call(
                    "promote",
                    workspace=WS_NAME,
                    apply=True,
                    min_score=0.0,
                    min_recall_count=0,
                    min_unique_queries=0,
                )
                notes["promoted"] = len(result["applied"])
        except memd_client.MemdError:
            notes["promoted"] = "killed"
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    searcher = threading.Thread(target=search_loop, name="crash-search")
    promoter = threading.Thread(target=promote, name="crash-promote")
    searcher.start()
    try:
        time.sleep(0.05)  # searches (and recall writes) are under way
        promoter.start()
        delay = notes["delay"] = rng.uniform(0.0, 0.3)
        time.sleep(delay)
        daemon.kill()
    finally:
        stop.set()
        daemon.kill()
        searcher.join(30)
        if promoter.ident is not None:
            promoter.join(30)
    if errors:
        raise errors[0]


PHASES: dict[str, Callable[[Daemon, Path, random.Random, dict[str, Any]], None]] = {
    "indexing": _indexing,
    "rebuild": _rebuild,
    "promotion": _promotion,
}


@pytest.mark.parametrize("point", range(POINTS))
@pytest.mark.parametrize("phase", list(PHASES))
def test_kill_point(phase: str, point: int, tmp_path: Path) -> None:
    rng = random.Random(f"{SEED}-{phase}-{point}")
    notes: dict[str, Any] = {}
    ws = tmp_path / "workspace"
    with daemon_env(tmp_path) as daemon:

        def where() -> str:
            return f"MEMD_CRASH_SEED={SEED} phase={phase} point={point} {notes}"

        try:
            PHASES[phase](daemon, ws, rng, notes)
            daemon.start()  # the restart: it must clean up and reconcile on its own
            wait_reconciled(daemon)
            code = daemon.stop()
        except (TimeoutError, RuntimeError, memd_client.MemdError) as exc:
            pytest.fail(f"{where()}: {exc}\n{daemon.log_tail()}")
        assert code == 0, f"{where()}: restarted daemon exited {code}\n{daemon.log_tail()}"
        problems = check_index(daemon.home, ws, tmp_path / "oracle")
        problems += check_recall_store(ws, daemon.home)
        if phase == "promotion":
            problems += check_human_lines(ws)
        assert not problems, f"{where()}: {problems}\n{daemon.log_tail()}"
