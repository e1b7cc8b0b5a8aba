"""A reader process: runs the daemon's searches over read connections of its own.

Started by memd/readers/__init__.py as ``python -m memd.readers.host``. Frames as memd/frames.py
says; its own fd 1 is pointed at stderr first, so nothing printed can corrupt the protocol.
Requests:

- ``{"op": "open", "index": {"path", "token", "use_vec"}}``: open the index and load its
  vector sketch, so that the first search does not pay for it;
- ``{"op": "search", "index": ..., "query": ..., "options": {...}, "embedder": key | None}``:
  run ``memd.search.search``. It may ask for the query's vector, ``{"embed": query}``, and the
  daemon answers ``{"vector": float32 bytes}`` or ``{"embed_error": message}``.

Replies: ``{"ok": outcome | None, "token": ..., "seq": ...}`` (``seq``: the last vector-log
row the index's sketch applied, None without one) or ``{"error": [code, message]}``. It
exits when stdin closes (the daemon stopped it, or died).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import numpy as np

from memd import frames
from memd.blas import limit_blas_threads
from memd.embed.base import Embedder, Kind, Vectors
from memd.heap import configure_allocator
from memd.index.index import Index
from memd.search import search
from memd.search.options import SearchOptions
from memd_client.errors import MemdError, ProviderUnavailable


class _DaemonEmbedder(Embedder):
    """The daemon's embedder as a search here sees it: a query's vector is asked for."""

    provider = model = "daemon"
    dims = max_tokens = 0

    def __init__(self, key: str, inp: IO[bytes], out: IO[bytes]) -> None:
        self._key, self._inp, self._out = key, inp, out

    @property
    def settings_key(self) -> str:
        return self._key

    def embed_batch(self, texts: Any, *, kind: Kind = "document") -> Vectors:
        raise NotImplementedError("a reader embeds nothing itself")

    def start_query(self, text: str) -> Future[Vectors]:
        frames.write(self._out, {"embed": text})
        return _Answer(self._inp)


class _Answer(Future[Vectors]):
    """The query's vector, read from the daemon when the search needs it."""

    def __init__(self, inp: IO[bytes]) -> None:
        super().__init__()
        self._inp = inp

    def done(self) -> bool:
        # Searching in the daemon, a search whose vector is late gives its read connection
        # back while it waits; here the connection is this process's own: it just waits.
        return True

    def result(self, timeout: float | None = None) -> Vectors:
        if not super().done():
            reply = frames.read(self._inp)
            if reply is None:
                sys.exit(0)  # the daemon is gone
            if "vector" in reply:
                self.set_result(np.frombuffer(reply["vector"], dtype=np.float32))
            else:
                self.set_exception(ProviderUnavailable(str(reply.get("embed_error"))))
        return super().result(0)


class _Indexes:
    """The indexes this reader has open, one per path, reopened when the daemon swapped one."""

    def __init__(self) -> None:
        self._open: dict[str, Index] = {}

    def get(self, spec: dict[str, Any]) -> Index:
        path = str(spec["path"])
        index = self._open.get(path)
        if index is not None and index.token != spec["token"]:
            index.close()  # the file it read was replaced (a rebuild, a workspace added again)
            index = None
        if index is None:
            index = Index(Path(path), use_vec=bool(spec["use_vec"]))
            index.token = str(spec["token"])
            self._open[path] = index
        return index


def _serve(request: dict[str, Any], indexes: _Indexes, inp: IO[bytes], out: IO[bytes]) -> None:
    index = indexes.get(request["index"])
    outcome = None
    if request["op"] == "open":
        index.tend_sketch()
    else:
        key = request.get("embedder")
        embedder = _DaemonEmbedder(str(key), inp, out) if key else None
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
    frames.write(
        out,
        {"ok": outcome, "token": index.token, "seq": sketch.seq if sketch is not None else None},
    )


def main() -> int:
    configure_allocator()
    limit_blas_threads()  # the processes share the cores: numpy's pool would spin on them
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    indexes = _Indexes()
    while True:
        request = frames.read(inp)
        if request is None:
            return 0
        try:
            _serve(request, indexes, inp, out)
        except MemdError as exc:
            frames.write(out, frames.error_frame(exc))


if __name__ == "__main__":
    sys.exit(main())
