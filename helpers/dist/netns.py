"""Two "machines" on one Linux host: two network namespaces joined by a veth pair, each with its
own address, optionally with the link's bandwidth limited by ``tc`` to a real network's.

Needs root and iproute2 (``ip``, ``tc``). ``veth_pair()`` creates them and removes them again;
``measure`` times the all-reduce across the pair, each rank a process started in its namespace
(``python -m helpers.dist.netns --worker ...``); ``helpers.experiments.veth`` fits notebook 02's
model to it.

A veth pair copies bytes in the kernel, so without a limit it is as fast as loopback; the limit
(a token bucket filter on each end's outgoing traffic) is what makes it a network.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from helpers.dist.processes import run_together

INTERFACE = "ddp0"  # the veth end's name inside each namespace: one GLOO_SOCKET_IFNAME for both
RATES = {"unlimited": None, "10 Gbit/s": 10e9, "1 Gbit/s": 1e9}


@dataclass(frozen=True)
class VethPair:
    namespaces: tuple[str, str]
    addresses: tuple[str, str]
    interface: str = INTERFACE

    @property
    def prefixes(self) -> list[list[str]]:
        """The command that runs a program inside each namespace."""
        return [["ip", "netns", "exec", ns] for ns in self.namespaces]


def why_no_namespaces() -> str | None:
    """Why this process cannot make network namespaces, or None if it can (root and ``ip``)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = f"ddpprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def veth_pair(rate_bits: float | None = None) -> Iterator[VethPair]:
    """Two fresh network namespaces joined by a veth pair (10.R.R.1 and .2, /24), loopback up
    in each; with ``rate_bits``, each end sends at most that many bits per second. Removed on
    exit, whatever happens."""
    tag = uuid.uuid4().hex[:6]
    ns = (f"ddp{tag}a", f"ddp{tag}b")
    subnet = f"10.{int(tag[:2], 16)}.{int(tag[2:4], 16)}"
    addresses = (f"{subnet}.1", f"{subnet}.2")
    made: list[str] = []
    try:
        for name in ns:
            _ip("netns", "add", name)
            made.append(name)
        _ip("link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        for end, name, address in zip("ab", ns, addresses, strict=True):
            _ip("link", "set", f"v{tag}{end}", "netns", name)
            _ip("-n", name, "link", "set", f"v{tag}{end}", "name", INTERFACE)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", INTERFACE)
            _ip("-n", name, "link", "set", INTERFACE, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            if rate_bits:
                burst = max(32_000, int(rate_bits / 8 / 1000))  # a millisecond of traffic
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        name,
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        INTERFACE,
                        "root",
                        "tbf",
                        "rate",
                        f"{int(rate_bits)}bit",
                        "burst",
                        str(burst),
                        "latency",
                        "100ms",
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
        yield VethPair(ns, addresses)
    finally:
        for name in made:  # removing a namespace removes its end of the pair, and so the pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


# --------------------------------------------------------------------------- the measurement


def _worker(rank: int, address: str, port: int, sizes: list[int], repeats: int) -> None:
    import torch.distributed as dist

    from helpers.dist.collectives import time_allreduce

    os.environ["GLOO_SOCKET_IFNAME"] = INTERFACE
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=120),
    )
    # An error propagates with its traceback and no teardown: destroying the group while the
    # peer may still be in a collective can abort this process before the error is printed.
    rows = time_allreduce(rank, 2, sizes, repeats=repeats, warmup=2)
    dist.barrier()  # nothing in flight on Gloo's threads when the group is torn down
    if rank == 0:
        print(json.dumps(rows), flush=True)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def run_pair(
    module: str, args: list[str], timeout: float, what: str, rate_bits: float | None = None
) -> list[subprocess.CompletedProcess]:
    """Run ``python -m module --worker RANK ADDRESS PORT *args`` in each namespace of a fresh veth
    pair, one worker (1 thread) in each, and return both finished processes. Past ``timeout``
    seconds, or on any error, both workers are stopped before the namespaces go; ``what`` names
    the work in the error."""
    with veth_pair(rate_bits) as pair:
        port = "29400"  # a fresh namespace: nothing else listens there
        commands = [[*prefix, sys.executable, "-m", module, "--worker", str(rank),
                     pair.addresses[0], port, *args]
                    for rank, prefix in enumerate(pair.prefixes)]  # fmt: skip
        try:
            done = run_together(commands, timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
        except TimeoutError:
            raise RuntimeError(
                f"{what} did not finish within {timeout:g} s; both workers stopped"
            ) from None
    if any(d.returncode for d in done):
        last = [d.stderr.strip().splitlines()[-1:] for d in done]  # c10d's warnings before it
        raise RuntimeError(f"a worker failed (exit codes {[d.returncode for d in done]}): {last}")
    return done


def measure(
    rate_bits: float | None, sizes: list[int], repeats: int = 7, timeout: float = 300
) -> list[dict]:
    """All-reduce times between the two namespaces, one worker (1 thread) in each. Past
    ``timeout`` seconds, or on any error, both workers are killed before the namespaces go."""
    done = run_pair("helpers.dist.netns", [str(repeats), *map(str, sizes)], timeout,
                    "the all-reduce across the veth pair", rate_bits)  # fmt: skip
    return json.loads(done[0].stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.dist.netns",
        description="measure()'s worker: one rank's timed all-reduces inside its namespace",
    )
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.worker:
        p.error("this is measure()'s worker: run python -m helpers.experiments.veth to measure")
    rank, address, port, repeats, *sizes = args.worker
    _worker(int(rank), address, int(port), [int(s) for s in sizes], int(repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
