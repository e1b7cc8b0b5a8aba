"""The allocator setting the daemon makes at start (memd/heap.py), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import sys, psutil
from memd.heap import configure_allocator
if sys.argv[1] == "set":
    assert configure_allocator()
rss = lambda: psutil.Process().memory_info().rss
# One 4 MB block freed raises glibc's mmap threshold above 2 MB (its default behaviour); then
# blocks of 2 MB, small ones kept between them, are freed: in the heap, their pages stay.
first = bytearray(4 << 20)
del first
keep, big = [], []
for _ in range(150):
    big.append(bytearray(2 << 20))
    keep.append(bytearray(200))
before = rss()
for i in range(len(big)):
    big[i] = None
print((before - rss()) >> 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_blocks_go_back_to_the_os_when_freed() -> None:
    def returned(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    assert returned("set") >= 250  # of the 300 MB freed
    assert returned("default") < 100  # the threshold rose: the pages stayed
