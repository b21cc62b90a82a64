"""The best learning rate at every global batch, and what McCandlish et al. 2018 (*An Empirical
Model of Large-Batch Training*) predict of it: ``best_lr(B) = lr_max / (1 + B_noise / B)``, with
the gradient noise scale B_noise measured during training (``helpers.experiments.noise_scale``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from helpers.data import HARData
from helpers.experiments.large_batch.grid import SEEDS, reordered
from helpers.experiments.noise_scale import measure_noise_scale
from helpers.training import TrainConfig, torch_threads, train_steps
from helpers.training.model import make_mlp


@dataclass(frozen=True)
class BestLR:
    """The tuning's verdict for one batch."""

    global_batch: int
    steps: int
    samples: int
    best_lr: float  # lowest final loss averaged over the seeds
    lowest_seed_best: float  # the range of the best rate picked seed by seed
    highest_seed_best: float
    final_loss: float  # mean over the seeds, at best_lr
    final_loss_std: float
    accuracy: float  # mean test accuracy over the seeds, at best_lr

def best_lr_table(grid: pd.DataFrame) -> pd.DataFrame:
    """Per batch, the learning rate with the lowest seed-averaged final training loss, and the
    range of the rates each seed alone would have picked (the tuning's uncertainty)."""
    rows = []
    for batch, runs in grid.groupby("global_batch"):
        mean = runs.groupby("lr")["final_loss"].mean()
        best = float(mean.idxmin())
        per_seed = runs.loc[runs.groupby("seed")["final_loss"].idxmin(), "lr"]
        at_best = runs[runs["lr"] == best]
        rows.append(
            BestLR(
                global_batch=int(batch),
                steps=int(runs["steps"].iloc[0]),
                samples=int(runs["samples"].iloc[0]),
                best_lr=best,
                lowest_seed_best=float(per_seed.min()),
                highest_seed_best=float(per_seed.max()),
                final_loss=float(at_best["final_loss"].mean()),
                final_loss_std=float(at_best["final_loss"].std(ddof=1)),
                accuracy=float(at_best["accuracy"].mean()),
            ).__dict__
        )
    return pd.DataFrame(rows)

def predicted_best_lr(batch: float | np.ndarray, lr_max: float, b_noise: float) -> np.ndarray:
    """McCandlish et al.'s best learning rate at batch ``B``: ``lr_max / (1 + B_noise / B)``,
    linear in ``B`` well below ``B_noise``, levelling off at ``lr_max`` well above it."""
    return lr_max / (1 + b_noise / np.asarray(batch, dtype=float))

def fit_lr_max(best: pd.DataFrame, b_noise: float) -> float:
    """The ``lr_max`` that fits the measured best rates best in log space, given ``B_noise``:
    the geometric mean of ``best_lr * (1 + B_noise / B)``."""
    ratios = best["best_lr"] * (1 + b_noise / best["global_batch"])
    return float(np.exp(np.log(ratios).mean()))

def noise_scale_interval(
    measured_ratio: float, smallest: int, largest: int, resolution: float = 2.0
) -> tuple[float, float]:
    """The noise scales ``B_noise`` whose predicted growth of the best rate from batch
    ``smallest`` to ``largest``, ``(1 + B/smallest) / (1 + B/largest)``, lies within a factor
    ``resolution`` of ``measured_ratio``: how tightly the tuning alone pins the noise scale down
    (``inf``: any larger one too). The growth rises from 1 (``B_noise`` 0) to
    ``largest / smallest`` (the linear rule), so each end solves one equation."""

    def noise_scale_for(growth: float) -> float:
        if growth <= 1:
            return 0.0
        if growth >= largest / smallest:
            return math.inf
        return (growth - 1) / (1 / smallest - growth / largest)

    return noise_scale_for(measured_ratio / resolution), noise_scale_for(
        measured_ratio * resolution
    )

def noise_scale_during_training(
    data: HARData,
    after_epochs: Sequence[int],
    config: TrainConfig,
    seeds: Sequence[int] = SEEDS,
    local_batch: int = 64,
    workers: int = 4,
    n_batches: int = 20,
    threads: int = 2,
) -> pd.DataFrame:
    """The simple noise scale ``B_simple`` after training ``config`` for each number of epochs
    in ``after_epochs`` (0: at initialisation), estimated from ``n_batches`` global batches of
    ``workers`` local batches of ``local_batch`` samples, for every seed (initial weights, data
    order and the batches sampled). One row per point: ``|G|^2`` and ``tr(Sigma)`` averaged over
    the seeds *before* dividing (a ratio of noisy means is less biased than a mean of noisy
    ratios), and the range of the seeds' own ``B_simple``. Each point trains from scratch."""
    rows = []
    with torch_threads(threads):
        for epochs in after_epochs:
            estimates = []
            for seed in seeds:
                X, y = reordered(data, seed)
                torch.manual_seed(seed)
                model = make_mlp()
                if epochs > 0:
                    train_steps(model, X, y, replace(config, epochs=epochs, seed=seed))
                estimates.append(
                    measure_noise_scale(model, X, y, local_batch, workers, n_batches, seed)
                )
            grad_sq = float(np.mean([e.grad_sq for e in estimates]))
            trace = float(np.mean([e.trace for e in estimates]))
            rows.append(
                {
                    "epochs": epochs,
                    "small_batch": local_batch,
                    "big_batch": local_batch * workers,
                    "seeds": len(estimates),
                    "grad_sq": grad_sq,
                    "trace": trace,
                    "b_simple": trace / grad_sq,
                    "b_simple_low": min(e.b_simple for e in estimates),
                    "b_simple_high": max(e.b_simple for e in estimates),
                }
            )
    return pd.DataFrame(rows)
