"""Kill harness for the crash tests: workspaces, a `memd run` subprocess, the oracle and the checks.

Nothing here asserts; the checks return a list of problems so the test can report them all at once
together with the seed and the daemon's log.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import memd_client
from memd.clock import Clock
from memd.config import Config
from memd.dreams.recall_file import STORE_NAME
from memd.dreams.recall_store import RecallStore
from memd.embed.fake import FakeEmbedder
from memd.index.audit import DumpRow
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.workspace import dreams_folder

WS_NAME = "crash"

# -- workspaces -----------------------------------------------------------------------------------

_WORDS = (
    "alpha backup cache deploy editor feature gateway history index journal kernel ledger "
    "migration network outage pipeline query release schema token upgrade vector widget "
    "account budget contract design estimate forecast invoice meeting planning report roadmap "
    "server storage ticket vendor window archive battery camera garden kitchen library "
    "morning evening weekend holiday travel flight hotel train coffee dinner lunch recipe"
).split()


def write_corpus(root: Path, files: int = 60, paragraphs: int = 14) -> None:
    """``files`` Markdown notes of a few KB each under ``root/memory``; the same text every time."""
    rng = random.Random(20240601)  # fixed: the corpus is data, not part of the kill randomness
    memory = root / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        parts = [f"# Project note {i}\n"]
        for p in range(paragraphs):
            words = " ".join(rng.choice(_WORDS) for _ in range(36))
            parts.append(f"## Topic {i}.{p}\n\n{words}.\n\n- item {rng.choice(_WORDS)} {p}\n")
        (memory / f"notes-{i:03d}.md").write_text("\n".join(parts), encoding="utf-8")


HUMAN_MEMORY = (
    "# Long-Term Memory\n"
    "\n"
    "Written by a human; every line here must survive promotion and crashes.\n"
    "- Alice prefers tea over coffee in the morning.\n"
    "- The staging database lives on db-stage-2 behind the bastion host.\n"
    "- Never deploy on Fridays after 15:00.\n"
)

DAILY_DAYS = ("2026-03-26", "2026-03-27", "2026-03-28", "2026-03-29", "2026-03-30")
FACTS_PER_DAY = 4
SEARCH_QUERIES = (
    "vpn gateway password rotation",
    "where is the runbook for the backup cluster",
    "release train schedule",
    "how do we rotate the token",
    "which vendor handles storage",
)


def _fact(day: str, k: int) -> str:
    topics = ("vpn gateway", "backup cluster", "release train", "api token", "storage vendor")
    topic = topics[(k + DAILY_DAYS.index(day)) % len(topics)]
    return (
        f"- Decision {day}/{k}: the {topic} runbook moved to ops/{topic.replace(' ', '-')}-{k}.md"
    )


def write_promotion_workspace(root: Path) -> None:
    """MEMORY.md by a human, five daily notes with facts, some filler, and a recall store in
    which every fact was recalled by five distinct queries on five days."""
    write_corpus(root, files=20)
    (root / "MEMORY.md").write_text(HUMAN_MEMORY, encoding="utf-8")
    hits: list[dict[str, Any]] = []
    for day in DAILY_DAYS:
        lines = [f"# {day}", ""] + [_fact(day, k) for k in range(FACTS_PER_DAY)]
        (root / "memory" / f"{day}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        hits += [
            {"path": f"memory/{day}.md", "start_line": 3 + k, "end_line": 3 + k, "score": 0.9}
            for k in range(FACTS_PER_DAY)
        ]
    # Promotion ignores entries last recalled more than 30 days ago, and the daemon's clock is
    # the real one: recall on five days ending today.
    today = datetime.now(UTC).replace(microsecond=0)
    moment = iter(today - timedelta(days=d) for d in (8, 6, 4, 2, 0))
    now = today

    def clock() -> datetime:
        return now

    store = RecallStore(root, clock=Clock("UTC", source=clock))
    for query in SEARCH_QUERIES:
        now = next(moment)
        store.record(query, hits)


# -- the daemon -----------------------------------------------------------------------------------


@dataclass
class Daemon:
    """`python -m memd run` on ``home``/``sock``; each start logs to ``log_dir/daemon-N.log``."""

    home: Path
    sock: Path
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    _files: list[IO[bytes]] = field(default_factory=list)

    def start(self, timeout: float = 30, crash_at: str = "") -> subprocess.Popen[bytes]:
        """Start memd; ``crash_at`` names the points where it SIGKILLs itself (MEMD_CRASH_AT)."""
        env = dict(
            os.environ,
            MEMD_HOME=str(self.home),
            MEMD_SOCKET=str(self.sock),
            MEMD_EMBEDDING_PROVIDER="fake",
            MEMD_CRASH_AT=crash_at,
        )
        log = self.log_dir / f"daemon-{len(self.logs)}.log"
        out = log.open("wb")
        self._files.append(out)
        self.logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "memd", "--log-level", "info", "run"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"memd exited {proc.returncode} at start\n{self.log_tail()}")
            try:
                with memd_client.connect(self.sock, timeout=2) as c:
                    c.call("hello")
                    return proc
            except memd_client.MemdError:
                time.sleep(0.02)
        raise RuntimeError(f"memd did not become ready\n{self.log_tail()}")

    def client(self, timeout: float = 30) -> memd_client.Client:
        return memd_client.connect(self.sock, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the running daemon and reap it."""
        proc = self.procs[-1]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL if it hangs: -9)."""
        proc = self.procs[-1]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
            return -9

    def close(self) -> None:
        """Kill and reap everything still running, close the log files (always safe to call)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        for f in self._files:
            f.close()
        self._files.clear()

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for log in self.logs:
            text = log.read_text(encoding="utf-8", errors="replace").splitlines()
            out.append(f"--- {log.name} (last {lines} lines) ---")
            out.extend(text[-lines:])
        return "\n".join(out)


@contextlib.contextmanager
def daemon_env(base: Path) -> Iterator[Daemon]:
    """A fresh MEMD_HOME under ``base`` and a short private socket directory under /tmp."""
    sock_dir = Path(tempfile.mkdtemp(prefix="memd-crash-", dir="/tmp"))
    daemon = Daemon(base / "memd-home", sock_dir / "memd.sock", base)
    try:
        yield daemon
    finally:
        daemon.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def reconciled(status: dict[str, Any]) -> bool:
    st = status["workspaces"][0]
    fresh = st["freshness"]
    return bool(
        st["files_indexed"] == st["files_on_disk"]
        and st["files_pending"] == 0
        and st["files_stale"] == 0
        and st["identity"]["state"] == "valid"
        and fresh["fresh"]
        and not fresh["rebuilding"]
        and st["last_sync"] is not None  # the restarted daemon finished a sync of its own
    )


def wait_reconciled(daemon: Daemon, name: str = WS_NAME, timeout: float = 30) -> dict[str, Any]:
    """Poll ``status`` until the workspace is fully indexed and fresh; return the last status."""
    deadline = time.monotonic() + timeout
    with daemon.client() as c:
        while True:
            status = c.status(name)
            if reconciled(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"not reconciled after {timeout}s: {json.dumps(status['workspaces'][0])[:3000]}"
                )
            time.sleep(0.05)


# -- oracle and checks ----------------------------------------------------------------------------

Dump = list[DumpRow]
_ORACLE_CACHE: dict[str, Dump] = {}


def _fingerprint(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.md")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def oracle_dump(root: Path, scratch: Path) -> Dump:
    """The logical dump of a fresh index of ``root`` (cached by the workspace's Markdown content:
    the dump holds workspace-relative paths only, so equal content gives an equal dump)."""
    key = _fingerprint(root)
    if key not in _ORACLE_CACHE:
        scratch.mkdir(parents=True, exist_ok=True)
        index = Index(scratch / f"oracle-{key[:12]}.sqlite")
        index.open()
        try:
            report = Syncer(index, root, config=Config.load().index, embedder=FakeEmbedder()).sync()
            assert not report.errors, report.errors
            with index.reader() as s:
                _ORACLE_CACHE[key] = s.dump()
        finally:
            index.close()
    return _ORACLE_CACHE[key]


def check_index(home: Path, root: Path, scratch: Path) -> list[str]:
    """The G1.1 invariants on the (stopped) daemon's index of ``root``; [] when all hold."""
    index_dir = home / "state" / "indexes"
    problems: list[str] = []
    leftovers = sorted(p.name for p in index_dir.glob(f"*{Index.TEMP_MARK}*"))
    if leftovers:
        problems.append(f"temp files left in the index dir: {leftovers}")
    paths = sorted(index_dir.glob("*.sqlite"))
    if len(paths) != 1:
        return [*problems, f"expected one index file, found {[p.name for p in paths]}"]
    index = Index(paths[0])
    index.open()
    try:
        found = index.writer().integrity()
        if found:
            problems.append(f"integrity: {found}")
        with index.reader() as s:
            counts = s.counts()
            dump = s.dump()
    finally:
        index.close()
    if not counts["vectors"] == counts["embedded_chunks"] == counts["chunks"]:
        problems.append(f"vectors/embedded/chunks differ: {counts}")
    expected = oracle_dump(root, scratch)
    if dump != expected:
        missing = sorted(set(expected) - set(dump))[:5]
        extra = sorted(set(dump) - set(expected))[:5]
        problems.append(
            f"dump != fresh rebuild ({len(dump)} vs {len(expected)} rows); "
            f"missing {missing}; extra {extra}"
        )
    return problems


def check_recall_store(root: Path, home: Path) -> list[str]:
    """The recall store of the workspace at ``root``, kept in the state of MEMD_HOME ``home``."""
    problems: list[str] = []
    config = Config.load(env={"MEMD_HOME": str(home)})
    folder = dreams_folder(config, root.resolve())
    raw = folder / STORE_NAME
    if raw.exists():  # looked at before load(), which would quarantine a bad file
        try:
            json.loads(raw.read_bytes())
        except ValueError as exc:
            problems.append(f"{raw.name} does not parse: {exc}")
    try:
        RecallStore(root, folder=folder).load()
    except Exception as exc:
        problems.append(f"RecallStore.load() raised {exc!r}")
    return problems


def check_human_lines(root: Path) -> list[str]:
    text = (root / "MEMORY.md").read_text(encoding="utf-8")
    lines = set(text.splitlines())
    lost = [line for line in HUMAN_MEMORY.splitlines() if line and line not in lines]
    return [f"MEMORY.md lost human lines: {lost}"] if lost else []
