"""The frames the daemon speaks with its children, against real child processes that answer,
hang, die, answer garbage, or report an error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from memd import frames
from memd_client import errors

CHILD = """
import sys
from memd import frames
from memd_client.errors import BadRequest
inp, out = sys.stdin.buffer, sys.stdout.buffer
while (request := frames.read(inp)) is not None:
    what = request["do"]
    if what == "echo":
        frames.write(out, {"ok": request["value"]})
    elif what == "hang":
        import time; time.sleep(60)
    elif what == "die":
        sys.exit(7)
    elif what == "garbage":
        out.write(b"\\x00\\x00\\x00\\x03abc"); out.flush()
    elif what == "huge":
        out.write(b"\\xff\\xff\\xff\\xff"); out.flush()
    elif what == "error":
        frames.write(out, frames.error_frame(BadRequest("no such thing")))
"""


@contextmanager
def child() -> Iterator[tuple[subprocess.Popen[bytes], frames.Pipe]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    os.set_blocking(proc.stdin.fileno(), False)
    os.set_blocking(proc.stdout.fileno(), False)
    pipe = frames.Pipe(proc.stdin, proc.stdout)
    try:
        yield proc, pipe
    finally:
        pipe.close()
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_an_answer_comes_back_whole_even_larger_than_a_pipe() -> None:
    with child() as (_, pipe):
        value = "x" * (1 << 20)  # far over a pipe's buffer, both ways
        assert pipe.exchange({"do": "echo", "value": value}, 30) == {"ok": value}


@pytest.mark.parametrize(
    ("do", "why"), [("hang", "timeout"), ("die", "closed"), ("garbage", "malformed")]
)
def test_a_child_that_fails_to_answer_says_how(do: str, why: str) -> None:
    with child() as (proc, pipe):
        with pytest.raises(frames.ChildFailed) as failed:
            pipe.exchange({"do": do}, 1.0 if do == "hang" else 30)
        assert failed.value.why == why
        if do == "die":
            assert frames.describe_exit(proc.wait(10)) == "exit 7"


def test_a_frame_over_the_limit_is_not_read() -> None:
    with child() as (_, pipe):
        with pytest.raises(frames.ChildFailed, match="malformed"):
            pipe.exchange({"do": "huge"}, 30)


def test_errors_cross_as_the_clients_own() -> None:
    with child() as (_, pipe):
        reply = pipe.exchange({"do": "error"}, 30)
    with pytest.raises(errors.BadRequest, match="no such thing"):
        frames.raise_error(reply)
    frames.raise_error({"ok": 1})  # no error: nothing raised


def test_a_signal_is_named() -> None:
    assert frames.describe_exit(-9) == "SIGKILL"
    assert frames.describe_exit(-200) == "signal 200"
