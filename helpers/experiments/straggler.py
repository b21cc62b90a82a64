"""A straggler: one slow worker, and what every other worker pays for it (notebook 11).

Data parallelism is synchronous: no worker can take its optimizer step before the all-reduce of
the gradients, and the all-reduce cannot finish before the last worker has contributed. So every
step lasts as long as the slowest worker's compute, plus the all-reduce itself::

    t_step = max over ranks of (compute_r) + all-reduce

``straggler_worker`` makes this visible: it trains the reference MLP with the all-reduce written
out by hand (the gradients flattened into one tensor and ``dist.all_reduce``-d, as DDP's buckets
do), and timestamps each step's parts on every rank: forward and backward, an injected delay on
the slow rank (a sleep standing for a slower machine, a noisy neighbour, a stalled data loader),
the all-reduce, the optimizer's step. A fast rank's time *in* the all-reduce is then mostly
waiting for the straggler; the straggler's is the transfer alone.

How much a straggler costs grows with the number of workers, since the step waits for the
maximum of N compute times: ``expected_max`` gives ``E[max of N draws]`` of a measured
distribution exactly (order statistics of the empirical distribution), ``simulated_max`` the
same by drawing, to check it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.data import load_har
from helpers.training.model import make_mlp
from helpers.training.order import epoch_order, local_slice

PHASES = ("compute", "delay", "all-reduce", "step")  # the parts of a step, in order


def straggler_worker(
    rank: int,
    world_size: int,
    slow_rank: int,
    delay: float,
    steps: int = 8,
    baseline_steps: int = 30,
    warmup: int = 2,
    global_batch: int = 256,
    data: str | None = None,
) -> list[dict]:
    """Train with the gradients all-reduced by hand, each step's parts timestamped: first
    ``baseline_steps`` steps with no delay, then ``steps`` with ``slow_rank`` sleeping ``delay``
    seconds after its backward. ``warmup`` untimed steps come first. One dict per timed step."""
    har = load_har(data, download=False)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    torch.manual_seed(0)
    model = make_mlp()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05)
    per_epoch = len(X) // global_batch
    plan = ["warmup"] * warmup + ["baseline"] * baseline_steps + ["straggler"] * steps
    rows = []
    dist.barrier()
    for step, phase in enumerate(plan):
        epoch, i = divmod(step, per_epoch)  # the data order of notebook 03, epoch after epoch
        batch = epoch_order(len(X), epoch)[i * global_batch : (i + 1) * global_batch]
        idx = local_slice(batch, rank, world_size)
        t0 = time.time()
        optimizer.zero_grad()
        F.cross_entropy(model(X[idx]), y[idx]).backward()
        t1 = time.time()
        if phase == "straggler" and rank == slow_rank:
            time.sleep(delay)
        t2 = time.time()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)  # returns once every rank has contributed its gradients
        t3 = time.time()
        flat /= world_size
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))
        optimizer.step()
        t4 = time.time()
        if phase != "warmup":
            times = {"start": t0, "computed": t1, "delayed": t2, "reduced": t3, "end": t4}
            rows.append({"rank": rank, "step": step - warmup, "phase": phase, **times})
    return rows


def step_table(per_rank: Sequence[list[dict]]) -> pd.DataFrame:
    """Every rank's timed steps as one table, times in seconds from the first step's start:
    start, compute, delay, allreduce, step (the optimizer's) and total (the whole step)."""
    table = pd.DataFrame([row for rows in per_rank for row in rows])
    origin = table["start"].min()
    return pd.DataFrame(
        {
            "rank": table["rank"],
            "step": table["step"],
            "phase": table["phase"],
            "start": table["start"] - origin,
            "compute": table["computed"] - table["start"],
            "delay": table["delayed"] - table["computed"],
            "allreduce": table["reduced"] - table["delayed"],
            "optimizer": table["end"] - table["reduced"],
            "total": table["end"] - table["start"],
        }
    )


def per_rank_summary(table: pd.DataFrame, phase: str = "straggler") -> pd.DataFrame:
    """Median seconds per step of each part, by rank, over the steps of one phase: what a
    profiler's per-rank view shows. The straggler computes longest and waits least."""
    rows = table[table["phase"] == phase]
    parts = ["compute", "delay", "allreduce", "optimizer", "total"]
    return rows.groupby("rank")[parts].median()


def find_straggler(summary: pd.DataFrame) -> int:
    """The rank the others wait for: the longest time before the all-reduce (compute and any
    delay), which is also the rank that waits least inside it."""
    before = summary["compute"] + summary["delay"]
    slowest, least_waiting = int(before.idxmax()), int(summary["allreduce"].idxmin())
    if slowest != least_waiting:
        raise ValueError(
            f"rank {slowest} computes longest but rank {least_waiting} waits least: no single "
            "straggler in these timings (take more steps, or a larger delay)"
        )
    return slowest


# --------------------------------------------------------------------------- N workers


def expected_max(samples: Sequence[float] | np.ndarray, n: int) -> float:
    """``E[max of n independent draws]`` from the empirical distribution of ``samples``, exactly:
    the i-th smallest of m samples is the maximum with probability ``(i/m)^n - ((i-1)/m)^n``."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    x = np.sort(np.asarray(samples, dtype=float))
    if x.size == 0:
        raise ValueError("expected_max needs at least one measured time")
    i = np.arange(1, x.size + 1) / x.size
    return float(np.sum(x * (i**n - (i - 1 / x.size) ** n)))


def simulated_max(
    samples: Sequence[float] | np.ndarray, n: int, draws: int = 20_000, seed: int = 0
) -> float:
    """The same expectation by drawing: ``draws`` synchronous steps of ``n`` workers, each
    worker's compute time drawn from ``samples``, the step lasting the slowest one's."""
    x = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    return float(x[rng.integers(0, x.size, size=(draws, n))].max(axis=1).mean())


def slowdown_table(samples: Sequence[float] | np.ndarray, worlds: Sequence[int]) -> pd.DataFrame:
    """For each number of workers: the expected slowest compute time of a step (exact and by
    drawing) and how much longer that is than one worker's mean (``slowdown``)."""
    mean = float(np.mean(samples))
    rows = []
    for n in worlds:
        exact = expected_max(samples, n)
        drawn = simulated_max(samples, n)
        rows.append({"workers": n, "expected_max_s": exact, "simulated_max_s": drawn,
                     "slowdown": exact / mean})  # fmt: skip
    return pd.DataFrame(rows)


def any_straggler(p: float, worlds: Sequence[int]) -> pd.DataFrame:
    """If each worker, independently, is slowed at a step with probability ``p``, the step is
    slowed whenever any of the N is: with probability ``1 - (1 - p)^N``."""
    return pd.DataFrame({"workers": list(worlds),
                         "step_slowed": [1 - (1 - p) ** n for n in worlds]})  # fmt: skip
