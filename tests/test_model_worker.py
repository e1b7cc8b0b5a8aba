"""The local model in its worker process: real llama.cpp, real crashes, real hangs.

A native crash in llama.cpp cannot be called up at will on every CPU, so the crash and hang
tests use the worker's test-only fault hook (MEMD_TEST_WORKER_FAULT, memd/embed/host.py): the
worker process really dies by SIGSEGV/SIGILL or really stops answering, with the real model
loaded, and everything the supervisor does after that is real.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from memd.config import EmbeddingConfig
from memd.embed.host import FAULT_ENV, IDLE_SHRINK_S
from memd.embed.load_modes import ModeMemory, cpu_signature
from memd.embed.process import ProcessEmbedder
from memd.embed.select import choose_embedder
from memd_client.errors import ProviderUnavailable

from .gguf_fixture import damaged_copy

MODEL = os.environ.get("MEMD_TEST_MODEL", "")
needs_model = pytest.mark.skipif(
    not MODEL or not Path(MODEL).is_file(), reason="set MEMD_TEST_MODEL to a GGUF embedding model"
)
E5 = Path(MODEL).with_name("multilingual-e5-small.Q4_0.gguf") if MODEL else Path("absent")
needs_e5 = pytest.mark.skipif(not E5.is_file(), reason="multilingual-e5-small is not beside it")

pytestmark = needs_model


def cosine(a: np.ndarray, b: list[float]) -> float:
    target = np.asarray(b, dtype=np.float32)
    return float(a @ target / np.linalg.norm(target))


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Set the worker's fault rules (workers started after this inherit them)."""

    def _set(spec: str) -> None:
        monkeypatch.setenv(FAULT_ENV, spec)

    return _set


def embedder(tmp_path: Path, **kwargs: object) -> ProcessEmbedder:
    kwargs.setdefault("memory", ModeMemory(tmp_path / "modes.json"))
    return ProcessEmbedder(MODEL, threads=2, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def default_mode_crashes(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether llama.cpp crashes by itself in its default settings on this CPU (the extra
    buffer types on Intel CPUs that report AMX: SIGILL or SIGSEGV, docs of the load modes):
    the tests that count crashes count that one too. No fault rules are set yet (a module's
    fixtures come before a test's own)."""
    e = embedder(tmp_path_factory.mktemp("native"))
    try:
        e.probe()
        return bool(e.crashes)
    finally:
        e.close()


def test_reference_vectors_come_from_another_process(tmp_path: Path) -> None:
    ref = json.loads(Path(MODEL).with_name("all-MiniLM-L6-v2.reference.json").read_text())
    e = embedder(tmp_path)
    try:
        vectors = e.embed_batch([v["text"] for v in ref["vectors"]])
        worker = e.health()
        assert worker["state"] == "running" and worker["pid"] not in (None, os.getpid())
        assert e.count_tokens("hello world") == 4  # [CLS] hello world [SEP], from the worker
        assert e.count_tokens_many(["hello world", "hello", "hello world"]) == [4, 3, 4]
    finally:
        e.close()
    assert vectors.shape == (5, 384)
    for row, expected in zip(vectors, ref["vectors"]):
        assert cosine(row, expected["embedding"]) >= 0.99, expected["text"]
    assert e.health()["state"] == "stopped"


@needs_e5
def test_multilingual_e5_reference_vectors_with_its_prefixes(tmp_path: Path) -> None:
    ref = json.loads(E5.with_name("multilingual-e5-small.reference.json").read_text())
    e = ProcessEmbedder(E5, threads=2)
    try:
        assert (e.prefixes.query, e.prefixes.document) == ("query: ", "passage: ")
        texts = [v["text"] for v in ref["vectors"]]
        queries = e.embed_batch(texts, kind="query")
        passages = e.embed_batch(texts, kind="document")
    finally:
        e.close()
    for q, p, expected in zip(queries, passages, ref["vectors"]):
        assert cosine(q, expected["query"]) >= 0.99, expected["text"]
        assert cosine(p, expected["passage"]) >= 0.99, expected["text"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@needs_e5
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RSS from /proc")
def test_an_idle_worker_gives_back_what_long_documents_grew(tmp_path: Path) -> None:
    """llama.cpp grows an output buffer of a logits row per token it embeds (1 MB a token with
    e5's 250k vocabulary) and never shrinks it; the worker replaces the context once idle."""
    e = ProcessEmbedder(E5, threads=2, memory=ModeMemory(tmp_path / "modes.json"))
    try:
        e.embed_batch(["where did we go hiking"], kind="query")
        pid = e.health()["pid"]
        time.sleep(IDLE_SHRINK_S + 1.0)  # the query's own few rows given back too
        loaded = _rss_mb(pid)
        # 8 rows reserved at load, not 256 (245 MB with e5): python, numpy, the mapped model
        # and its vocabulary come to about 250 MB
        assert loaded < 400, f"worker holds {loaded:.0f} MB with nothing embedding"
        long_text = " ".join(f"fact {i} about the garden" for i in range(60))  # ~360 tokens
        e.embed_batch([long_text] * 3)
        grown = _rss_mb(pid)
        assert grown > loaded + 200, "the documents did not grow the buffer: nothing shown"
        deadline = time.monotonic() + IDLE_SHRINK_S + 15
        while _rss_mb(pid) > loaded + 60 and time.monotonic() < deadline:
            time.sleep(0.2)
        idle = _rss_mb(pid)
        assert idle <= loaded + 60, f"{grown:.0f} MB grown, {idle:.0f} MB idle"
        # the context's buffer and the model file's pages given back: about 200 MB here
        assert idle < 300, f"{idle:.0f} MB idle"
        assert e.embed_batch(["where did we go hiking"], kind="query").shape == (1, 384)
        assert e.health()["pid"] == pid, "the worker restarted instead of shrinking"
    finally:
        e.close()


def test_crash_at_load_falls_back_to_safe_mode_and_is_remembered(tmp_path: Path, fault) -> None:  # type: ignore[no-untyped-def]
    fault("segv:load:default")
    e = embedder(tmp_path)
    try:
        e.probe()
        status = e.health()
        assert (status["mode"], status["reason"], status["restarts"]) == ("safe", "SIGSEGV", 1)
        assert status["settings"] == "safe mode: extra buffer types off"
    finally:
        e.close()
    saved = json.loads((tmp_path / "modes.json").read_text())
    assert saved[f"{e.settings()['file']}:{cpu_signature()}"]["mode"] == "safe"
    # The next start goes straight to the mode that works: no crash first.
    again = embedder(tmp_path)
    try:
        again.probe()
        assert again.health()["restarts"] == 0 and again.mode.name == "safe"
    finally:
        again.close()
    assert e.settings_key == again.settings_key, "a fallback must not change the index identity"


def test_sigill_on_first_embedding_walks_both_safe_modes(
    tmp_path: Path, fault, default_mode_crashes: bool
) -> None:  # type: ignore[no-untyped-def]
    fault("ill:embed1:default;segv:embed1:safe")
    e = embedder(tmp_path)
    try:
        assert e.embed_batch(["hello"]).shape == (1, 384)
        assert e.mode.name == "safe-1-thread" and e.restarts == 2
        # Where llama.cpp's default settings crash by themselves, that crash (by either
        # signal) can come before the one asked for: the same mode fails either way.
        first = ("SIGILL", "SIGSEGV") if default_mode_crashes else ("SIGILL",)
        assert e.crashes[0] in [f"default settings: {sig}" for sig in first]
        assert e.crashes[1:] == ["safe mode: extra buffer types off: SIGSEGV"]
    finally:
        e.close()


def test_crash_in_every_mode_fails_the_provider_and_the_chain_moves_on(
    tmp_path: Path, fault
) -> None:  # type: ignore[no-untyped-def]
    fault("segv:load")
    e = embedder(tmp_path)
    with pytest.raises(ProviderUnavailable, match="crashed in every load mode"):
        e.probe()
    assert e.health()["state"] == "failed"
    with pytest.raises(ProviderUnavailable, match="crashed in every load mode"):
        e.embed_batch(["again"])  # no fourth start
    assert e.restarts == 3
    e.close()
    choice = choose_embedder(
        EmbeddingConfig(model_path=MODEL, fallback="fake", provider="local"),
        env={},
        state_dir=tmp_path,
        probe=True,
    )
    assert choice.embedder is not None and choice.embedder.provider == "fake"
    assert choice.skipped[0][0] == "local" and "SIGSEGV" in choice.skipped[0][1]


def test_crash_on_a_later_batch_restarts_with_backoff(tmp_path: Path, fault) -> None:  # type: ignore[no-untyped-def]
    fault("segv:embed3")
    e = embedder(tmp_path)
    try:
        e.embed_batch(["one"])
        first_pid, mode = e.health()["pid"], e.mode  # safe already on an AMX CPU
        e.embed_batch(["two"])
        with pytest.raises(ProviderUnavailable, match=r"died \(SIGSEGV\)"):
            e.embed_batch(["three"])
        status = e.health()
        assert status["state"] == "restarting" and status["last_exit"] == "SIGSEGV"
        assert e.mode == mode, "a crash after success is not a settings problem"
        with pytest.raises(ProviderUnavailable, match="restarting in"):
            e.embed_batch(["too soon"])
        time.sleep(1.1)
        assert e.embed_batch(["after the backoff"]).shape == (1, 384)
        assert e.health()["pid"] not in (None, first_pid)
    finally:
        e.close()


def test_a_hanging_worker_is_killed_at_the_deadline(tmp_path: Path, fault) -> None:  # type: ignore[no-untyped-def]
    fault("hang:embed2")
    e = embedder(tmp_path, timeout=1.0, per_text=0.0)
    try:
        e.embed_batch(["fine"])
        pid = e.health()["pid"]
        with pytest.raises(ProviderUnavailable, match="no answer within 1 s"):
            e.embed_batch(["stuck"])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        assert e.health()["last_exit"] == "no answer within 1 s"
    finally:
        e.close()


def test_requests_larger_than_a_pipe_buffer_go_through(tmp_path: Path) -> None:
    """Requests are written without blocking, under the deadline; a big batch still arrives."""
    e = embedder(tmp_path)
    try:
        texts = [f"note {i} " + "word " * 60 for i in range(300)]  # about 92 KB
        vectors = e.embed_batch(texts)
        assert vectors.shape == (300, 384)
        assert np.allclose(vectors[0], e.embed_batch(texts[:1])[0], atol=1e-5)
    finally:
        e.close()


def test_orderly_model_errors_keep_the_worker(tmp_path: Path) -> None:
    e = embedder(tmp_path)
    try:
        e.probe()
        pid, restarts = e.health()["pid"], e.restarts  # 1 on an AMX CPU
        with pytest.raises(ProviderUnavailable, match="exceed"):
            e.embed_batch([" ".join(f"x{i}y" for i in range(3000))])
        assert e.health()["pid"] == pid and e.restarts == restarts
    finally:
        e.close()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper that is not ours counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_worker_dies_with_the_daemon(tmp_path: Path) -> None:
    """A worker whose parent is SIGKILLed does not live on holding the model."""
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from memd.embed.process import ProcessEmbedder\n"
        f"e = ProcessEmbedder({MODEL!r}, threads=1)\n"
        "e.probe()\n"
        "print(e.health()['pid'], flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not alive(worker):
                break
            time.sleep(0.05)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the worker outlived its daemon")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_daemon_survives_a_worker_that_dies_on_every_document_batch(tmp_path: Path, fault) -> None:  # type: ignore[no-untyped-def]
    """The model's worker dies by SIGSEGV on every document batch (queries work): the daemon
    keeps serving, keyword search answers, no file is reported clean without vectors, status
    names the worker, its restarts and the signal; once the crashes stop, vectors fill."""
    import memd_client
    from memd.config import Config

    from .daemon_fixture import running_daemon, wait_for

    fault("segv:document")
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    (ws / "memory" / "2026-11-30.md").write_text("Bob fixed the flaky deploy script.\n")
    config = Config.load(embedding=EmbeddingConfig(provider="local", model_path=MODEL))
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=30) as c:
            c.workspace_add(ws, name="crashy")

            def crashed() -> dict | None:  # type: ignore[type-arg]
                st = c.status("crashy")["workspaces"][0]
                worker = st["provider"]["worker"]
                # the restart is counted as the worker dies; the sync records the error after
                failed = st["provider"]["last_error"] is not None
                return (
                    st if worker["restarts"] >= 1 and st["files_indexed"] == 2 and failed else None
                )

            st = wait_for(crashed, "the worker to crash on a document batch", timeout=60)
            worker = st["provider"]["worker"]
            assert worker["last_exit"] == "SIGSEGV"
            assert st["dirty"] and st["files_pending"] == 2 and st["vectors"] == 0
            assert "SIGSEGV" in (st["provider"]["last_error"] or "")
            found = c.search("crashy", "what is the staging cluster called")
            assert found["results"][0]["path"] == "MEMORY.md"
            assert found["mode"] == "keyword" and found["note"]
            assert daemon.ready.is_set()

            # The crashes stop (a fixed model, a new llama.cpp): a reindex fills the vectors.
            os.environ.pop(FAULT_ENV)
            time.sleep(1.1)  # past the worker's first backoff
            c.reindex("crashy", timeout=60)
            st = wait_for(
                lambda: (
                    (s := c.status("crashy")["workspaces"][0])["vectors"] == s["chunks"]
                    and not s["dirty"]
                    and s
                ),
                "vectors for every chunk",
            )
            assert st["provider"]["worker"]["state"] == "running"
            back = c.search("crashy", "what is the staging cluster called")
            assert back["mode"] == "hybrid" and back["results"][0]["path"] == "MEMORY.md"
            # status counts that query by the threads the new worker gave it
            used = c.status("crashy")["workspaces"][0]["provider"]["worker"]["query_threads"]
            assert sum(used.values()) >= 1 and all(int(k) >= 1 for k in used)


@needs_model
def test_a_query_stops_the_running_document_job_which_is_run_again(tmp_path: Path) -> None:
    """A search's query does not wait for the document job the worker runs: llama.cpp's abort
    callback stops it (SIGUSR1), the query goes first, and the job runs again whole: the
    vectors are those of an undisturbed run and the worker did not die."""
    import threading

    from memd.embed.queued import QueuedEmbedder

    inner = embedder(tmp_path)
    wrapped = QueuedEmbedder(inner)
    # About 350 tokens each, over 1,024 characters: one job per text.
    texts = [
        " ".join(f"word{i} about the orion cluster" for i in range(50)) + f" {n}" for n in range(3)
    ]
    try:
        expected = inner.embed_batch(texts)  # directly: nothing to stop it
        restarts = inner.health()["restarts"]  # (a CPU whose default mode crashes: 1)
        done: dict[str, np.ndarray] = {}
        documents = threading.Thread(target=lambda: done.update(v=wrapped.embed_batch(texts)))
        documents.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = wrapped.worker._running  # the job on the model now
            if running is not None and running.kind == "document":
                break
            time.sleep(0.001)
        time.sleep(0.02)  # inside its decode
        query = wrapped.start_query("where is the orion cluster").result(60)
        documents_still_running = documents.is_alive()
        documents.join(120)
        assert query.shape == (384,)
        assert wrapped.worker.preempted >= 1 and documents_still_running
        np.testing.assert_allclose(done["v"], expected, atol=1e-5)
        assert inner.health()["restarts"] == restarts and inner.health()["state"] == "running"
    finally:
        wrapped.close()


# -- damaged models ----------------------------------------------------------------------------


def test_a_model_with_nan_scales_is_refused_at_load_and_the_chain_moves_on(
    tmp_path: Path, default_mode_crashes: bool
) -> None:
    """A GGUF whose weight scales are NaN loads in llama.cpp and embeds every text to NaN
    (stored, after normalising, as all-zero vectors that match nothing): it is refused at
    load, saying why, and the chain moves on as for a model that does not load."""
    bad = damaged_copy(Path(MODEL), tmp_path / "nan-scales.gguf", math.nan)
    e = ProcessEmbedder(bad, threads=2, memory=ModeMemory(tmp_path / "modes.json"))
    try:
        with pytest.raises(
            ProviderUnavailable, match="nan-scales.gguf gives unusable vectors"
        ) as err:
            e.probe()
        assert "non-finite values (NaN or infinity) in 4 of 4" in str(err.value)
        # a refusal is not a crash (the only restart is the CPU's own, where it has one)
        assert e.health()["state"] == "failed"
        assert e.restarts == int(default_mode_crashes), "a refusal counted as a crash"
    finally:
        e.close()
    choice = choose_embedder(
        EmbeddingConfig(model_path=str(bad), fallback="fake", provider="local"),
        env={},
        state_dir=tmp_path,
        probe=True,
    )
    assert choice.embedder is not None and choice.embedder.provider == "fake"
    assert choice.skipped[0][0] == "local" and "non-finite" in choice.skipped[0][1]


def test_a_model_that_gives_every_text_the_same_vector_is_refused(tmp_path: Path) -> None:
    """Zeroed weight scales leave only the biases and position embeddings: finite vectors that
    no longer depend on the text."""
    flat = damaged_copy(Path(MODEL), tmp_path / "zero-scales.gguf", 0.0)
    e = ProcessEmbedder(flat, threads=2, memory=ModeMemory(tmp_path / "modes.json"))
    try:
        with pytest.raises(ProviderUnavailable, match="different texts get the same vector"):
            e.probe()
    finally:
        e.close()


def test_nan_vectors_in_a_later_batch_keep_the_file_pending_and_say_why(tmp_path: Path) -> None:
    """A model that embeds the probe texts well but one word to NaN (that word's row of the
    token embeddings damaged), through a real daemon and its worker: the file holding the word
    stays pending, never clean, status names the error, and the other file gets its vectors."""
    import memd_client
    from memd.config import Config

    from .daemon_fixture import running_daemon, wait_for

    bad = damaged_copy(Path(MODEL), tmp_path / "zebra.gguf", math.nan, tokens=("zebra",))
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    (ws / "memory" / "2026-11-30.md").write_text("We saw a zebra at the zoo on Sunday.\n")
    config = Config.load(embedding=EmbeddingConfig(provider="local", model_path=str(bad)))
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=30) as c:
            c.workspace_add(ws, name="zoo")

            def failed() -> dict | None:  # type: ignore[type-arg]
                st = c.status("zoo")["workspaces"][0]
                return st if st["file_errors"] and st["vectors"] >= 1 else None

            st = wait_for(failed, "the damaged word's file to fail its embedding", timeout=60)
            assert st["provider"]["active"] == "local", "the model passed its load check"
            assert set(st["file_errors"]) == {"memory/2026-11-30.md"}
            assert "non-finite" in st["file_errors"]["memory/2026-11-30.md"]
            assert "non-finite" in (st["provider"]["last_error"] or "")
            assert st["files_pending"] == 1 and st["dirty"]
            assert st["vectors"] == 1 == st["chunks"] - 1  # MEMORY.md's chunk, nothing else
            found = c.search("zoo", "zebra at the zoo")
            assert found["results"][0]["path"] == "memory/2026-11-30.md"  # keyword rows serve
            assert not found["freshness"]["fresh"] or found["freshness"]["unembedded_files"]
            assert daemon.ready.is_set()


def test_a_daemon_given_a_nan_model_says_so_and_searches_by_keyword(tmp_path: Path) -> None:
    """The daemon that chose the damaged model stored zero vectors and called hybrid fine."""
    import memd_client
    from memd.config import Config

    from .daemon_fixture import running_daemon, wait_for

    bad = damaged_copy(Path(MODEL), tmp_path / "nan-scales.gguf", math.nan)
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe staging cluster is called Orion.\n")
    config = Config.load(embedding=EmbeddingConfig(provider="local", model_path=str(bad)))
    with running_daemon(config, choose_embedder=True) as daemon:
        with memd_client.connect(daemon.socket_path, timeout=30) as c:
            c.workspace_add(ws, name="nan")
            st = wait_for(
                lambda: (s := c.status("nan")["workspaces"][0])["files_indexed"] == 1 and s,
                "the workspace to be indexed",
            )
            provider = st["provider"]
            assert provider["active"] == "none" and st["vectors"] <= 0
            reasons = {p["provider"]: p["reason"] for p in provider["skipped"]}
            assert "nan-scales.gguf gives unusable vectors: non-finite" in reasons["local"]
            found = c.search("nan", "what is the staging cluster called")
            assert found["mode"] == "keyword" and found["results"][0]["path"] == "MEMORY.md"
