"""Notebook 06's figures: steps against samples to a loss target, and the noise scale along a
run. Tables from ``helpers.experiments.large_batch``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure


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
