"""What the runs to a loss target say: the best rate at each batch, the steps-against-samples
curve and the critical batch read off it (McCandlish et al. 2018, *An Empirical Model of
Large-Batch Training*), and the simple noise scale measured along a run, to set beside it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from torch import nn

from helpers.data import HARData
from helpers.experiments.large_batch.target import (
    eval_loss,
    eval_subset,
    reordered,
    train_counting,
)
from helpers.experiments.noise_scale import measure_noise_scale
from helpers.training import TrainConfig


def best_per_batch(runs: pd.DataFrame) -> pd.DataFrame:
    """Per batch, the rate whose seeds *all* reached the target in the fewest steps (median over
    the seeds), with that median's steps and samples; a batch where no rate got every seed there
    is left out."""
    rows = []
    for batch, at_batch in runs.groupby("global_batch"):
        ok = at_batch.groupby("lr").filter(lambda r: bool(r["reached"].all()))
        if ok.empty:
            continue
        median = ok.groupby("lr")["steps"].median()
        best = float(median.idxmin())
        rows.append(
            {
                "global_batch": int(batch),
                "best_lr": best,
                "seeds": int((ok["lr"] == best).sum()),
                "steps": float(median[best]),
                "samples": float(median[best]) * int(batch),
            }
        )
    return pd.DataFrame(rows)


def at_best_rate(runs: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """The runs (every seed) at each batch's best rate: the points of the figure."""
    key = best.set_index("global_batch")["best_lr"]
    return runs[runs["lr"] == runs["global_batch"].map(key)]


def fit_steps_samples(batches: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """McCandlish et al.'s trade-off ``S = S_min + E_min / B`` (equivalently
    ``(S / S_min - 1)(E / E_min - 1) = 1`` with ``E = B S`` samples), fitted by least squares on
    the relative error of ``S``. Returns ``(S_min, E_min)``: the fewest steps (at an infinite
    batch) and the fewest samples (in the limit of a small batch); their ratio is the critical
    batch."""
    b, s = np.asarray(batches, dtype=float), np.asarray(steps, dtype=float)
    if len(np.unique(b)) < 2 or len(b) != len(s):
        raise ValueError("need steps at two batch sizes at least, one count per batch")
    design = np.stack([np.ones_like(b), 1 / b], axis=1) / s[:, None]
    (s_min, e_min), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    return float(s_min), float(e_min)


def noise_scale_along_run(
    data: HARData,
    global_batch: int,
    lr: float,
    seeds: Sequence[int],
    at_steps: Sequence[int],
    local_batch: int = 64,
    workers: int = 4,
    n_batches: int = 20,
    threads: int = 2,
) -> pd.DataFrame:
    """The simple noise scale ``B_simple = tr(Sigma) / |G|^2`` at steps ``at_steps`` of a run at
    ``global_batch`` and ``lr``, per seed, from ``n_batches`` global batches of ``workers`` local
    batches of ``local_batch`` (``measure_noise_scale``), beside the training loss on the
    evaluation subset there. One row per (seed, step)."""
    X_eval, y_eval = eval_subset(data)
    rows: list[dict] = []
    for seed in seeds:
        X, y = reordered(data, seed)

        def measure(step: int, model: nn.Module, seed: int = seed, X=X, y=y) -> None:
            if step not in at_steps:
                return
            ns = measure_noise_scale(model, X, y, local_batch, workers, n_batches, seed + step)
            rows.append(
                {
                    "seed": seed,
                    "step": step,
                    "loss": eval_loss(model, X_eval, y_eval),
                    "grad_sq": ns.grad_sq,
                    "trace": ns.trace,
                    "b_simple": ns.b_simple,
                }
            )

        # measure does the evaluating: the loop evaluates nothing of its own, and never stops
        config = TrainConfig(global_batch=global_batch, lr=lr, seed=seed)
        train_counting(data, config, [max(at_steps)], lambda model: 0.0, lambda done, v: None,
                       threads, after_step=measure)  # fmt: skip
    return pd.DataFrame(rows)


def pooled_noise_scale(along: pd.DataFrame) -> pd.DataFrame:
    """Per step, ``|G|^2`` and ``tr(Sigma)`` averaged over the seeds *before* dividing (a ratio
    of noisy means is less biased than a mean of noisy ratios), and the mean loss."""
    pooled = along.groupby("step")[["loss", "grad_sq", "trace"]].mean()
    pooled["b_simple"] = pooled["trace"] / pooled["grad_sq"]
    return pooled.reset_index()
