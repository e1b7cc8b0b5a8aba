"""The local provider: GGUF metadata, prefixes, and the real MiniLM model when MEMD_TEST_MODEL is set.

The real model runs only in worker processes here (ProcessEmbedder), as in the daemon: a native
crash in llama.cpp fails a test, never the whole suite.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from memd.config import IndexConfig
from memd.embed.gguf import GGUFError, read_metadata
from memd.embed.llama import LlamaEmbedder, Prefixes, prefixes_for
from memd.embed.process import ProcessEmbedder
from memd.index.chunk import chunk_text
from memd.index.index import Index
from memd.index.sync import Syncer
from memd.search import search
from memd.search.options import SearchOptions
from memd_client.errors import ProviderUnavailable

from .conftest import WriteFile
from .gguf_fixture import bert_header

MODEL = os.environ.get("MEMD_TEST_MODEL", "")
needs_model = pytest.mark.skipif(
    not MODEL or not Path(MODEL).is_file(), reason="set MEMD_TEST_MODEL to a GGUF embedding model"
)


def test_metadata_is_read_without_loading(tmp_path: Path) -> None:
    path = bert_header(tmp_path / "tiny.gguf", dims=16, context=128, name="nomic-embed-text-v1.5")
    meta = read_metadata(path)
    assert meta["bert.embedding_length"] == 16
    e = LlamaEmbedder(path)
    assert (e.dims, e.max_tokens, e.model, e.loaded) == (16, 128, "tiny", False)
    assert e.prefixes == Prefixes("search_query: ", "search_document: ")
    overridden = LlamaEmbedder(path, query_prefix="q: ", document_prefix="")
    assert overridden.prefixes == Prefixes("q: ", "")
    assert overridden.settings_key != e.settings_key, "prefixes change the vectors"


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("EmbeddingGemma 300m", "task: search result | query: "),
        ("multilingual-e5-small", "query: "),
        ("bge small en v1.5", "Represent this sentence for searching relevant passages: "),
        ("MiniLM L6 H384 Uncased", ""),
    ],
)
def test_prefix_table(name: str, query: str) -> None:
    assert prefixes_for({"general.name": name}).query == query


@pytest.mark.parametrize(
    "content", [b"", b"GGML", b"GGUF\x01\x00\x00\x00", b"GGUF\x03\x00\x00\x00"]
)
def test_broken_files_are_provider_errors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ProviderUnavailable, match="local model"):
        LlamaEmbedder(path)
    with pytest.raises(GGUFError):
        read_metadata(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProviderUnavailable, match="cannot read"):
        LlamaEmbedder(tmp_path / "absent.gguf")


def test_a_query_takes_every_core_and_documents_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = bert_header(tmp_path / "tiny.gguf", dims=16, context=128, name="all-MiniLM-L6-v2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    automatic = LlamaEmbedder(path)
    assert (automatic.threads, automatic.query_threads) == (4, 8)
    by_hand = LlamaEmbedder(path, threads=2)  # a limit the user set holds for queries too
    assert (by_hand.threads, by_hand.query_threads) == (2, 2)
    assert LlamaEmbedder(path, threads=2, query_threads=6).query_threads == 6
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert (LlamaEmbedder(path).threads, LlamaEmbedder(path).query_threads) == (1, 1)


@needs_model
def test_queries_and_documents_in_turn_on_their_own_thread_counts_agree() -> None:
    """The worker switches llama.cpp's context between one thread (documents) and two (a
    query) and back: the same text (MiniLM has no prefixes) gets the same vector either way."""
    e = ProcessEmbedder(MODEL, threads=1, query_threads=2)
    texts = ["the orion cluster at dawn", "Caroline went camping in July"]
    try:
        first = e.embed_batch(texts)
        for _ in range(2):
            as_queries = np.stack([e.embed_batch([t], kind="query")[0] for t in texts])
            np.testing.assert_allclose(as_queries, e.embed_batch(texts), atol=1e-4)
        np.testing.assert_allclose(e.embed_batch(texts), first, atol=1e-5)
    finally:
        e.close()


@pytest.fixture(scope="module")
def minilm() -> ProcessEmbedder:
    e = ProcessEmbedder(MODEL, threads=2)
    yield e  # type: ignore[misc]
    e.close()


@needs_model
def test_reference_vectors(minilm: ProcessEmbedder) -> None:
    ref = json.loads(Path(MODEL).with_name("all-MiniLM-L6-v2.reference.json").read_text())
    texts = [v["text"] for v in ref["vectors"]]
    vectors = minilm.embed_batch(texts)
    assert vectors.shape == (len(texts), ref["dims"]) and minilm.dims == 384
    for row, expected in zip(vectors, ref["vectors"]):
        target = np.asarray(expected["embedding"], dtype=np.float32)
        cosine = float(row @ target / np.linalg.norm(target))
        assert cosine >= 0.99, (expected["text"], cosine)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@needs_model
def test_tokens_are_counted_exactly_and_long_text_is_split_not_cut(minilm: ProcessEmbedder) -> None:
    assert minilm.max_tokens == 512
    assert minilm.count_tokens("hello world") == 4  # [CLS] hello world [SEP]
    long_line = " ".join(f"x{i}y" for i in range(3000))  # far over 512 tokens, one line
    with pytest.raises(ProviderUnavailable, match="exceed"):
        minilm.embed_batch([long_line])
    chunks = chunk_text(
        long_line, 400, 80, count_tokens=minilm.count_tokens, max_tokens=minilm.max_tokens
    )
    assert len(chunks) > 1
    assert all(minilm.count_tokens(c.text) <= 512 for c in chunks)
    assert "".join(c.text for c in chunks) == long_line
    assert minilm.embed_batch([c.text for c in chunks]).shape == (len(chunks), 384)


@needs_model
def test_real_model_index_and_semantic_search(
    minilm: ProcessEmbedder, index: Index, workspace: Path, write: WriteFile
) -> None:
    write("memory/2026-05-01.md", "Alice adopted a golden retriever puppy named Biscuit.\n")
    write("memory/2026-05-02.md", "The quarterly tax filing is due at the end of the month.\n")
    write("MEMORY.md", "Bob is allergic to peanuts.\n")
    report = Syncer(index, workspace, config=IndexConfig(), embedder=minilm).sync()
    assert report.errors == [] and report.embedded == 3
    assert index.writer().integrity() == []
    outcome = search(
        index,
        "Which pet does Alice have?",
        SearchOptions(mode="vector", min_score=0.0),
        embedder=minilm,
    )
    assert outcome.mode == "vector"
    assert outcome.results[0].path == "memory/2026-05-01.md"
