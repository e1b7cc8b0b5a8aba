"""Hybrid search: FTS5 keyword and vector candidates merged, decayed, diversified.

``search`` runs the pipeline in the order it runs, each step measured against the others in
docs/benchmarks.md; its steps are the package's modules:

- options.py: SearchOptions, one search's knobs;
- keyword.py: the MATCH expression, BM25 scores and the keyword boost;
- fusion.py: the vector half, merged with the keyword half;
- when.py: the days and months a query names, for the daily logs of those days;
- finish.py: dates, decay, MMR and the thresholds that end each mode's list;
- hits.py: Hit and SearchOutcome, what a search gives back.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from concurrent.futures import Future

from memd.embed.base import Embedder, Vectors
from memd.index.index import Index
from memd.index.reads import ChunkRow
from memd.index.store import Store
from memd.search.finish import _finish, _keyword_only
from memd.search.fusion import KeywordHalf, _merge, keyword_half
from memd.search.hits import Hit, SearchOutcome
from memd.search.keyword import keyword_match
from memd.search.options import Mode, SearchOptions
from memd.search.when import Named, named_dates

__all__ = ["search"]


def search(
    index: Index,
    query: str,
    options: SearchOptions,
    *,
    embedder: Embedder | None,
    now: float | None = None,
    started: Future[Vectors] | None = None,
) -> SearchOutcome:
    """Run one search over ``index``; the query vector comes from ``embedder`` when it fits
    (``started``: its embedding of the query, begun by the caller)."""
    query = query.strip()
    with index.reader() as store:
        identity = Index.stored_identity(store.conn)
        provider = identity.provider if identity else "none"
        model = identity.model if identity else "fts-only"
        if not query:
            return SearchOutcome([], options.mode, provider, model)
        note = None
        vector_ok = (
            embedder is not None
            and identity is not None
            and identity.semantic
            and store.vector_store != "none"
            and embedder.settings_key == identity.settings_key
        )
        mode: Mode = options.mode
        if mode != "keyword" and not vector_ok:
            note = _why_no_vectors(embedder, identity, store)
            mode = "keyword"
        # The query is embedded (on the embedder's own thread, where it has one) while the
        # keyword half runs here.
        qvec_future = (
            (started or embedder.start_query(query)) if mode != "keyword" and embedder else None
        )
        names = named_dates(query, _today(options, now))
        match, boost_terms = keyword_match(query, store.reads.doc_freqs)
        keyword_rows: list[ChunkRow] = []
        if mode != "vector" and match:
            keyword_rows = store.reads.keyword_candidates(
                match, options.sources, options.candidates
            )
            if len(keyword_rows) < options.candidates:
                # Too few rows hold the rarer terms: the common ones decide the rest, so a
                # chunk holding only them is still found (dropping them is for speed only).
                every, _ = keyword_match(query)
                if every is not None and every != match:
                    keyword_rows = store.reads.keyword_candidates(
                        every, options.sources, options.candidates
                    )
        # What the keyword half can finish without the vector is done while the query embeds,
        # unless the query has every core: work beside it then only slows it down (llama.cpp's
        # threads wait for each other, docs/benchmarks.md), and it waits for the vector.
        half = None
        if mode == "hybrid" and not (embedder and embedder.query_takes_every_core()):
            half = keyword_half(store, keyword_rows, boost_terms, options)
        waiting = qvec_future is not None and not qvec_future.done()
        if qvec_future is None:
            hits = _keyword_only(store, keyword_rows, boost_terms, options, now, names)
        elif not waiting:
            qvec = qvec_future.result()
            hits = _vector_half(
                store, qvec, half, keyword_rows, boost_terms, options, mode, now, names
            )
    if waiting:
        assert qvec_future is not None
        # The vector is not here yet (the model is busy with a query, or a document job):
        # wait without holding one of the readers that every other search, get and the
        # writer need. The vector half reads a newer snapshot; it looks chunks up by id, and
        # one removed meanwhile only loses its vector.
        qvec = qvec_future.result()
        with index.reader() as store:
            hits = _vector_half(
                store, qvec, half, keyword_rows, boost_terms, options, mode, now, names
            )
    for hit in hits:
        hit.window(boost_terms, options.snippet_chars)
    return SearchOutcome(hits, mode, provider, model, note)


def _vector_half(
    store: Store,
    qvec: Vectors,
    half: KeywordHalf | None,
    keyword_rows: list[ChunkRow],
    terms: Sequence[str],
    options: SearchOptions,
    mode: Mode,
    now: float | None,
    names: tuple[Named, ...],
) -> list[Hit]:
    """Hybrid or vector hits: the vector candidates, merged with the keyword half (worked out
    here when the search left it until the vector came)."""
    if mode == "hybrid" and half is None:
        half = keyword_half(store, keyword_rows, terms, options)
    vector_rows = store.reads.vector_candidates(qvec, options.sources, options.candidates)
    hits = _merge(store, qvec, vector_rows, half, options)
    return _finish(store, hits, options, now, names)


def _today(options: SearchOptions, now: float | None) -> datetime.date:
    if options.today:
        return datetime.date.fromisoformat(options.today)
    return datetime.date.fromtimestamp(time.time() if now is None else now)


def _why_no_vectors(embedder: Embedder | None, identity: object, store: Store) -> str | None:
    if embedder is None:
        return None  # keyword-only by configuration: status says so, not every search
    if identity is None or not getattr(identity, "semantic", False):
        return "the index holds no vectors yet: keyword search only"
    if store.vector_store == "none":
        return "the vector store cannot be read (sqlite-vec unavailable): keyword search only"
    return (
        "the index was built with another embedding model and is being rebuilt: keyword search only"
    )
