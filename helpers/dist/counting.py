"""Collectives counted as PyTorch's dispatcher sees them: every all-reduce, all-gather and
reduce-scatter a block of code issues (DDP's reducer, FSDP2's hooks, DTensor's redistributions),
with its message size, the bytes each worker sends on a ring, and a replay that times them alone."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.dist.comm_model import ring_factor

KINDS = {
    "allreduce_": "all-reduce",
    "allreduce_coalesced_": "all-reduce",
    "_allgather_base_": "all-gather",
    "allgather_": "all-gather",
    "allgather_into_tensor_coalesced_": "all-gather",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "broadcast_": "broadcast",
    # the functional collectives DTensor issues (tensor parallelism's redistributions)
    "all_reduce": "all-reduce",
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
    "all_to_all_single": "all-to-all",
    # point to point (a pipeline's stages): what a worker sends, and what it receives
    "send": "send",
    "recv_": "receive",
}
NAMESPACES = ("c10d", "_c10d_functional")  # wait_tensor, also functional, is no collective

def _bytes_in(arg: Any) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, list | tuple):
        return sum(_bytes_in(a) for a in arg)
    return 0

def wire_bytes(kind: str, message: int, world_size: int) -> float:
    """Bytes each worker sends for one collective on a ring: ``2(N-1)/N`` times the message for
    an all-reduce, ``(N-1)/N`` for an all-gather or a reduce-scatter (each is one half of a
    ring all-reduce; an all-to-all keeps 1/N of its message and sends the rest), ``message`` for
    a broadcast's root and a send, nothing for a receive (its sender counts it)."""
    if kind == "receive":
        return 0.0
    if kind == "all-reduce":
        return ring_factor(world_size) * message
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return ring_factor(world_size) / 2 * message
    return float(message) if world_size > 1 else 0.0

class CollectiveCounter(TorchDispatchMode):
    """Record every collective issued inside ``with CollectiveCounter() as c:``: its kind and its
    message, the larger of its input and output (the whole tensor an all-gather assembles, the
    whole tensor a reduce-scatter reduces). DDP's reducer and FSDP2's hooks both go through
    PyTorch's dispatcher, where this mode sees them; so do the functional collectives with which
    DTensor redistributes a tensor parallel layer's input or output at its boundary."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if func.namespace == "c10d" or (func.namespace in NAMESPACES and name in KINDS):
            result = func(*args, **kwargs)  # a functional all-gather's whole is its result
            message = max((_bytes_in(a) for a in (*args, *kwargs.values(), result)), default=0)
            self.calls.append((KINDS.get(name, name), message))
            return result
        return func(*args, **kwargs)

def replay_call_seconds(calls: list[tuple[str, int]], repeats: int) -> list[float]:
    """Issue ``calls`` again, alone, one after another (every rank must call it), and return each
    call's median seconds: the communication of one step without the computation around it,
    call by call, so that a total can be traced to the kinds and sizes that make it."""
    world = dist.get_world_size()
    buffers = []
    for kind, message in calls:
        n = max(1, message // 4)
        n -= n % world
        buffers.append((kind, torch.zeros(n), torch.zeros(max(1, n // world))))
    rounds = []
    for _ in range(repeats + 1):  # the first round is a warm-up
        dist.barrier()
        durations = []
        for kind, whole, shard in buffers:
            started = time.perf_counter()
            if kind == "all-reduce":
                dist.all_reduce(whole)
            elif kind == "all-gather":
                dist.all_gather_single(whole, shard)
            elif kind == "reduce-scatter":
                dist.reduce_scatter_single(shard, whole)
            elif kind == "broadcast":
                dist.broadcast(whole, 0)
            durations.append(time.perf_counter() - started)
        rounds.append(durations)
    return [statistics.median(call) for call in zip(*rounds[1:], strict=True)]

def per_step_traffic(calls: list[tuple[str, int]], world_size: int) -> dict[str, dict]:
    """One step's collectives summed by kind: calls, message bytes, and the bytes each worker
    sends on a ring (``wire_bytes``)."""
    table: dict[str, dict] = {}
    for kind, message in calls:
        row = table.setdefault(kind, {"calls": 0, "message_bytes": 0, "wire_bytes": 0.0})
        row["calls"] += 1
        row["message_bytes"] += message
        row["wire_bytes"] += wire_bytes(kind, message, world_size)
    return table

COUNTED = ("all-reduce", "all-gather", "reduce-scatter")
