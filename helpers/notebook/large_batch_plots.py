"""Notebook 06's figures: the runs to a loss target (their loss, and the steps each rate took),
steps against samples, the noise scale along a run, and the best rate beside the rules of thumb.
Tables from ``helpers.experiments.large_batch``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure


def plot_runs_to_target(runs: pd.DataFrame, best: pd.DataFrame, banner: str, seed: int = 0
                        ) -> Figure:  # fmt: skip
    """Left: the training loss against samples seen, one line per batch at its best rate (one
    seed), the target drawn and the counted step marked: what a count means. Right: the steps to
    the target against the rate, per batch (median over the seeds; a rate where some seed missed
    the target is a cross at the steps it trained before it was stopped), so the best rate at
    each batch can be read off."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.5))
    best_lr = best.set_index("global_batch")["best_lr"]
    target = float(runs["target"].iloc[0])
    for i, (batch, at_batch) in enumerate(runs.groupby("global_batch")):
        color = f"C{i}"
        if batch in best_lr.index:
            run = at_batch[(at_batch["lr"] == best_lr[batch]) & (at_batch["seed"] == seed)].iloc[0]
            seen = np.asarray(run["checkpoints"]) * batch
            left.plot(seen, run["losses"], "-", color=color, lw=1.2,
                      label=f"batch {batch}, lr {run['lr']:g}")  # fmt: skip
            at = run["checkpoints"].index(run["steps"])
            left.plot([seen[at]], [run["losses"][at]], "o", color=color, ms=7)
        per_lr = at_batch.groupby("lr").agg(
            all_reached=("reached", "all"), steps=("steps", "median"), run=("steps_run", "max")
        )
        ok = per_lr[per_lr["all_reached"]]
        right.plot(ok.index, ok["steps"], "o-", color=color, label=f"batch {batch}")
        missed = per_lr[~per_lr["all_reached"]]
        right.plot(missed.index, missed["run"], "x", color=color, ms=9)
    left.axhline(target, ls="--", color="black", lw=1, label=f"target {target:g}")
    left.plot([], [], "o", color="grey", label="the counted step")
    left.set_xscale("log")
    left.set_xlabel("samples seen (log scale)")
    left.set_ylabel("training loss (evaluation subset)")
    left.set_title(f"The loss along each batch's run at its best rate (seed {seed})", fontsize=9)
    right.set_xscale("log", base=2)
    rates = sorted(runs["lr"].unique())
    right.set_xticks(rates, [f"{lr:g}" for lr in rates])
    right.minorticks_off()
    right.set_yscale("log")
    right.set_xlabel("learning rate (log scale)")
    right.set_ylabel("steps to the target (log scale)")
    right.set_title("Steps to the target per rate (x: a seed stopped short of it)", fontsize=9)
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Runs to the loss target\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_steps_samples(points: pd.DataFrame, s_min: float, e_min: float, banner: str) -> Figure:
    """Steps against samples to the target (log axes), one point per seed at each batch's best
    rate, beside McCandlish et al.'s curve ``S = S_min + E_min / B`` fitted to them, its two
    asymptotes and the critical batch ``E_min / S_min`` (where both are twice their minimum)."""
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for i, (batch, runs) in enumerate(points.groupby("global_batch")):
        lr = runs["lr"].iloc[0]
        ax.plot(runs["samples"], runs["steps"], "o", ms=8, alpha=0.8, color=f"C{i}",
                label=f"batch {batch} (lr {lr:g}), one point per seed")  # fmt: skip
    b = np.geomspace(points["global_batch"].min() / 4, points["global_batch"].max() * 4, 200)
    steps = s_min + e_min / b
    ax.plot(steps * b, steps, "-", color="grey", label="fit: S = S_min + E_min / B")
    ax.axhline(s_min, ls=":", color="grey", lw=1)
    ax.axvline(e_min, ls=":", color="grey", lw=1)
    ax.plot([2 * e_min], [2 * s_min], "kx", ms=10,
            label=f"critical batch E_min / S_min = {e_min / s_min:.0f}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples to the target (log scale)")
    ax.set_ylabel("steps to the target (log scale)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"Steps against samples to the loss target, each batch at its best rate\n{banner}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def plot_noise_scale(along: pd.DataFrame, pooled: pd.DataFrame, b_crit: float, banner: str
                     ) -> Figure:  # fmt: skip
    """Left: the training loss along the run, per seed. Right: ``B_simple`` per seed (points)
    and pooled over the seeds (line), beside the critical batch read off the steps figure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.0))
    for i, (seed, rows) in enumerate(along.groupby("seed")):
        left.plot(rows["step"], rows["loss"], "o-", color=f"C{i}", alpha=0.7, label=f"seed {seed}")
        right.plot(rows["step"], rows["b_simple"], "o", color=f"C{i}", alpha=0.7,
                   label=f"seed {seed}")  # fmt: skip
    right.plot(pooled["step"], pooled["b_simple"], "-", color="black", label="seeds pooled")
    right.axhline(b_crit, ls="--", color="C3", label=f"critical batch from the fit ({b_crit:.0f})")
    left.set_ylabel("training loss (evaluation subset)")
    right.set_ylabel("B_simple (log scale)")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"The simple noise scale along a run\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_rules_of_thumb(best: pd.DataFrame, rates: Mapping[int, Sequence[float]], b_noise: float,
                        banner: str) -> Figure:  # fmt: skip
    """The best rate at each batch (``best_per_batch``) against the batch, log axes, beside the
    rates two rules ask for, both anchored at the smallest batch's best rate: linear scaling
    (Goyal et al. 2017, rate in proportion to the batch) and McCandlish et al. 2018's
    ``lr_max / (1 + B_noise / B)``. The rates tried at each batch are drawn behind: a rule's rate
    above them was never tried, and the measured best can only lie among them."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (batch, grid) in enumerate(sorted(rates.items())):
        ax.plot([batch] * len(grid), grid, "_", color="grey", ms=16, mew=1.5,
                label="the rates tried (section 1)" if i == 0 else None)  # fmt: skip
    measured = best.sort_values("global_batch")
    small, base = measured["global_batch"].iloc[0], measured["best_lr"].iloc[0]
    b = np.geomspace(small, measured["global_batch"].iloc[-1], 200)
    ax.plot(b, base * b / small, "--", color="C1", label="linear scaling: lr in proportion to B")
    ax.plot(b, base * (b / (b + b_noise)) / (small / (small + b_noise)), ":", color="C2", lw=2,
            label=f"McCandlish et al.: lr_max / (1 + B_noise / B), B_noise {b_noise:.0f}")
    ax.plot(measured["global_batch"], measured["best_lr"], "o-", color="C0", ms=8,
            label="the best rate measured (section 1)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(measured["global_batch"], [f"{v:d}" for v in measured["global_batch"]])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("global batch B (log scale)")
    ax.set_ylabel("learning rate (log scale)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"The best rate against the batch, and two rules anchored at batch {small}\n"
                 f"{banner}", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig
