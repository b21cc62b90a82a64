"""Large-batch training, measured: the best learning rate at every global batch, warm-up, and
the budgets (samples, steps, seconds) to reach a target.

* ``run_grid`` trains every (global batch, learning rate, seed) for a budget fixed in epochs, so
  in samples seen: a larger batch gets fewer steps. ``best_lr_table`` picks, per batch, the rate
  whose final training loss is lowest on average over the seeds, and says how far the seeds
  agree. McCandlish et al. 2018 (*An Empirical Model of Large-Batch Training*) predict that the
  best rate grows about linearly with the batch below the critical batch and levels off above
  it: ``best_lr(B) = lr_max / (1 + B_noise / B)`` (``predicted_best_lr``).
* ``noise_scale_during_training`` measures the gradient noise scale (``helpers.noise_scale``),
  their estimate of that critical batch, at a few points of a training run.
* ``time_to_target_table``: the samples, steps and seconds each batch needs, at its best rate,
  to reach a test accuracy, read from the same runs as the tables.

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
from helpers.model import make_mlp
from helpers.noise_scale import measure_noise_scale
from helpers.schedules import Constant, Schedule, WarmupSteps
from helpers.training import TrainConfig, steps_per_epoch, torch_threads, train_steps

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


def _fmt(frame: pd.DataFrame, formats: dict[str, str], names: dict[str, str]) -> str:
    shown = frame[list(formats)].copy()
    for column, spec in formats.items():
        shown[column] = [format(v, spec) if pd.notna(v) else "-" for v in shown[column]]
    return shown.rename(columns=names).to_string(index=False)


def format_plan(batches: Sequence[int], n_samples: int, epochs: int) -> str:
    """The budget per batch: steps and samples seen, and what the dropped last batch leaves out."""
    rows = [
        {
            "global batch": b,
            "share of the data": f"{b / n_samples:.1%}",
            "steps/epoch": steps_per_epoch(n_samples, b),
            f"steps in {epochs} epochs": epochs * steps_per_epoch(n_samples, b),
            "samples seen": epochs * steps_per_epoch(n_samples, b) * b,
            "left out/epoch": n_samples - steps_per_epoch(n_samples, b) * b,
        }
        for b in batches
    ]
    return pd.DataFrame(rows).to_string(index=False)


def format_loss_grid(grid: pd.DataFrame) -> str:
    """Final training loss, mean ± standard deviation over the seeds, batch by lr ("div":
    at least one seed diverged)."""

    def cell(runs: pd.DataFrame) -> str:
        if runs["diverged"].any():
            return f"div ({int(runs['diverged'].sum())}/{len(runs)})"
        return f"{runs['final_loss'].mean():.3f}±{runs['final_loss'].std(ddof=1):.3f}"

    table = grid.groupby(["global_batch", "lr"]).apply(cell, include_groups=False).unstack("lr")
    table.columns = [f"lr {lr:.3f}" for lr in table.columns]
    table.index.name = "batch"
    return table.to_string()


def format_best_lr(best: pd.DataFrame) -> str:
    """The tuning's verdict per batch."""
    return _fmt(
        best,
        {
            "global_batch": "d",
            "steps": "d",
            "samples": ",d",
            "best_lr": ".3f",
            "lowest_seed_best": ".3f",
            "highest_seed_best": ".3f",
            "final_loss": ".3f",
            "final_loss_std": ".3f",
            "accuracy": ".1%",
        },
        {
            "global_batch": "batch",
            "best_lr": "best lr",
            "lowest_seed_best": "seeds' best: from",
            "highest_seed_best": "to",
            "final_loss": "train loss",
            "final_loss_std": "± (sd)",
            "accuracy": "test acc.",
        },
    )


def format_noise_scale(table: pd.DataFrame) -> str:
    """The noise-scale estimates during training (over the seeds, and each seed's range)."""
    return _fmt(
        table,
        {
            "epochs": "d",
            "small_batch": "d",
            "big_batch": "d",
            "seeds": "d",
            "grad_sq": ".3f",
            "trace": ".1f",
            "b_simple": ".0f",
            "b_simple_low": ".0f",
            "b_simple_high": ".0f",
        },
        {
            "epochs": "after epochs",
            "small_batch": "local batch",
            "big_batch": "averaged batch",
            "grad_sq": "|G|^2",
            "trace": "tr(Sigma)",
            "b_simple": "B_simple",
            "b_simple_low": "seeds' B_simple: from",
            "b_simple_high": "to",
        },
    )


def format_warmup(grid: pd.DataFrame) -> str:
    """With against without warm-up: final loss (mean ± sd over seeds), peak loss, divergences."""
    rows = []
    for (lr, warmup), runs in grid.groupby(["lr", "warmup_steps"]):
        rows.append(
            {
                "lr": f"{lr:.3f}",
                "warm-up steps": warmup,
                "diverged": f"{int(runs['diverged'].sum())}/{len(runs)}",
                "peak loss (median)": f"{runs['peak_loss'].median():.2f}",
                "final train loss": f"{runs['final_loss'].mean():.3f}"
                f"±{runs['final_loss'].std(ddof=1):.3f}",
                "test acc.": f"{runs['accuracy'].mean():.1%}",
            }
        )
    return pd.DataFrame(rows).to_string(index=False)


def format_time_to_target(table: pd.DataFrame) -> str:
    """Budgets to the target, per batch at its best rate."""
    shown = table.assign(
        reached=[f"{r}/{n}" for r, n in zip(table.seeds_reaching, table.seeds, strict=True)]
    )
    return _fmt(
        shown,
        {
            "global_batch": "d",
            "best_lr": ".3f",
            "reached": "s",
            "epochs": ".1f",
            "samples": ",.0f",
            "steps": ".0f",
            "seconds": ".2f",
        },
        {
            "global_batch": "batch",
            "best_lr": "best lr",
            "reached": "seeds reaching",
            "epochs": "epochs (median)",
            "seconds": "seconds (1 process)",
        },
    )


# Goyal et al. 2017's ResNet-50 run at minibatch 8k (their Sections 2 and 5).
IMAGENET_TRAIN = 1_281_167
GOYAL = {"batch": 8192, "epochs": 90, "warmup_epochs": 5, "base_lr": 0.1, "base_batch": 256}


def goyal_comparison(
    n_samples: int,
    largest_batch: int,
    epochs: int,
    warmup_batch: int,
    warmup_epochs: int,
    warmup_steps: int,
    warmup_lrs: Sequence[float],
) -> pd.DataFrame:
    """Goyal et al.'s large-batch run beside this notebook's largest batch (the tuning) and its
    warm-up runs, in the same units: the batch as a share of the data, the budget in epochs and
    in steps, and the warm-up in steps and rates."""
    theirs = IMAGENET_TRAIN // GOYAL["batch"]
    base_lr, scaled_lr = GOYAL["base_lr"], GOYAL["base_lr"] * GOYAL["batch"] / GOYAL["base_batch"]
    tuning_steps = epochs * steps_per_epoch(n_samples, largest_batch)
    warmup_total = warmup_epochs * steps_per_epoch(n_samples, warmup_batch)
    rows = [
        ("training samples", f"{IMAGENET_TRAIN:,}", f"{n_samples:,}", f"{n_samples:,}"),
        ("global batch", f"{GOYAL['batch']:,}", f"{largest_batch:,}", f"{warmup_batch:,}"),
        (
            "batch / training set",
            f"{GOYAL['batch'] / IMAGENET_TRAIN:.2%}",
            f"{largest_batch / n_samples:.1%}",
            f"{warmup_batch / n_samples:.1%}",
        ),
        ("budget, epochs", f"{GOYAL['epochs']}", f"{epochs}", f"{warmup_epochs}"),
        ("budget, steps", f"{GOYAL['epochs'] * theirs:,}", f"{tuning_steps:,}",
         f"{warmup_total:,}"),
        ("warm-up, steps", f"{GOYAL['warmup_epochs'] * theirs:,}", "none", f"{warmup_steps}"),
        ("warm-up, rate", f"{base_lr} to {scaled_lr:g}, linear", "-", "0 to the rate, linear"),
        ("optimiser", "SGD, momentum 0.9, weight decay 1e-4", "plain SGD", "plain SGD"),
        ("normalisation", "BatchNorm", "none", "none"),
        ("learning rate", f"{base_lr} x batch/{GOYAL['base_batch']}", "tuned per batch",
         ", ".join(f"{lr:g}" for lr in warmup_lrs)),
    ]
    columns = ["", "Goyal et al. (ResNet-50, ImageNet)", "here: tuning, largest batch",
               "here: warm-up runs"]
    return pd.DataFrame(rows, columns=columns)


def format_goyal(table: pd.DataFrame) -> str:
    """The comparison as text."""
    return table.to_string(index=False)
