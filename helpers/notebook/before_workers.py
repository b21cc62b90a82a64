"""Figures for notebook 05's first section, before adding workers: where one worker's step goes
(tables from ``helpers.experiments.data_pipeline``), and the baselines drawn into the speed-up
figure (``plotting.plot_scaling``, tables from ``helpers.experiments.single_device``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from helpers.experiments.data_pipeline import REGIONS
from helpers.experiments.scaling import PLAIN
from helpers.experiments.single_device import add_baselines

PARTS = (*REGIONS, "other")
_PART_COLOURS = {"data wait": "C3", "forward": "C0", "backward": "C1", "optimizer": "C2",
                 "other": "0.7"}  # fmt: skip


def plot_step_breakdown(table: pd.DataFrame, banner: str) -> Figure:
    """Each run of ``data_pipeline.pipeline_table`` as a row: left, its milliseconds per step (log
    scale: the runs differ a hundredfold); right, the step split by region, as shares. Not
    stacked on the log axis, where a segment's length would not be its share. Oversubscribed runs
    are marked in their label."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.55 * len(table) + 2.2), sharey=True)
    labels = [
        run + (" (OVERSUBSCRIBED)" if over else "")
        for run, over in zip(table["run"], table["oversubscribed"], strict=True)
    ]
    y = range(len(table))
    left.barh(y, table["step_ms"], color="0.55")
    share_edge = pd.Series(0.0, index=table.index)
    for part in PARTS:
        share = table[f"{part} ms"] / table["step_ms"]
        right.barh(y, share, left=share_edge, color=_PART_COLOURS[part], label=part)
        share_edge = share_edge + share
    for i, ms in enumerate(table["step_ms"]):
        left.text(ms * 1.1, i, f"{ms:,.1f} ms", va="center", fontsize=8)
    left.set_xscale("log")
    left.set_xlim(min(0.5, table["step_ms"].min() / 2), table["step_ms"].max() * 6)
    left.set_yticks(list(y), labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("milliseconds per step (log scale)")
    right.set_xlim(0, 1)
    right.set_xlabel("share of the step, by profiled region")
    right.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    handles, names = right.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=len(PARTS))
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    batches = ", ".join(str(b) for b in sorted(table["global_batch"].unique()))
    fig.suptitle(f"Where a training step's time goes (torch.profiler, rank 0; global batch "
                 f"{batches})\n{banner}", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.05, 1, 1))  # room for the legend below
    return fig


def draw_baselines(
    ax: Axes, measured: pd.DataFrame, baselines: pd.DataFrame, metric: str, colours: dict
) -> float:
    """Draw the single device (black squares) and the workers that never communicate (their
    world's colour, dotted) on the speed-up or efficiency axes; returns the highest value drawn."""
    both = add_baselines(measured, baselines)
    for layout, group in both.groupby("layout"):
        group = group.sort_values("global_batch")
        world, threads = int(group["world"].iloc[0]), int(group["threads_per_worker"].iloc[0])
        if layout == "single device":
            style = {"color": "black", "marker": "s", "ls": "-"}
            label = f"measured, 1 worker x {threads} threads (every core)"
            if "beside_seconds" in group and group["beside_seconds"].notna().all():
                label += ", over its partner"  # the same training on fewer threads, beside it
            label += ", per core" if metric == "efficiency" else ""
        else:
            style = {"color": colours.get(world), "marker": "x", "ls": ":"}
            label = f"measured, {world} workers never communicating"
        ax.plot(group["global_batch"], group[metric], label=label, **style)
    return float(both[metric].max())


def plot_layouts(table: pd.DataFrame, baselines: pd.DataFrame, banner: str) -> Figure:
    """Samples per second against the global batch for every layout timed: the sweep's plain
    1-worker baseline and DDP's larger world sizes (``scaling.sweep``), one worker on every core,
    workers that never communicate. A rate, not a speed-up, so that a slow 1-worker run shows as
    itself instead of lifting every ratio."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for world, group in table.groupby("world"):
        group = group.sort_values("global_batch")
        layout = PLAIN if world == 1 else "DDP"  # the sweep's baseline trains the plain model
        label = f"{layout}, {world} worker(s) x {group['threads_per_worker'].iloc[0]} thread(s)"
        ax.plot(group["global_batch"], group["samples_per_s"], "o-", color=f"C{world - 1}",
                label=label)  # fmt: skip
    for layout, group in baselines.groupby("layout"):
        group = group.sort_values("global_batch")
        world, threads = int(group["world"].iloc[0]), int(group["threads_per_worker"].iloc[0])
        single = world == 1
        ax.plot(group["global_batch"], group["samples_per_s"], "s-" if single else "x:",
                color="black" if single else f"C{world - 1}",
                label=f"{layout}, {world} worker(s) x {threads} thread(s)")  # fmt: skip
        if single and "beside_seconds" in group:  # its partner, trained right after it
            rate = group["timed_steps"] * group["global_batch"] / group["beside_seconds"]
            ax.plot(group["global_batch"], rate, "o--", color="C0", mfc="none",
                    label=f"{PLAIN}, 1 worker x {int(group['beside_threads'].iloc[0])} thread(s), "
                          "in the single device's launch")  # fmt: skip
    batches = sorted(table["global_batch"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_ylim(0, 1.1 * max(table["samples_per_s"].max(), baselines["samples_per_s"].max()))
    ax.set(xlabel="global batch size (samples per step, all workers together)",
           ylabel="training samples per second")  # fmt: skip
    ax.set_title(f"Every layout's rate, one training per point\n{banner}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
