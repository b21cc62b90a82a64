"""Notebook 11's figures: a per-rank step timeline with a straggler, the expected slowdown of a
synchronous step with more workers, the windows a sharded evaluation miscounts, the test accuracy
of each run to a target and how its count is read, and time against cost to that target. Each
returns its figure; the notebook calls ``plt.show()``."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from helpers.experiments.cost import WINDOW, moving_average

_PARTS = {  # column of helpers.experiments.straggler.step_table: (label, colour, hatch)
    "compute": ("forward + backward", "C0", None),
    "delay": ("injected delay", "C3", "//"),
    "allreduce": ("in all-reduce (waiting included)", "C1", None),
    "optimizer": ("optimizer step", "C2", None),
}


def plot_step_timeline(table: pd.DataFrame, source: str, steps_per_phase: int = 4) -> Figure:
    """Each rank's steps as bars on one clock: the last ``steps_per_phase`` steps without a
    straggler (left) and the first with one (right), each part of a step in its colour.
    ``source``, the line under the title, says where the timings come from."""
    phases = [("baseline", "no straggler"), ("straggler", "rank with a delay: a straggler")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, (phase, title) in zip(axes, phases, strict=True):
        rows = table[table["phase"] == phase]
        chosen = sorted(rows["step"].unique())
        chosen = chosen[-steps_per_phase:] if phase == "baseline" else chosen[:steps_per_phase]
        rows = rows[rows["step"].isin(chosen)]
        origin = rows["start"].min()
        for rank, mine in rows.groupby("rank"):
            for _, step in mine.iterrows():
                left = step["start"] - origin
                for part, (_, colour, hatch) in _PARTS.items():
                    ax.barh(rank, step[part], left=left, height=0.6, color=colour, hatch=hatch,
                            edgecolor="white", linewidth=0.5)  # fmt: skip
                    left += step[part]
        ax.set_title(f"{title} ({len(chosen)} steps)")
        ax.set_xlabel("seconds from the first step shown")
        ax.set_yticks(sorted(rows["rank"].unique()))
        ax.set_yticklabels([f"rank {r}" for r in sorted(rows["rank"].unique())])
        ax.invert_yaxis()
    axes[0].set_ylabel("worker")
    handles = [Patch(facecolor=c, hatch=h, edgecolor="white", label=label)
               for label, c, h in _PARTS.values()]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False)
    fig.suptitle(f"Every step waits for the slowest worker\n{source}", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def plot_time_cost(table: pd.DataFrame, source: str, target: float, prices_note: str) -> Figure:
    """Seconds against dollars to reach ``target`` accuracy: one point per setup and global
    batch (``helpers.experiments.cost.cost_table``), setups by colour, batches labelled.
    Points that never reached the target are left out, and said so. ``source``, the last line
    of the title, says what was measured and what computed."""
    reached = table[table["seconds"].map(math.isfinite)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, (setup, rows) in enumerate(reached.groupby("setup", sort=False)):
        ax.scatter(rows["seconds"], rows["usd"] * 1e6, s=50, color=f"C{i}", label=setup)
        for k, (_, row) in enumerate(rows.iterrows()):  # batches alternate above and below:
            # two batches of a setup can take the same time and cost, and their labels overlap
            ax.annotate(f"B={row['global_batch']}", (row["seconds"], row["usd"] * 1e6),
                        textcoords="offset points", xytext=(5, 4 if k % 2 == 0 else -11),
                        fontsize=8)  # fmt: skip
    missing = sorted(set(table["global_batch"]) - set(reached["global_batch"]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # 2, 5, 10, 20 rather than 2 x 10^0
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25"
                                               else ""))  # fmt: skip
    ax.set_xlabel(f"seconds of training to {target:.0%} test accuracy (log)")
    ax.set_ylabel("cost to get there (millionths of a dollar, log)")
    note = f"; not reached at B={', '.join(map(str, missing))}" if missing else ""
    ax.set_title(f"Time against cost, one point per setup and global batch{note}\n"
                 f"{prices_note}\n{source}", fontsize=9)  # fmt: skip
    ax.legend(title="setup (workers x threads)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_slowdown(
    slow: pd.DataFrame,
    samples: np.ndarray,
    banner: str,
    probabilities: tuple[float, ...] = (0.001, 0.01, 0.05),
) -> Figure:
    """Left: the expected slowest of N workers' compute times over one worker's mean
    (``straggler.slowdown_table``), beside ``mean + sd sqrt(2 ln N)``, which bounds the expected
    maximum of N Gaussian times of the same mean and spread, and the ceiling a finite sample
    sets (its largest time). Right: the share of
    steps that any of N workers slows, each slowed independently with probability ``p``."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    mean, sd, n = float(np.mean(samples)), float(np.std(samples)), slow["workers"].to_numpy()
    left.plot(n, slow["slowdown"], "o-", label="expected slowest of N, from the measured times")
    gauss = 1 + sd / mean * np.sqrt(2 * np.log(np.maximum(n, 1)))
    left.plot(n, gauss, "--", color="grey",
              label="bound for Gaussian times: mean + sd sqrt(2 ln N)")  # fmt: skip
    left.axhline(float(np.max(samples)) / mean, color="C3", ls=":",
                 label=f"largest of the {len(samples)} measured times")  # fmt: skip
    left.set(xscale="log", xlabel="workers N", ylabel="slowest worker's compute / mean compute",
             title=f"A synchronous step waits for its slowest worker\n{banner}")  # fmt: skip
    left.legend(fontsize=8, loc="upper left")
    worlds = np.unique(np.geomspace(1, 1024, 60).astype(int))
    for p in probabilities:
        right.plot(worlds, 1 - (1 - p) ** worlds, label=f"each worker slowed at {p:.1%} of steps")
    right.set(xscale="log", xlabel="workers N", ylabel="steps slowed", ylim=(0, 1.02),
              title="Rare hiccups become the common case (model)")  # fmt: skip
    right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    right.legend(fontsize=8, loc="upper left")
    return fig


def plot_miscounted(rows: list[dict], source: str) -> Figure:
    """The test windows ``DistributedSampler`` counts twice (padding) or never (``drop_last``)
    against the world size: the rows of ``evaluation.padding_table``, under their bound of
    ``workers - 1``. Those rows are the sampler's arithmetic, not a measurement: ``source``, the
    line under the title, should say so."""
    table = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    w = table["workers"]
    ax.plot(w, w - 1, ":", color="grey", label="workers - 1 (the most either can be)")
    ax.plot(w, table["counted_twice"], "o-", ms=3, color="C1", label="counted twice (padding)")
    ax.plot(w, table["dropped_with_drop_last"], "s-", ms=3, color="C3",
            label="never counted (drop_last=True)")  # fmt: skip
    ax.set_xlabel("workers evaluating")
    ax.set_ylabel("test windows")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"What a sharded evaluation miscounts\n{source}", fontsize=10)
    return fig


def plot_runs_to_target(runs: pd.DataFrame, target: float, n_samples: int, source: str) -> Figure:
    """One panel per global batch (``helpers.experiments.cost.runs_to_target``): each seed's
    test accuracy at every evaluation (thin), its moving average (thick) and its count (a dot,
    where the average went above ``target`` for good), against epochs of ``n_samples``; one
    legend below for every kind of line. ``source``: the line under the title."""
    batches = sorted(runs["global_batch"].unique())
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.8), sharey=True,
                             squeeze=False)  # fmt: skip
    for ax, batch in zip(axes[0], batches, strict=True):
        for k, run in enumerate(runs[runs["global_batch"] == batch].itertuples()):
            epochs = np.asarray(run.marks) * batch / n_samples
            ax.plot(epochs, run.accuracies, color=f"C{k}", alpha=0.35, linewidth=0.8)
            smoothed = moving_average(run.accuracies)  # from the WINDOW-th evaluation on
            ax.plot(epochs[WINDOW - 1 :], smoothed, color=f"C{k}", linewidth=2,
                    label=f"seed {run.seed}")  # fmt: skip
            if math.isfinite(run.steps):
                at = list(run.marks).index(run.steps)
                ax.plot(epochs[at], smoothed[at - WINDOW + 1], "o", color=f"C{k}",
                        markeredgecolor="black")  # fmt: skip
        ax.axhline(target, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"global batch {batch}", fontsize=9)
        ax.set_xlabel("epochs")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    seeds, labels = axes[0][0].get_legend_handles_labels()  # the thick lines, one per seed
    kinds = [  # drawn in grey here: each seed's lines are in its own colour
        Line2D([], [], color="grey", alpha=0.35, linewidth=0.8, label="each evaluation"),
        Line2D([], [], color="grey", linewidth=2, label=f"mean of the last {WINDOW}"),
        Line2D([], [], color="grey", marker="o", linestyle="", markeredgecolor="black",
               label=f"the count: from here the mean stayed at or above {target:.0%}"),
        Line2D([], [], color="black", linestyle="--", linewidth=1, label=f"target {target:.0%}"),
    ]  # fmt: skip
    rows = 1 if len(batches) > 2 else 2  # the kinds' row does not fit under two panels
    fig.legend(handles=seeds, labels=labels, loc="lower center", bbox_to_anchor=(0.5, 0.06 * rows),
               ncol=len(seeds), fontsize=8, frameon=False)  # fmt: skip
    fig.legend(handles=kinds, loc="lower center", ncol=len(kinds) // rows, fontsize=8,
               frameon=False)  # fmt: skip
    fig.suptitle(f"Each seed's test accuracy on the way to {target:.0%}, and where it counts\n"
                 f"{source}", fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0.06 * rows + 0.08, 1, 1))
    return fig
