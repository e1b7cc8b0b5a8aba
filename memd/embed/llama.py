"""LlamaEmbedder: a local GGUF embedding model through llama-cpp-python.

The model's dims, context and name come from the GGUF header, so the index identity is known
without loading anything; the model itself loads on first use and stays loaded. llama.cpp is not
re-entrant: every call into the model holds one lock.

The daemon never runs this class itself: it lives in a worker process (memd/embed/host.py,
supervised by memd/embed/process.py), because a native crash in llama.cpp must cost the vectors,
not the daemon. ``extra_bufts=False`` turns off llama.cpp's extra CPU buffer types (AMX and
repacked weights), whose kernels die with SIGILL or SIGSEGV on some Xeon CPUs.

Memory. llama.cpp sizes a context's output buffer for logits even in embedding mode, where every
token of a decode is an output: ``n_vocab`` × 4 bytes per token (``llama_context::output_reserve``
in llama.cpp; 1 MB a token for multilingual-e5's 250k vocabulary, 0.12 MB for MiniLM's 30k), never
shrunk. ``Llama()`` reserves it for ``n_seq_max`` outputs at load, and sets ``n_seq_max`` to 256
for embeddings: 245 MiB with e5 before the first text. Two things keep it small: at most
``MAX_SEQUENCES`` texts go into one decode (the load reserves 8 rows), and ``shrink()`` gives a
grown buffer back by replacing the context (milliseconds; the model stays loaded), which the
worker calls once it has been idle a moment. ``shrink()`` also drops the model file's pages
from the process (Linux): the load reads them all, but a decode touches only the rows of the
tokens it embeds (most of e5's file is its 250k-row token table), and what it touches comes
back from the page cache. While documents embed, the buffer still grows to
the tokens of the largest decode (up to ``max_tokens``): llama-cpp-python has no parameter that
turns the logits part off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memd.dist import install_hint
from memd.embed.base import BadVectors, Embedder, Kind, Vectors, check_vectors, normalize
from memd.embed.gguf import GGUFError, read_metadata
from memd.embed.llama_setup import drop_mapped_pages, model_params, usable_cores
from memd_client.errors import ProviderUnavailable

__all__ = ["LlamaEmbedder", "Prefixes", "prefixes_for"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prefixes:
    query: str = ""
    document: str = ""


# Instructions some embedding models were trained with, matched against the GGUF
# general.name / general.basename / architecture (lower-cased, first match wins).
_PREFIX_TABLE: tuple[tuple[str, Prefixes], ...] = (
    ("embeddinggemma", Prefixes("task: search result | query: ", "title: none | text: ")),
    ("gemma-embedding", Prefixes("task: search result | query: ", "title: none | text: ")),
    ("nomic", Prefixes("search_query: ", "search_document: ")),
    (
        "qwen3-embedding",
        Prefixes(
            "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
            "Query: ",
            "",
        ),
    ),
    ("e5", Prefixes("query: ", "passage: ")),
    ("bge", Prefixes("Represent this sentence for searching relevant passages: ", "")),
    ("mxbai-embed", Prefixes("Represent this sentence for searching relevant passages: ", "")),
    ("arctic-embed", Prefixes("Represent this sentence for searching relevant passages: ", "")),
)


# Embedded once at load: a damaged file (NaN or zeroed scales) loads without complaint and
# gives NaN or the same vector for every text. Pairs of the same length in tokens catch a model
# whose output depends only on length (zeroed weights leave the position embeddings).
PROBE_TEXTS = (
    "The staging cluster was renamed to vega.",
    "Alice prefers green tea in the morning.",
    "Fix the flaky deploy script before Friday.",
    "Quarterly revenue grew by twelve percent.",
)
# Cosine above which two different probe texts count as the same vector.
SAME_VECTOR_COSINE = 0.9999

MAX_SEQUENCES = 8
"""Texts in one decode. Each costs llama.cpp an output row of ``n_vocab`` floats at load (see
the module's docstring), and texts packed into one decode attend over each other's cells of the
shared cache, so 8 small decodes were no slower than one large one (docs/benchmarks.md)."""


def prefixes_for(meta: dict[str, object]) -> Prefixes:
    """The query/document prefixes of a model, from its GGUF metadata (none when unknown)."""
    names = " ".join(
        str(meta.get(k, "")) for k in ("general.name", "general.basename", "general.architecture")
    ).lower()
    for needle, prefixes in _PREFIX_TABLE:
        if needle in names:
            return prefixes
    return Prefixes()


class LlamaEmbedder(Embedder):
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
        extra_bufts: bool = True,
    ) -> None:
        self.path = Path(model_path).expanduser()
        self.extra_bufts = extra_bufts
        try:
            meta = read_metadata(self.path)
        except GGUFError as exc:
            raise ProviderUnavailable(f"local model: {exc}") from None
        arch = str(meta.get("general.architecture", ""))
        dims = meta.get(f"{arch}.embedding_length")
        if not isinstance(dims, int) or dims <= 0:
            raise ProviderUnavailable(f"local model {self.path.name}: no embedding length in GGUF")
        context = meta.get(f"{arch}.context_length")
        self.meta = meta
        self.model = self.path.stem
        self.dims = dims
        self.max_tokens = int(context) if isinstance(context, int) and context > 0 else 512
        self.batch_size = batch_size
        # Documents take half the cores (searches and the daemon keep the rest); a query, which
        # a search waits for, takes every core, unless the threads were set by hand.
        cores = usable_cores()
        self.threads = threads or max(1, cores // 2)
        self.query_threads = query_threads or (cores if not threads else self.threads)
        self._threads_now = self.threads  # what the context decodes with
        table = prefixes_for(meta)
        self.prefixes = Prefixes(
            table.query if query_prefix is None else query_prefix,
            table.document if document_prefix is None else document_prefix,
        )
        self.fingerprint = _fingerprint(self.path)
        self._llm: Any = None
        self._abort: Any = None  # the ctypes callback, kept alive while llama.cpp holds it
        self._pool_none = False
        self._lock = threading.Lock()

    def settings(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "model": self.model,
            "file": self.fingerprint,
            "dims": self.dims,
            "query_prefix": self.prefixes.query,
            "document_prefix": self.prefixes.document,
        }

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    def load(self) -> Any:
        """Load the model now rather than on first use; return the ``llama_cpp.Llama``."""
        with self._lock:
            return self._load()

    def _load(self) -> Any:
        if self._llm is not None:
            return self._llm
        try:
            import llama_cpp
            from llama_cpp import LLAMA_POOLING_TYPE_NONE, Llama
        except ImportError:
            raise ProviderUnavailable(
                f"local provider needs llama-cpp-python: {install_hint('local')}"
            ) from None
        try:
            with model_params(llama_cpp, extra_bufts=self.extra_bufts, sequences=MAX_SEQUENCES):
                llm = Llama(
                    model_path=str(self.path),
                    embedding=True,
                    verbose=False,
                    n_ctx=self.max_tokens,
                    n_batch=self.max_tokens,
                    n_ubatch=self.max_tokens,
                    n_threads=self.threads,
                    n_threads_batch=self.threads,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ProviderUnavailable(
                f"local model {self.path.name} failed to load: {exc}"
            ) from None
        if llm.n_embd() != self.dims:
            raise ProviderUnavailable(
                f"local model {self.path.name}: llama.cpp reports {llm.n_embd()} dims, "
                f"the GGUF header {self.dims}"
            )
        pooling: Any = llm.pooling_type()
        self._pool_none = int(pooling) == int(LLAMA_POOLING_TYPE_NONE)
        try:
            self._validate(llm)
        except BaseException:
            llm.close()
            raise
        logger.info(
            "loaded %s (%d dims, %d tokens, %d threads, %d for a query%s)",
            self.path.name,
            self.dims,
            self.max_tokens,
            self.threads,
            self.query_threads,
            "" if self.extra_bufts else ", extra buffer types off",
        )
        self._llm = llm
        return llm

    def _validate(self, llm: Any) -> None:
        """Refuse a model whose vectors no search can use: embed PROBE_TEXTS and require
        finite, non-zero rows of the declared dims that differ between different texts."""
        prefix = self.prefixes.document
        try:
            raw = self._pooled(llm.embed([prefix + t for t in PROBE_TEXTS], normalize=False))
            check_vectors(raw, len(PROBE_TEXTS), self.dims)
        except (ValueError, RuntimeError) as exc:  # BadVectors is a ValueError
            raise ProviderUnavailable(
                f"local model {self.path.name} gives unusable vectors: {exc}"
            ) from None
        unit = normalize(raw)
        cosines = unit @ unit.T
        np.fill_diagonal(cosines, -1.0)
        if float(cosines.max()) > SAME_VECTOR_COSINE:
            raise ProviderUnavailable(
                f"local model {self.path.name} gives unusable vectors: different texts get "
                "the same vector"
            )

    def _pooled(self, out: Any) -> Vectors:
        """llama.cpp's output as one row per text: per-token vectors (no pooling) mean-pooled."""
        if self._pool_none:
            out = [np.mean(np.asarray(tokens, dtype=np.float32), axis=0) for tokens in out]
        return np.asarray(out, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        """Exact token count of ``text`` as a document, special tokens and prefix included."""
        with self._lock:
            llm = self._load()
            data = (self.prefixes.document + text).encode("utf-8", "surrogatepass")
            return len(llm.tokenize(data, add_bos=True, special=False))

    def embed_batch(
        self, texts: Sequence[str], *, kind: Kind = "document", threads: int = 0
    ) -> Vectors:
        """``threads``: llama.cpp threads for this call (0: ``query_threads`` for a query,
        ``threads`` for documents)."""
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        prefix = self.prefixes.query if kind == "query" else self.prefixes.document
        inputs = [prefix + t for t in texts]
        with self._lock:
            llm = self._load()
            if not threads:
                threads = self.query_threads if kind == "query" else self.threads
            self._use_threads(llm, threads)
            try:
                out = llm.embed(inputs, normalize=False, truncate=False)
            except ValueError as exc:
                # truncate=False: an input longer than the context raises instead of being cut.
                raise ProviderUnavailable(f"local model: {exc}") from None
        raw = self._pooled(out)
        try:
            # Before normalising, which would turn NaN into an all-zero row.
            check_vectors(raw, len(inputs), self.dims)
        except BadVectors as exc:
            raise ProviderUnavailable(f"local model {self.path.name}: {exc}") from None
        return normalize(raw)

    def _use_threads(self, llm: Any, threads: int) -> None:
        if threads != self._threads_now:
            import llama_cpp

            llama_cpp.llama_set_n_threads(llm._ctx.ctx, threads, threads)
            self._threads_now = threads

    def allow_abort(self, callback: Callable[[], bool]) -> None:
        """Have llama.cpp ask ``callback`` between the steps of a decode; True stops the decode
        (the embedding then raises). The worker process uses it to let a query go first."""
        import llama_cpp

        with self._lock:
            llm = self._load()
            self._abort = llama_cpp.ggml_abort_callback(lambda _data: bool(callback()))
            llama_cpp.llama_set_abort_callback(llm._ctx.ctx, self._abort, None)

    def shrink(self) -> None:
        """Give back the output buffer the last decodes grew (see the module's docstring): the
        context is replaced by a fresh one with the same parameters; the model stays loaded."""
        import llama_cpp
        from llama_cpp import _internals

        with self._lock:
            llm = self._llm
            if llm is None:
                return
            fresh = _internals.LlamaContext(
                model=llm._model, params=llm.context_params, verbose=False
            )
            old, llm._ctx = llm._ctx, fresh
            self._threads_now = self.threads  # the fresh context's, from context_params
            old.close()  # idempotent: the Llama's own exit stack closes it again at the end
            if self._abort is not None:
                llama_cpp.llama_set_abort_callback(fresh.ctx, self._abort, None)
            drop_mapped_pages(self.path)

    def close(self) -> None:
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None

    def describe(self) -> str:
        return f"local:{self.path.name} ({self.dims} dims)"


def _fingerprint(path: Path) -> str:
    """Identify the model file by its size and the hash of its first and last MiB."""
    st = path.stat()
    h = hashlib.sha256(str(st.st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if st.st_size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
    return h.hexdigest()[:16]
