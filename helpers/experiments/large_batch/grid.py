"""The grid of trainings notebook 06 reads: every (global batch, learning rate, seed) for a budget
fixed in epochs (so in samples seen: a larger batch gets fewer steps), with warm-up, divergence
flagged, and the samples, steps and seconds each batch needs to reach a target.

The runs use one process (``train_in_process``'s loop): N workers sharing a global batch do the
same training to rounding (notebook 03), so one process tells *what* is learnt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from helpers.data import HARData
from helpers.training import TrainConfig, steps_per_epoch, torch_threads, train_steps
from helpers.training.model import make_mlp
from helpers.training.schedules import Constant, Schedule, WarmupSteps

BATCHES: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)  # 4096 would be 55% of the samples
LR_GRID: tuple[float, ...] = tuple(0.025 * 2 ** (k / 2) for k in range(1, 7))  # 0.035 ... 0.2
SEEDS: tuple[int, ...] = (0, 1, 2)
EPOCHS = 3  # the budget: 3 passes over the training set at every batch

Progress = Callable[[str], None] | None


def diverged(losses: Sequence[float], steps_per_epoch: int) -> bool:
    """Whether training failed: a non-finite loss, or a last-epoch mean loss above the first
    step's. A spike that training recovers from (the catapult phase of Lewkowycz et al. 2020)
    does not count: only where training ends up does."""
    if not all(math.isfinite(v) for v in losses):
        return True
    return last_epoch_loss(losses, steps_per_epoch) > losses[0]


def last_epoch_loss(losses: Sequence[float], steps_per_epoch: int) -> float:
    """Mean training loss over the last epoch's steps (``inf`` if any is not finite)."""
    last = list(losses[-steps_per_epoch:])
    return sum(last) / len(last) if all(math.isfinite(v) for v in last) else math.inf


def reordered(data: HARData, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set, its rows permuted by ``seed`` (seed 0: as stored). The loop's epoch
    order is seeded by the epoch alone, so permuting the rows gives every seed its own data
    order as well as its own initial weights, without touching the training loop."""
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    if seed == 0:
        return X, y
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(10_000 + seed))
    return X[perm], y[perm]


@dataclass(frozen=True)
class Run:
    """What one training run measured. ``final_loss``: the mean cross-entropy over the whole
    training set after the budget, the quantity the learning rate is tuned on."""

    global_batch: int
    lr: float
    seed: int
    warmup_steps: int
    epochs: int
    steps: int
    samples: int  # samples seen: steps x global batch (the dropped remainder not counted)
    first_loss: float
    peak_loss: float
    final_loss: float
    diverged: bool
    accuracy: float
    seconds: float  # training time in this process (evaluations excluded)
    epoch_accuracies: list[float] = field(repr=False)
    losses: list[float] = field(repr=False)


def train_run(config: TrainConfig, data: HARData, threads: int = 2, warmup_steps: int = 0) -> Run:
    """Train ``config`` in this process, with seed ``config.seed`` for both the initial weights
    and (via ``reordered``) the data order, and measure it."""
    X, y = reordered(data, config.seed)
    X_test, y_test = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    config = replace(config, record_loss=True)

    def test_accuracy(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return (model(X_test).argmax(dim=1) == y_test).float().mean().item()

    with torch_threads(threads):
        torch.manual_seed(config.seed)
        model = make_mlp()
        loop = train_steps(model, X, y, config, evaluate=test_accuracy)
        seconds = time.perf_counter() - loop.clock_start - loop.eval_seconds
        losses, accuracies = loop.losses, loop.epoch_accuracies
        with torch.no_grad():
            final = F.cross_entropy(model(X), y).item()
    spe = steps_per_epoch(len(X), config.global_batch)
    losses = losses.tolist()
    finite = all(math.isfinite(v) for v in losses) and math.isfinite(final)
    return Run(
        global_batch=config.global_batch,
        lr=config.lr,
        seed=config.seed,
        warmup_steps=warmup_steps,
        epochs=config.epochs,
        steps=spe * config.epochs,
        samples=spe * config.epochs * config.global_batch,
        first_loss=losses[0],
        peak_loss=max(losses) if finite else math.inf,
        final_loss=final if finite else math.inf,
        diverged=diverged(losses, spe) or not finite,
        accuracy=accuracies[-1],
        seconds=seconds,
        epoch_accuracies=accuracies,
        losses=losses,
    )


def run_grid(
    data: HARData,
    batches: Sequence[int] = BATCHES,
    lrs: Sequence[float] = LR_GRID,
    seeds: Sequence[int] = SEEDS,
    epochs: int = EPOCHS,
    warmup_steps: int = 0,
    threads: int = 2,
    progress: Progress = None,
) -> pd.DataFrame:
    """Train every (batch, lr, seed) for ``epochs`` epochs, optionally with a linear warm-up of
    ``warmup_steps`` steps from 0; one row per run (``Run``'s fields)."""
    schedule: Schedule = WarmupSteps(warmup_steps) if warmup_steps > 0 else Constant()
    rows = []
    for batch in batches:
        for lr in lrs:
            for seed in seeds:
                config = TrainConfig(
                    global_batch=batch,
                    epochs=epochs,
                    lr=lr,
                    seed=seed,
                    schedule=schedule,
                    data=data.source,
                )
                rows.append(train_run(config, data, threads, warmup_steps).__dict__)
            if progress is not None:
                progress(f"batch {batch:>4}, lr {lr:.3f}: {len(seeds)} seeds trained")
    return pd.DataFrame(rows)


def epochs_to_reach(epoch_accuracies: Sequence[float], target: float) -> int | None:
    """The first epoch (counting from 1) after which the accuracy is at least ``target``;
    ``None`` if it never gets there."""
    for epoch, value in enumerate(epoch_accuracies, start=1):
        if value >= target:
            return epoch
    return None


def time_to_target_table(grid: pd.DataFrame, best: pd.DataFrame, target: float) -> pd.DataFrame:
    """For each batch at its best rate: how many of its seeds reach ``target`` test accuracy
    within the budget, and for those, the median epochs, samples, steps and seconds (in this
    process) to get there. Read from the same runs as ``best_lr_table``."""
    rows = []
    for b in best.itertuples(index=False):
        runs = grid[(grid["global_batch"] == b.global_batch) & (grid["lr"] == b.best_lr)]
        reached = [epochs_to_reach(acc, target) for acc in runs["epoch_accuracies"]]
        hit = [e for e in reached if e is not None]
        epochs = float(np.median(hit)) if hit else math.nan
        spe = b.steps / runs["epochs"].iloc[0]
        per_epoch = float((runs["seconds"] / runs["epochs"]).median())
        rows.append(
            {
                "global_batch": b.global_batch,
                "best_lr": b.best_lr,
                "seeds_reaching": len(hit),
                "seeds": len(reached),
                "epochs": epochs,
                "samples": epochs * spe * b.global_batch,
                "steps": epochs * spe,
                "seconds_per_epoch": per_epoch,
                "seconds": epochs * per_epoch,
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- tables, formatted for printing


