"""Worker functions used only by tests/test_collectives.py (spawned workers import them here)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from helpers.dist.collectives import rank_data, ring_allreduce


def _refuse(*args, **kwargs):
    raise AssertionError("ring_allreduce must use point-to-point messages, not a collective")


def ring_and_allreduce(
    rank: int, world: int, cases: Sequence[tuple[int, torch.dtype]], seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each (length, dtype): this rank's ring all-reduce result and dist.all_reduce's, as
    NumPy arrays (a tensor put on the launcher's queue travels as shared memory, which is gone
    once the worker exits).

    While the ring runs, the collectives it could hide behind raise, so a ring that simply called
    dist.all_reduce would fail this test."""
    results = []
    for n, dtype in cases:
        data = rank_data(rank, n, seed, dtype)
        saved = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "broadcast")}
        for name in saved:
            setattr(dist, name, _refuse)
        try:
            by_ring = ring_allreduce(data.clone(), rank, world)
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)
        by_gloo = data.clone()
        dist.all_reduce(by_gloo)
        results.append((by_ring.numpy(), by_gloo.numpy()))
    return results
