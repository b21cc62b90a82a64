"""The gradient noise scale (McCandlish et al. 2018, *An Empirical Model of Large-Batch
Training*), measured the way data parallelism offers it for free.

A batch of ``B`` samples gives the true gradient ``G`` plus noise whose covariance is the
per-sample covariance ``Sigma`` divided by ``B``. The *simple noise scale*
``B_simple = tr(Sigma) / |G|^2`` is the batch at which the noise and the signal are of the same
size: McCandlish et al. found it predicts the critical batch, beyond which a larger batch buys
few steps. Its two ingredients follow from squared gradient norms at two batch sizes (their
Appendix A): ``E|g_B|^2 = |G|^2 + tr(Sigma) / B``. Under DDP every worker holds its local
gradient (the small batch) and, after the all-reduce, the average (the big batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class NoiseScale:
    """An estimate of ``|G|^2``, ``tr(Sigma)`` and their ratio, from ``n_batches`` big batches."""

    small_batch: int
    big_batch: int
    n_batches: int
    grad_sq: float  # |G|^2, the squared norm of the true gradient
    trace: float  # tr(Sigma), the summed per-sample gradient variance

    @property
    def b_simple(self) -> float:
        """``tr(Sigma) / |G|^2``: the batch at which gradient noise and signal are equal."""
        return self.trace / self.grad_sq


def noise_scale_from_norms(
    small_sq: Sequence[float], big_sq: Sequence[float], small_batch: int, big_batch: int
) -> NoiseScale:
    """McCandlish et al.'s unbiased estimates from squared gradient norms measured at two batch
    sizes: ``small_sq[i]`` the mean over workers of ``|local gradient|^2``, ``big_sq[i]`` the
    ``|averaged gradient|^2`` of the same step. Numerator and denominator are each averaged over
    the steps before dividing, since each alone is noisy and the ratio of noisy terms is biased."""
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small batch < big batch, got {small_batch}, {big_batch}")
    if len(small_sq) != len(big_sq) or not small_sq:
        raise ValueError("need as many small- as big-batch norms, at least one")
    small, big = float(np.mean(small_sq)), float(np.mean(big_sq))
    grad_sq = (big_batch * big - small_batch * small) / (big_batch - small_batch)
    trace = (small - big) / (1 / small_batch - 1 / big_batch)
    return NoiseScale(small_batch, big_batch, len(small_sq), grad_sq, trace)


def _flat_gradient(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    F.cross_entropy(model(X), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def measure_noise_scale(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    local_batch: int,
    workers: int,
    n_batches: int,
    seed: int = 0,
) -> NoiseScale:
    """The noise scale of ``model``'s loss where it stands, from ``n_batches`` global batches
    of ``workers * local_batch`` random training samples: each worker's local gradient is the
    small batch, their average (what DDP's all-reduce yields) the big one. Weights unchanged."""
    if workers < 2:
        raise ValueError("the estimate needs two batch sizes: at least 2 workers")
    big = workers * local_batch
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    if n_batches * big > len(X):
        raise ValueError(f"{n_batches} batches of {big} need more than the {len(X)} samples")
    small_sq, big_sq = [], []
    for i in range(n_batches):
        batch = order[i * big : (i + 1) * big]
        local = [_flat_gradient(model, X[idx], y[idx]) for idx in batch.split(local_batch)]
        small_sq.append(float(torch.stack([g.double().square().sum() for g in local]).mean()))
        big_sq.append(float(torch.stack(local).mean(dim=0).double().square().sum()))
    model.zero_grad()
    return noise_scale_from_norms(small_sq, big_sq, local_batch, big)
