"""Collectives between real processes: what each one gives every rank, a ring all-reduce built
from point-to-point messages, and a timer for ``all_reduce``.

Every function taking ``(rank, world_size, ...)`` first is a *worker*: run it with
``helpers.dist.launch.launch``, which starts the processes and joins them into a Gloo process group.
Workers **return** what they found instead of printing it: text printed by a worker process does
not reach a notebook under test (nbval), and returned values can be checked by the caller.

``ring_allreduce`` is not a worker itself but is called inside one, on a tensor, like
``dist.all_reduce``; it carries out the schedule simulated in NumPy by
``helpers.notebook.allreduce_sim.ring_allreduce`` (notebook 01) with real messages.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

# --------------------------------------------------------------------------- a tour


def collectives_tour(rank: int, world_size: int) -> dict[str, Any]:
    """Worker: call each basic collective once, on small tensors whose values say where they came
    from, and return what this rank held afterwards (plain Python numbers, easy to compare).

    * ``all_reduce`` (sum) of ``rank + 1``: every rank gets ``1 + 2 + ... + N``;
    * ``broadcast`` from rank 0 of ``[1, 2, 3]`` (the others start from zeros): every rank gets
      rank 0's tensor;
    * ``all_gather`` of ``10 * rank``: every rank gets the list of all contributions, in rank
      order;
    * ``send`` / ``recv`` around a ring: each rank sends ``100 * rank`` to its right neighbour and
      receives from its left one.

    ``pid`` is the process's id, so that the caller can see that every rank ran in a process of
    its own.
    """
    summed = torch.tensor([float(rank + 1)])
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)

    shared = torch.tensor([1.0, 2.0, 3.0]) if rank == 0 else torch.zeros(3)
    before_broadcast = shared.tolist()
    dist.broadcast(shared, src=0)

    mine = torch.tensor([10.0 * rank])
    gathered = [torch.empty(1) for _ in range(world_size)]
    dist.all_gather(gathered, mine)

    received = torch.tensor([-1.0])  # -1: nothing received (a world of one has no neighbour)
    if world_size > 1:
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        outgoing = torch.tensor([100.0 * rank])
        # send and recv block until the other side takes part. If every rank sent first, each
        # could wait for a neighbour that is itself waiting to send: a deadlock. Even ranks send
        # first and odd ranks receive first, so every send meets a receive that is ready.
        if rank % 2 == 0:
            dist.send(outgoing, dst=right)
            dist.recv(received, src=left)
        else:
            dist.recv(received, src=left)
            dist.send(outgoing, dst=right)

    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "all_reduce": summed.item(),
        "broadcast_before": before_broadcast,
        "broadcast": shared.tolist(),
        "all_gather": [t.item() for t in gathered],
        "recv_from_left": received.item(),
        "pid": os.getpid(),
    }


def allreduce_in_two_halves(rank: int, world_size: int, n: int, seed: int) -> dict[str, Any]:
    """Worker: ``dist.reduce_scatter_single`` then ``dist.all_gather_single``, the ring's two
    halves as PyTorch names them (``reduce_scatter_tensor`` and ``all_gather_into_tensor``
    before, which PyTorch 2.13 deprecates); FSDP calls them separately (notebook 08). Against one
    ``dist.all_reduce`` of the same values (``rank_data``; ``n`` must split evenly)."""
    if n % world_size:
        raise ValueError(f"n must be a multiple of the world size {world_size}, got {n}")
    values = rank_data(rank, n, seed)
    summed = values.clone()
    dist.all_reduce(summed)
    chunk = torch.empty(n // world_size, dtype=values.dtype)
    dist.reduce_scatter_single(chunk, values)  # this rank's chunk of the sum, and nothing else
    whole = torch.empty_like(values)
    dist.all_gather_single(whole, chunk)  # every rank's chunk, in rank order
    mine = summed.view(world_size, -1)[rank]
    return {
        "rank": rank,
        "chunk": f"{rank * len(chunk):,} to {(rank + 1) * len(chunk) - 1:,}",
        "chunk is the sum's": bool(torch.equal(chunk, mine)),
        "gathered = all_reduce": bool(torch.equal(whole, summed)),
    }


# --------------------------------------------------------------------------- the ring


def _exchange(outgoing: torch.Tensor, dst: int, incoming: torch.Tensor, src: int) -> None:
    """Send ``outgoing`` to ``dst`` while receiving ``incoming`` from ``src``.

    Both are posted before waiting on either (``isend`` / ``irecv`` return at once), so no rank
    can block in a send while its neighbour blocks in a send too. Empty chunks (a tensor with
    fewer elements than ranks) are skipped on both sides alike, as both know the chunk sizes.
    """
    requests = []
    if incoming.numel():
        requests.append(dist.irecv(incoming, src=src))
    if outgoing.numel():
        requests.append(dist.isend(outgoing, dst=dst))
    for request in requests:
        request.wait()


def ring_allreduce(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, with point-to-point messages around the ring
    ``0 -> 1 -> ... -> N-1 -> 0``; call it inside a worker, on every rank, like
    ``dist.all_reduce(tensor)``. Returns ``tensor``.

    The tensor is cut into N chunks whose sizes differ by at most one (any length works).
    Reduce-scatter, N - 1 steps: at step s, rank i sends chunk ``(i - s) mod N`` to its right
    neighbour and adds chunk ``(i - s - 1) mod N``, received from its left one, into its own copy.
    Afterwards rank i holds the full sum of chunk ``(i + 1) mod N``. All-gather, N - 1 steps: each
    rank passes on the finished chunk it got last; the receiver overwrites its copy.
    Every rank sends (and receives) 2 (N - 1) chunks of about M / N bytes: 2 (N - 1) / N * M.

    Each chunk is summed exactly once, in one order, then only copied, so every rank ends with
    the same bits. The order (chunk c: rank c's values first, then c + 1, ...) may differ from
    ``dist.all_reduce``'s, so with floats and 3+ ranks the two can differ in the last bits.
    """
    if not tensor.is_contiguous():
        raise ValueError("ring_allreduce needs a contiguous tensor (call .contiguous() first)")
    if world_size == 1:
        return tensor
    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views into tensor
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    scratch = torch.empty_like(chunks[0])  # chunk 0 is a largest one

    for step in range(world_size - 1):  # reduce-scatter
        send_chunk = chunks[(rank - step) % world_size]
        recv_chunk = chunks[(rank - step - 1) % world_size]
        arrived = scratch[: recv_chunk.numel()]
        _exchange(send_chunk, right, arrived, left)
        recv_chunk.add_(arrived)

    for step in range(world_size - 1):  # all-gather
        send_chunk = chunks[(rank + 1 - step) % world_size]
        recv_chunk = chunks[(rank - step) % world_size]
        _exchange(send_chunk, right, recv_chunk, left)  # received straight into place
    return tensor


def mean_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """The ranks' ``values`` averaged, the same on every rank (a new tensor; ``values`` itself
    when there is no group or one rank). With equal local batches the mean of the ranks' losses
    is the global batch's loss: the one number a 1-worker run of the same batch would record."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    mean = values.clone()
    dist.all_reduce(mean)
    return mean.div_(dist.get_world_size())


def rank_data(rank: int, n: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The random vector rank ``rank`` contributes in ``compare_ring_with_allreduce``: standard
    normal values (or integers in [-1000, 1000) for integer dtypes), from ``seed + rank``, so the
    caller can rebuild every rank's data."""
    generator = torch.Generator().manual_seed(seed + rank)
    if dtype.is_floating_point:
        return torch.randn(n, generator=generator, dtype=dtype)
    return torch.randint(-1000, 1000, (n,), generator=generator, dtype=dtype)


def digest(tensor: torch.Tensor) -> str:
    """A short fingerprint of a tensor's bytes: equal digests mean bit-identical tensors."""
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()[:16]


def compare_ring_with_allreduce(
    rank: int, world_size: int, n: int, seed: int = 0, dtype: torch.dtype = torch.float64
) -> dict[str, Any]:
    """Worker: all-reduce the same random data (``rank_data``) with ``ring_allreduce`` and with
    ``dist.all_reduce``, and report how they compare on this rank.

    Returns ``equal`` (bit for bit), ``max_abs_diff``, ``n_different`` (elements that differ),
    ``max_abs_value`` (of the sum, to judge the difference against) and a ``digest`` of each
    result, so the caller can check that all ranks hold identical bits.
    """
    data = rank_data(rank, n, seed, dtype)
    by_ring = ring_allreduce(data.clone(), rank, world_size)
    by_gloo = data.clone()
    dist.all_reduce(by_gloo)
    difference = (by_ring - by_gloo).abs()
    return {
        "rank": rank,
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "equal": torch.equal(by_ring, by_gloo),
        "max_abs_diff": difference.max().item() if n else 0.0,
        "n_different": int((by_ring != by_gloo).sum()),
        "max_abs_value": by_gloo.abs().max().item() if n else 0.0,
        "ring_digest": digest(by_ring),
        "allreduce_digest": digest(by_gloo),
    }


# --------------------------------------------------------------------------- timing


def time_allreduce(
    rank: int,
    world_size: int,
    sizes_bytes: Sequence[int],
    repeats: int = 15,
    warmup: int = 3,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, float]]:
    """Worker: time ``dist.all_reduce`` of one tensor of each size in ``sizes_bytes``.

    First ``warmup`` untimed calls per size (connections, buffers and caches get set up). Then
    ``repeats`` rounds, each timing one call per size, every call started right after a
    ``barrier`` so that all ranks begin together. Taking the sizes in turn, rather than all
    repeats of one size in a row, spreads a burst of load from other programs over all sizes
    instead of spoiling one. A call's time is that of its *slowest* rank, since the all-reduce
    is done only when every rank has the result.

    Returns, for each size, the bytes actually all-reduced (rounded down to whole elements of
    ``dtype``), the median of the ``repeats`` times and their first and third quartiles (the
    middle half of the times lies between the two), in seconds. Every rank returns the same.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    element = torch.empty(0, dtype=dtype).element_size()
    tensors = []
    for nbytes in sizes_bytes:
        if int(nbytes) < element:
            raise ValueError(f"{nbytes} bytes is less than one {dtype} element ({element} bytes)")
        # zeros stay zeros, however often they are summed: no overflow to inf
        tensors.append(torch.zeros(int(nbytes) // element, dtype=dtype))
    for tensor in tensors:
        for _ in range(warmup):
            dist.all_reduce(tensor)
    times = torch.empty(repeats, len(tensors), dtype=torch.float64)
    for i in range(repeats):
        for j, tensor in enumerate(tensors):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times[i, j] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # call by call, the slowest rank's time
    quartiles = times.quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)
    return [
        {
            "bytes": tensor.numel() * element,
            "seconds": quartiles[1, j].item(),
            "seconds_p25": quartiles[0, j].item(),
            "seconds_p75": quartiles[2, j].item(),
        }
        for j, tensor in enumerate(tensors)
    ]
