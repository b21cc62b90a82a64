"""What compression costs and what it keeps: a hook's compute per step, measured alone (the
casts of fp16, PowerSGD's products and orthogonalisation), the same training under each hook, and
the fastest variant whose accuracy stays within a tolerance of the reference."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch
from torch import nn

from helpers.data import load_har
from helpers.dist.comm_hooks import CommHook, powersgd_start_iter
from helpers.experiments.comm_engineering.variants import Variant
from helpers.training import (
    RunResult,
    TrainConfig,
    run_trainings,
    torch_threads,
)
from helpers.training.config import total_steps
from helpers.training.model import make_mlp

# --------------------------------------------------------------------------- memory and compression


def compression_seconds(
    hook: CommHook, matrix_rank: int = 1, repeats: int = 5, model: nn.Module | None = None
) -> float:
    """One worker's compute per step for a hook's compression, measured in this process on
    one thread (the fastest of ``repeats``: the compute itself, without what other programs took
    from it): the casts of FP16/BF16, or PowerSGD's products
    ``P = M Q``, ``Q = M^T P`` and ``M ~ P Q^T`` with its orthogonalisation and error feedback,
    for every gradient matrix it compresses, each ``Q`` drawn once and reused from call to call,
    as the hook's ``warm_start`` does. Zero for ``ALLREDUCE``."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    if hook is CommHook.ALLREDUCE:
        return 0.0
    model = model or make_mlp()
    grads = [torch.randn(p.shape) for p in model.parameters()]
    flat = torch.cat([g.ravel() for g in grads])
    error = torch.zeros_like(flat)
    warm: dict[int, torch.Tensor] = {}  # each matrix's last Q, as PowerSGDState keeps it

    def powersgd() -> None:
        flat.add_(error)  # error feedback in
        copy = flat.clone()
        for i, g in enumerate(grads):
            if g.dim() < 2:
                continue
            m = g.view(g.shape[0], -1)
            r = min(*m.shape, matrix_rank)
            if m.numel() <= (sum(m.shape) * r) * 2:
                continue
            q = warm.setdefault(i, torch.randn(1, m.shape[1], r))
            p = torch.bmm(m.unsqueeze(0), q)
            _orthogonalize(p)  # Gram-Schmidt for r <= 2, torch.linalg.qr above
            torch.bmm(m.t().unsqueeze(0), p, out=q)
            m.copy_(torch.bmm(p, q.transpose(1, 2))[0])
        torch.sub(copy, flat, out=error)  # error feedback out

    def cast() -> None:
        dtype = torch.float16 if hook is CommHook.FP16 else torch.bfloat16
        flat.copy_(flat.to(dtype).div_(2))

    work = powersgd if hook is CommHook.POWER_SGD else cast
    with torch_threads(1):
        work()  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
    return min(times)


# --------------------------------------------------------------------------- accuracy


def train_hooks(
    variants: Sequence[Variant], base: TrainConfig, world: int = 2, threads_per_worker: int = 1
) -> list[RunResult]:
    """The same training under each variant, in one launch, final weights returned; PowerSGD
    compresses after about 10% of the training's steps, as PyTorch advises
    (``comm_hooks.powersgd_start_iter``)."""
    n_samples = len(load_har(base.data, download=False).X_train)
    start = powersgd_start_iter(total_steps(base, n_samples))
    configs = [replace(v.config(base), return_weights=True, powersgd_start_iter=start)
               for v in variants]  # fmt: skip
    return run_trainings(world, configs, threads_per_worker)


def best_within_tolerance(
    table: pd.DataFrame,
    accuracy: dict[str, float],
    reference_accuracy: float,
    tolerance: float,
    global_batch: int = 256,
) -> pd.DataFrame:
    """The rows of ``speedup_table``'s table at ``global_batch`` whose variant's test accuracy
    (``accuracy``, by variant name; variants without one are left out) lies within
    ``tolerance`` of ``reference_accuracy``, fastest first, with their accuracy and its gap."""
    rows = table[(table["global_batch"] == global_batch) & table["variant"].isin(list(accuracy))]
    rows = rows.assign(accuracy=rows["variant"].map(accuracy))
    rows = rows.assign(accuracy_gap=(rows["accuracy"] - reference_accuracy).abs())
    kept = rows[rows["accuracy_gap"] <= tolerance + 1e-12]
    return kept.sort_values("speedup", ascending=False).reset_index(drop=True)
