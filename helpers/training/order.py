"""The data order: every worker visits the samples in the same order and takes its own slice.

An epoch's order is ``randperm`` seeded by the epoch, the same on every worker; a global batch is
a contiguous chunk of it, and rank r takes the r-th ``global_batch // world`` of that chunk. So
1 worker on the whole global batch and N workers on its slices see the same samples per step.
"""

from __future__ import annotations

import torch


def local_slice(global_batch_indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous ``global_batch // world_size`` share of one global batch."""
    local = len(global_batch_indices) // world_size
    return global_batch_indices[rank * local : (rank + 1) * local]

def epoch_order(n: int, epoch: int, seed_offset: int = 0) -> torch.Tensor:
    """The order in which an epoch visits the samples: the same on every worker."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch + seed_offset))

def worker_order(n: int, epoch: int, rank: int, order_per_rank: bool = False) -> torch.Tensor:
    """The order this rank visits the samples in: the shared ``epoch_order``, or, for the
    "different data orders" mistake, one of its own."""
    return epoch_order(n, epoch, 1000 * rank if order_per_rank else 0)
