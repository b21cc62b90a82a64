"""Small worker functions for the launcher tests (spawned workers import them from here)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def rank_and_sum(rank: int, world: int, scale: float = 1.0) -> tuple[int, int, float, int]:
    """Return rank, world, the all-reduced sum of (rank + 1) * scale, and the thread count."""
    t = torch.tensor([(rank + 1) * scale])
    dist.all_reduce(t)
    return rank, world, float(t.item()), torch.get_num_threads()


def fail_on_rank(rank: int, world: int, bad_rank: int) -> int:
    """Every rank waits in a collective except ``bad_rank``, which raises first."""
    if rank == bad_rank:
        raise ValueError(f"bad input on rank {rank}")
    dist.all_reduce(torch.ones(1))
    return rank


def skip_collective(rank: int, world: int) -> int:
    """Rank 0 waits for a collective that rank 1 never joins: a hang without a timeout."""
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(60)
    return rank


def die_hard(rank: int, world: int) -> int:
    """Rank 1 exits without reporting anything, as a crash would."""
    if rank == 1:
        os._exit(3)
    dist.barrier()
    return rank


def sleep_and_report_pid(rank: int, world: int, pid_dir: str, seconds: float) -> int:
    """Write this worker's pid to a file, then sleep: lets a test interrupt a running launch."""
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return rank


def return_tensor(rank: int, world: int) -> torch.Tensor:
    """Return a tensor: it must survive the worker's exit."""
    return torch.full((1000,), float(rank))
