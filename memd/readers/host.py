"""A reader process: runs the daemon's searches over read connections of its own.

Started by memd/readers/__init__.py as ``python -m memd.readers.host``. Frames as memd/frames.py
says; its own fd 1 is pointed at stderr first, so nothing printed can corrupt the protocol.
Requests:

- ``{"op": "open", "index": {"path", "token", "use_vec"}}``: open the index and load its
  vector sketch, so that the first search does not pay for it;
- ``{"op": "search", "index": ..., "query": ..., "options": {...}, "embedder": key | None,
  "keywords": bool}``: run ``memd.search.search``. It may ask for the query's vector,
  ``{"embed": query}``, and the daemon answers ``{"vector": float32 bytes}`` or
  ``{"embed_error": message}``. With ``keywords`` (the daemon's keyword postings are built),
  keyword ranking is asked of the daemon too: ``{"freqs": [term, ...]}`` is answered
  ``{"freqs": [{term: count}, chunks] | None}`` and ``{"rank": match, "k": k}``
  ``{"ranked": [[id, rank], ...] | None}`` (None: FTS5 ranks here). The postings are
  built once, in the daemon, not in every reader (78 MB at 100,000 chunks).

Replies: ``{"ok": outcome | None, "token": ..., "seq": ...}`` (``seq``: the last vector-log
row the index's sketch applied, None without one) or ``{"error": [code, message]}``. It
exits when stdin closes (the daemon stopped it, or died).
"""

from __future__ import annotations

import sys
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import apsw
import numpy as np

from memd import frames
from memd.blas import limit_blas_threads
from memd.embed.base import Embedder, Kind, Vectors
from memd.heap import configure_allocator
from memd.index.bm25 import Ranked
from memd.index.index import Index
from memd.search import search
from memd.search.options import SearchOptions
from memd_client.errors import MemdError, ProviderUnavailable


class _Pipe:
    """The daemon's side of the conversation during a search. Answers come in the order asked,
    but a query's vector is read when the search needs it, after later questions may have
    been asked: an answer read early is kept for its asker."""

    def __init__(self, inp: IO[bytes], out: IO[bytes]) -> None:
        self._inp, self._out = inp, out
        self._kept: dict[str, dict[str, Any]] = {}

    def ask(self, request: dict[str, Any]) -> None:
        frames.write(self._out, request)

    def answer(self, *keys: str) -> dict[str, Any]:
        """The first answer holding one of ``keys``."""
        for key in keys:
            if key in self._kept:
                return self._kept.pop(key)
        while True:
            reply = frames.read(self._inp)
            if reply is None:
                sys.exit(0)  # the daemon is gone
            if any(key in reply for key in keys):
                return reply
            for key in ("vector", "embed_error", "freqs", "ranked"):
                if key in reply:
                    self._kept[key] = reply


class _DaemonEmbedder(Embedder):
    """The daemon's embedder as a search here sees it: a query's vector is asked for."""

    provider = model = "daemon"
    dims = max_tokens = 0

    def __init__(self, key: str, pipe: _Pipe) -> None:
        self._key, self._pipe = key, pipe

    @property
    def settings_key(self) -> str:
        return self._key

    def embed_batch(self, texts: Any, *, kind: Kind = "document") -> Vectors:
        raise NotImplementedError("a reader embeds nothing itself")

    def start_query(self, text: str) -> Future[Vectors]:
        self._pipe.ask({"embed": text})
        return _Answer(self._pipe)


class _Answer(Future[Vectors]):
    """The query's vector, read from the daemon when the search needs it."""

    def __init__(self, pipe: _Pipe) -> None:
        super().__init__()
        self._pipe = pipe

    def done(self) -> bool:
        # Searching in the daemon, a search whose vector is late gives its read connection
        # back while it waits; here the connection is this process's own: it just waits.
        return True

    def result(self, timeout: float | None = None) -> Vectors:
        if not super().done():
            reply = self._pipe.answer("vector", "embed_error")
            if "vector" in reply:
                self.set_result(np.frombuffer(reply["vector"], dtype=np.float32))
            else:
                self.set_exception(ProviderUnavailable(str(reply.get("embed_error"))))
        return super().result(0)


class _DaemonKeywords:
    """The daemon's keyword postings as a search here sees them (a KeywordRanker): asked for
    over the pipe; ``ready`` as the daemon said when it sent the search."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self.ready = False

    def doc_freqs(
        self, conn: apsw.Connection, terms: list[str]
    ) -> tuple[dict[str, int], int] | None:
        self._pipe.ask({"freqs": terms})
        counted = self._pipe.answer("freqs")["freqs"]
        if counted is None:
            return None
        freqs, total = counted
        return {str(t): int(n) for t, n in freqs.items()}, int(total)

    def top(self, conn: apsw.Connection, match: str, k: int) -> Ranked | None:
        self._pipe.ask({"rank": match, "k": k})
        ranked = self._pipe.answer("ranked")["ranked"]
        return None if ranked is None else [(int(i), float(r)) for i, r in ranked]


class _Indexes:
    """The indexes this reader has open, one per path, reopened when the daemon swapped one;
    each ranks keywords with the daemon's postings."""

    def __init__(self, keywords: _DaemonKeywords) -> None:
        self._open: dict[str, Index] = {}
        self.keywords = keywords

    def get(self, spec: dict[str, Any]) -> Index:
        path = str(spec["path"])
        index = self._open.get(path)
        if index is not None and index.token != spec["token"]:
            index.close()  # the file it read was replaced (a rebuild, a workspace added again)
            index = None
        if index is None:
            index = Index(Path(path), use_vec=bool(spec["use_vec"]))
            index.token = str(spec["token"])
            index.rank_with(self.keywords)
            self._open[path] = index
        return index


def _serve(request: dict[str, Any], indexes: _Indexes, pipe: _Pipe) -> None:
    index = indexes.get(request["index"])
    outcome = None
    if request["op"] == "open":
        index.tend_sketch()
    else:
        key = request.get("embedder")
        embedder = _DaemonEmbedder(str(key), pipe) if key else None
        indexes.keywords.ready = bool(request.get("keywords"))
        values = dict(request["options"])
        if values.get("sources") is not None:
            values["sources"] = tuple(values["sources"])
        found = search(index, str(request["query"]), SearchOptions(**values), embedder=embedder)
        outcome = {
            "results": [h.to_dict() for h in found.results],
            "mode": found.mode,
            "provider": found.provider,
            "model": found.model,
            "note": found.note,
        }
    sketch = index.loaded_sketch()
    pipe.ask(
        {"ok": outcome, "token": index.token, "seq": sketch.seq if sketch is not None else None}
    )


def main() -> int:
    configure_allocator()
    limit_blas_threads()  # the processes share the cores: numpy's pool would spin on them
    out = frames.begin_child()
    inp = sys.stdin.buffer
    pipe = _Pipe(inp, out)
    indexes = _Indexes(_DaemonKeywords(pipe))
    while True:
        request = frames.read(inp)
        if request is None:
            return 0
        try:
            _serve(request, indexes, pipe)
        except MemdError as exc:
            frames.write(out, frames.error_frame(exc))


if __name__ == "__main__":
    sys.exit(main())
