"""Notebooks 03 and 04's figures of rounding: two trainings' losses step by step with their
difference against float32's spacing, and each run's weight gaps to one process against the
tolerance that tells rounding from another training. Each returns its figure."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from helpers.notebook.plotting import WORLD_COLOURS, label_zero_floor, zero_floor

# ------------------------------------------------------------------ notebooks 03 and 04: rounding


def plot_loss_curves(losses: dict[int, list[float]], banner: str) -> Figure:
    """The training loss at every step for each world size (top), and each world size's
    ``|loss - loss(1 worker)|`` on a log scale (bottom), beside the spacing of float32 numbers
    near the loss: curves that overlap on top can still be told apart, and the gap read against
    rounding. Steps where the two losses are the same bits, which a log scale cannot place, are
    drawn as ticks on the bottom line, labelled 0, and counted in the legend."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    one = np.asarray(losses[1])
    steps = np.arange(len(one))
    spacing = np.spacing(one.astype(np.float32))
    gaps = {w: np.abs(np.asarray(c) - one) for w, c in losses.items() if w != 1}
    floor = zero_floor(np.concatenate([spacing, *gaps.values()]), 1e-9)
    for world, curve in losses.items():
        top.plot(steps, curve, lw=1.2 if world == 1 else 0.8, ls="-" if world == 1 else "--",
                 color=WORLD_COLOURS.get(world), label=f"{world} worker(s)")
    for world, gap in gaps.items():
        shown, colour = gap > 0, WORLD_COLOURS.get(world)
        bottom.plot(steps[shown], gap[shown], ".", ms=4, color=colour,
                    label=f"|loss({world} workers) - loss(1 worker)|")
        same = np.count_nonzero(~shown)
        bottom.plot(steps[~shown], np.full(same, floor), "|", ms=8, color=colour,
                    label=f"{world} workers: the same bits ({same} steps)")
    bottom.plot(steps, spacing, color="grey", lw=1,
                label="spacing of float32 numbers near the loss (one rounding)")
    top.set_ylabel("training loss (global batch)")
    top.set_title(f"The same training on 1 and more workers, step by step\n{banner}", fontsize=10)
    top.legend(fontsize=8)
    label_zero_floor(bottom, floor)
    bottom.set_xlabel("step")
    bottom.set_ylabel("difference of the losses")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_weight_gaps(gaps: pd.DataFrame, atol: float, banner: str) -> Figure:
    """``helpers.experiments.ddp_script.tensor_gaps``: each run's largest weight difference from
    one process, one marker per parameter tensor, on a log scale, with the tolerance the grader
    uses ("to rounding") as a line. Identical bits (a gap of 0) are drawn on the bottom tick,
    labelled 0."""
    fig, ax = plt.subplots(figsize=(10, 4))
    floor = zero_floor(gaps.to_numpy().ravel(), atol / 1e6)
    markers = "os^vDP"
    for j, tensor in enumerate(gaps.columns):
        xs = np.arange(len(gaps)) + (j - (len(gaps.columns) - 1) / 2) * 0.1
        ax.scatter(xs, gaps[tensor].where(gaps[tensor] > 0, floor), s=22, label=tensor,
                   marker=markers[j % len(markers)])
    ax.axhline(atol, color="black", ls="--", lw=1, label=f"the grader's\ntolerance, {atol:g}")
    label_zero_floor(ax, floor)
    ax.set_xticks(range(len(gaps)), [textwrap.fill(name, 13) for name in gaps.index], fontsize=8)
    ax.set_ylabel("max |w - w(1 process)| in the tensor")
    ax.set_title("Each run's largest weight difference from the one-process run, one marker per "
                 f"parameter tensor\n{banner}", fontsize=10)
    # beside the axes, where it hides no marker; the tensors by their state_dict keys
    ax.legend(title="tensor", fontsize=7, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig
