"""helpers.dist.netns: two network namespaces joined by a veth pair, and an all-reduce timed
across them that leaves no process behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.dist.netns import measure


def processes_with(word: str) -> list[int]:
    """The processes whose command line contains ``word`` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        if word.encode() in words:
            found.append(int(cmdline.parent.name))
    return found


def test_the_all_reduce_is_timed_across_the_pair(namespaces):
    rows = measure(None, [4096, 65536], repeats=1)
    assert [r["bytes"] for r in rows] == [4096, 65536]
    assert all(r["seconds"] > 0 for r in rows)


@pytest.mark.slow
def test_a_measurement_past_its_timeout_leaves_no_worker_behind(namespaces):
    size = str(4_000_000 + os.getpid() % 100_000)  # a size only this test asks for: its mark
    with pytest.raises(RuntimeError, match="did not finish within 5 s; both workers stopped"):
        measure(1e3, [int(size)], repeats=1, timeout=5)  # 1 kbit/s: the bytes take hours
    deadline = time.monotonic() + 30  # a bound for a hang, not a timing
    while processes_with(size) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(size) == [], "the workers outlived their namespaces"
