"""Worker functions for tests/test_goes_wrong.py (spawned workers import them from here)."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_construct(rank: int, world: int) -> int:
    """Wrap a small model in DDP and take one step: what every DDP training starts with."""
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    return rank
