"""Goyal et al. 2017 (*Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour*) set like for
like beside this course's runs: their batch, warm-up and linear scaling rule, in samples, steps and
epochs."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from helpers.training import steps_per_epoch

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
