"""A large index's keyword postings built in a process of its own.

``python -m memd.index.postings_process PATH`` builds the postings of that index file
(memd/index/postings.py) at a lower CPU priority and sends them back over its stdout as frames
(memd/frames.py): their header, each array in parts, the end. memd/index/keywords.py starts it
for an index too large to build on the writer's thread. Its seconds of counting then hold no
lock and no GIL of the daemon's (searches that began in the daemon while a thread of its own
was building were measured 1.5 to 3 times slower), its work arrays go with the process (the
daemon keeps no high-water mark from them), and the searches keep the cores.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import numpy as np

from memd import frames
from memd.blas import limit_blas_threads
from memd.heap import configure_allocator
from memd.index.db import connect
from memd.index.postings import Mismatch, Postings

__all__ = ["build_elsewhere", "receive", "send"]

PART = 32 << 20  # bytes of an array per frame


def build_elsewhere(path: Path, stop: threading.Event) -> Postings:
    """Build the postings of ``path`` in a child process; Stopped-like EOFError if ``stop`` is
    set meanwhile (the child is killed), Mismatch if it refused the build."""
    proc = frames.start_child("memd.index.postings_process", str(path), stdin=subprocess.DEVNULL)
    watcher = threading.Thread(
        target=_kill_on_stop, args=(proc, stop), name="memd-postings-stop", daemon=True
    )
    watcher.start()
    try:
        assert proc.stdout is not None
        return receive(proc.stdout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        watcher.join()


def _kill_on_stop(proc: subprocess.Popen[bytes], stop: threading.Event) -> None:
    while proc.poll() is None:
        if stop.wait(0.1):
            proc.kill()
            return


def send(state: Postings, out: IO[bytes]) -> None:
    """Write a build to ``out``: its header, then each array in parts, then the end."""
    arrays = state.arrays()
    frames.write(
        out,
        {
            "seq": state.seq,
            "vocab": list(state.vocab),
            "arrays": {name: [a.dtype.str, len(a)] for name, a in arrays.items()},
        },
    )
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).view(np.uint8)
        for at in range(0, len(data), PART):
            frames.write(out, {"name": name, "part": data[at : at + PART].tobytes()})
    frames.write(out, {"done": True})


def receive(inp: IO[bytes]) -> Postings:
    """Read a build :func:`send` wrote; Mismatch when the process refused it."""
    head = _next(inp)
    if "mismatch" in head:
        raise Mismatch(str(head["mismatch"]))
    arrays = {
        name: np.empty(int(length), dtype=np.dtype(dtype))
        for name, (dtype, length) in head["arrays"].items()
    }
    filled = dict.fromkeys(arrays, 0)  # bytes written into each
    while "done" not in (message := _next(inp)):
        name, part = str(message["name"]), message["part"]
        target = arrays[name].view(np.uint8)
        target[filled[name] : filled[name] + len(part)] = np.frombuffer(part, dtype=np.uint8)
        filled[name] += len(part)
    for name, array in arrays.items():
        if filled[name] != array.nbytes:
            raise ValueError(f"the build sent {filled[name]} of {array.nbytes} bytes of {name}")
    return Postings.from_arrays([str(t) for t in head["vocab"]], int(head["seq"]), arrays)


def _next(inp: IO[bytes]) -> dict[str, Any]:
    message = frames.read(inp)
    if message is None:
        raise EOFError("the build process ended without its answer")
    return message


def main(argv: list[str] | None = None) -> int:
    """Build the postings of the index file named first in ``argv``; send them to stdout."""
    path = (sys.argv[1:] if argv is None else argv)[0]
    configure_allocator()
    limit_blas_threads()
    # At the daemon's own priority: searches rank through FTS5 (several times slower) until
    # the build is done, and on busy cores a niced build took minutes (docs/benchmarks.md).
    out = frames.begin_child()
    conn = connect(path, load_vec=False, readonly=True)
    try:
        state = Postings.build(conn, threading.Event())
    except Mismatch as exc:
        frames.write(out, {"mismatch": str(exc)})
        return 0
    finally:
        conn.close()
    send(state, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
