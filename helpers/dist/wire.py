"""What a collective really sends: the bytes the kernel counts on each worker's network interface,
not a formula. Two workers, each in its own network namespace on one end of a veth pair
(``helpers.dist.netns``), so that nothing else's traffic is counted.

Why it matters: a byte count from the ring formulas (``helpers.dist.counting.wire_bytes``) says
what a bandwidth-optimal algorithm would send, and a backend may send more. Gloo, for one, can
implement a reduce-scatter as a whole all-reduce that keeps one chunk; the counts here show
whether the torch in use does.

Needs root and iproute2, as ``helpers.dist.netns`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import timedelta

from helpers.dist.netns import INTERFACE, run_pair

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def interface_sent() -> int:
    """Bytes this namespace's veth end has sent so far: the kernel's transmit counter, the ninth
    number of its line in ``/proc/net/dev``, which is per namespace, so only the collectives'."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == INTERFACE:
                return int(counters.split()[8])
    raise RuntimeError(f"no interface {INTERFACE} in this network namespace")


def measure_worker(rank: int, address: str, port: int, message_bytes: int, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = INTERFACE
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=120))  # fmt: skip
    whole = torch.ones(message_bytes // 4)
    shard = torch.empty(len(whole) // 2)
    calls = {
        "all_reduce": lambda: dist.all_reduce(whole),
        "reduce_scatter": lambda: dist.reduce_scatter_single(shard, whole),
        "all_gather": lambda: dist.all_gather_single(whole, shard),
    }
    sent: dict[str, list[int]] = {name: [] for name in COLLECTIVES}
    for _ in range(repeats):
        for name in COLLECTIVES:
            dist.barrier()
            before = interface_sent()
            calls[name]()
            dist.barrier()  # the last bytes may still sit in the socket's buffer until the peer
            sent[name].append(interface_sent() - before)  # has them; a barrier adds well under 1 kB
    dist.barrier()
    print(json.dumps({"rank": rank, "sent": sent}), flush=True)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def bytes_sent(message_bytes: int = 16_000_000, repeats: int = 3, timeout: float = 120) -> dict:
    """For each collective on a ``message_bytes`` float32 tensor (the whole tensor: the input of
    an all-reduce and a reduce-scatter, the output of an all-gather), the fewest bytes either of
    2 workers sent in any of ``repeats`` calls, TCP/IP headers included (a few percent)."""
    if message_bytes < 8 or message_bytes % 8:
        raise ValueError(f"the message must be a positive multiple of 8 bytes, got {message_bytes}")
    done = run_pair("helpers.dist.wire", [str(message_bytes), str(repeats)], timeout,
                    "the collectives")  # fmt: skip
    reports = [json.loads(d.stdout.strip().splitlines()[-1]) for d in done]
    return {name: min(min(r["sent"][name]) for r in reports) for name in COLLECTIVES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.dist.wire", description="bytes_sent()'s worker, in its namespace"
    )
    p.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.worker:
        p.error("this is bytes_sent()'s worker: call helpers.dist.wire.bytes_sent()")
    rank, address, port, message_bytes, repeats = args.worker
    measure_worker(int(rank), address, int(port), int(message_bytes), int(repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
