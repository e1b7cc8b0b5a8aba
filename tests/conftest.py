"""Shared fixtures: a private MEMD_HOME per test, workspace builders, and leak checks."""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memd.config import Config
from memd.embed.fake import FakeEmbedder
from memd.index.cache import EmbeddingCache
from memd.index.index import Index
from memd.index.sync import Syncer


def pytest_report_header() -> list[str]:
    """Where the run ran: floats from BLAS and llama.cpp's kernels differ between CPUs (AVX2,
    AVX-512, AMX), so a red run names its CPU, SIMD flags and numpy's BLAS."""
    import platform

    import numpy
    import threadpoolctl

    model, flags = platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        model = info.get("model name\t", model).strip()
        simd = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni")
        flags = " ".join(
            sorted(
                f
                for f in info.get("flags\t\t", "").split()
                if f in simd or f[:6] in ("avx512", "amx")
            )
        )
    except OSError:
        pass
    lines = [f"cpu: {model}, {os.cpu_count()} cores; simd: {flags or 'unknown'}"]
    lines.append(f"numpy {numpy.__version__}")
    for lib in threadpoolctl.threadpool_info():
        lines.append(
            f"blas: {lib.get('internal_api')} {lib.get('version')}, kernel "
            f"{lib.get('architecture')}, {lib.get('num_threads')} threads"
        )
    if os.environ.get("OPENBLAS_CORETYPE"):
        lines.append(f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}")
    return lines


@pytest.fixture(autouse=True)
def memd_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MEMD_HOME, so no test touches a real user's state."""
    home = tmp_path / "home"
    monkeypatch.setenv("MEMD_HOME", str(home))
    # A client that finds no memd starts one (memd_client.autostart): not in tests, which start
    # the daemons they need (tests/test_autostart.py turns it back on).
    monkeypatch.setenv("MEMD_AUTOSTART", "0")
    for var in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "MEMD_CONFIG", "MEMD_LOCAL_MODEL"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    """Fail a test that leaves threads running."""
    before = set(threading.enumerate())
    yield
    gc.collect()
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads leaked: {leaked}"


@pytest.fixture
def config() -> Config:
    return Config.load()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    return root


WriteFile = Callable[[str, str], Path]


@pytest.fixture
def write(workspace: Path) -> WriteFile:
    """Write a workspace-relative file (creating folders) and return its path."""

    def _write(rel: str, text: str) -> Path:
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return _write


@pytest.fixture
def cache(config: Config) -> Iterator[EmbeddingCache]:
    c = EmbeddingCache(config.cache_path)
    yield c
    c.close()


@pytest.fixture
def index(config: Config, workspace: Path) -> Iterator[Index]:
    idx = Index(config.index_dir / "ws.sqlite", use_vec=config.index.sqlite_vec)
    idx.open()
    yield idx
    idx.close()


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def syncer(
    index: Index, workspace: Path, config: Config, fake: FakeEmbedder, cache: EmbeddingCache
) -> Syncer:
    return Syncer(index, workspace, config=config.index, embedder=fake, cache=cache)


@pytest.fixture
def memd_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """WARNING and above from the ``memd`` logger, even if something set propagate=False."""
    caplog.set_level(logging.WARNING, logger="memd")
    logger = logging.getLogger("memd")
    attached = not logger.propagate
    if attached:
        logger.addHandler(caplog.handler)
    yield caplog
    if attached:
        logger.removeHandler(caplog.handler)
