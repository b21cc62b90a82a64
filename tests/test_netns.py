"""helpers.dist.netns: two network namespaces joined by a veth pair, and an all-reduce timed
across them that leaves no process behind; and how tc's token bucket on the pair counts bytes
(notebook 10 explains the measured slope with it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.dist.netns import measure, veth_pair


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


# each end listens, connects to the other, sends PAYLOAD bytes and reads what the other sends
PEER = """
import socket, sys, threading, time
me, other, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = socket.create_server((me, 5555))
def drain():
    conn, _ = server.accept()
    while conn.recv(1 << 20):
        pass
reader = threading.Thread(target=drain)
reader.start()
for _ in range(200):
    try:
        out = socket.create_connection((other, 5555))
        break
    except OSError:
        time.sleep(0.05)
out.sendall(b"x" * n)
out.close()
reader.join()
"""


def tc_sent(prefix: list[str]) -> int:
    """The bytes tc's root qdisc on the pair's end has let through."""
    shown = subprocess.run([*prefix, "tc", "-s", "qdisc", "show", "dev", "ddp0"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    return int(re.search(r"Sent (\d+) bytes", shown)[1])


def test_the_token_bucket_counts_the_headers_of_every_segment(namespaces):
    """At the veth's MTU of 1,500, a TCP segment (timestamps on) carries 1,448 bytes and 66 of
    Ethernet, IP and TCP headers: tc counts about 1.047 bytes per byte sent, in both directions at
    once as an all-reduce of 2 sends (the ACKs ride along for about 0.1% more)."""
    payload = 20_000_000
    with veth_pair(1e9) as pair:
        before = [tc_sent(prefix) for prefix in pair.prefixes]
        peers = [subprocess.Popen([*prefix, sys.executable, "-c", PEER, me, other, str(payload)])
                 for prefix, me, other in zip(pair.prefixes, pair.addresses,
                                              pair.addresses[::-1], strict=True)]  # fmt: skip
        try:
            assert [p.wait(timeout=60) for p in peers] == [0, 0]
        finally:
            for p in peers:
                p.kill()
        after = [tc_sent(prefix) for prefix in pair.prefixes]
    counted = [(a - b) / payload for a, b in zip(after, before, strict=True)]
    assert all(1.03 < c < 1.06 for c in counted), counted  # the headers counted, little else
