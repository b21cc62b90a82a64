"""Plots shared by the notebooks: one function per kind of figure, axes labelled with their
units, a title that names the data the result came from. Each returns its figure; the notebook
calls ``plt.show()``."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from helpers.notebook.before_workers import draw_baselines

# --------------------------------------------------------------------------- notebook 05: scaling

_WORLD_COLOURS = {1: "C0", 2: "C1", 4: "C2", 8: "C3", 16: "C4"}
_SCALING_METRICS = {
    "speedup": ("Speed-up over 1 worker", "speed-up over 1 worker (x)"),
    "efficiency": ("Scaling efficiency", "efficiency = speed-up / workers (%)"),
}


def plot_scaling(
    measured: pd.DataFrame,
    predicted: pd.DataFrame,
    published: pd.DataFrame,
    metric: str,
    banner: str,
    published_label: str = "published",
    baselines: pd.DataFrame | None = None,
) -> Figure:
    """Speed-up or efficiency (``metric``) against the global batch on a log-2 axis, one colour
    per world size: measured points joined by lines, the model's prediction dashed, published
    reference points as hollow stars; with ``baselines`` (``single_device.baseline_runs``), one
    worker on every core and workers that never communicate. Tables need world, global_batch
    and the metric column."""
    if metric not in _SCALING_METRICS:
        raise ValueError(f"metric must be one of {sorted(_SCALING_METRICS)}, got {metric!r}")
    name, ylabel = _SCALING_METRICS[metric]
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for world, group in measured[measured["world"] > 1].groupby("world"):
        group = group.sort_values("global_batch")
        ax.plot(
            group["global_batch"],
            group[metric],
            "o-",
            color=_WORLD_COLOURS.get(world),
            label=f"measured, {world} workers",
        )
        if metric == "speedup":
            ax.axhline(
                world, color=_WORLD_COLOURS.get(world), lw=1, ls=":", label=f"ideal, {world}x"
            )
    highest = 0.0
    if baselines is not None:
        highest = draw_baselines(ax, measured, baselines, metric, _WORLD_COLOURS)
    for world, group in predicted[predicted["world"] > 1].groupby("world"):
        group = group.sort_values("global_batch")
        ax.plot(
            group["global_batch"],
            group[metric],
            "--",
            color=_WORLD_COLOURS.get(world),
            label=f"model, {world} workers",
        )
    for world, group in published.groupby("world"):
        ax.plot(
            group["global_batch"],
            group[metric],
            "*",
            markersize=13,
            markerfacecolor="none",
            color=_WORLD_COLOURS.get(world),
            label=f"{published_label}, {world} workers (not measured here)",
        )
    reference = "1 worker (break-even)" if metric == "speedup" else "ideal (100%)"
    ax.axhline(1.0, color="grey", lw=1, label=reference)
    batches = sorted(set(measured["global_batch"]) | set(published["global_batch"]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    tops = [measured[metric].max(), predicted[metric].max(), published[metric].max(), highest]
    if metric == "speedup":
        tops.append(measured["world"].max())
    ax.set_ylim(0, 1.1 * max(1.0, *tops))
    if metric == "efficiency":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("global batch size (samples per step, all workers together)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{name} against global batch size\n{banner}", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith(published_label))
    ax.legend(  # two columns, the long published labels together in the second one
        [handles[i] for i in order],
        [labels[i] for i in order],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------- notebook 03: DDP on HAR


def plot_class_balance(balance: pd.DataFrame, banner: str) -> Figure:
    """Samples per class, one panel per split (columns of ``balance``, classes as its index),
    each bar labelled with its share of the split."""
    fig, axes = plt.subplots(1, len(balance.columns), figsize=(10, 3.6), sharey=True, squeeze=False)
    for ax, split in zip(axes[0], balance.columns, strict=True):
        counts = balance[split]
        bars = ax.barh(list(balance.index), counts, color="tab:blue")
        ax.bar_label(bars, labels=[f"{c / counts.sum():.1%}" for c in counts], padding=2, size=8)
        ax.set_title(f"{split}: {counts.sum():,} samples", fontsize=10)
        ax.set_xlabel("samples")
        ax.set_xlim(0, counts.max() * 1.2)
    axes[0][0].invert_yaxis()  # first class on top
    fig.suptitle(f"Class balance per split\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_replica_accuracies(
    table: pd.DataFrame, reference_accuracy: float, banner: str, world: int = 2
) -> Figure:
    """Test accuracy of every replica for each (mistake, sync) row of
    ``helpers.experiments.replicas.mistakes_table``, the reference run's accuracy as a dashed
    line: replicas that agree give bars of equal height, the same training gives bars on the
    line."""
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{mistake}\nsync={sync}" for mistake, sync in table.index]
    width = 0.8 / world
    for rank in range(world):
        xs = [i + (rank - (world - 1) / 2) * width for i in range(len(table))]
        ax.bar(xs, table[f"accuracy {rank} %"], width, label=f"replica on rank {rank}")
    ax.axhline(
        100 * reference_accuracy,
        color="black",
        ls="--",
        lw=1,
        label=f"reference run ({100 * reference_accuracy:.2f}%)",
    )
    ax.set_xticks(range(len(table)), labels, fontsize=8)
    low = min(table[f"accuracy {r} %"].min() for r in range(world))
    ax.set_ylim(max(0.0, low - 5), 100)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Each replica's test accuracy, {world} workers\n{banner}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", ncols=world + 1)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- notebook 07: overlap


def plot_timelines(timelines: dict[str, pd.DataFrame], banner: str) -> Figure:
    """One training step on one worker per panel: a row for compute (forward, each layer's
    backward, the optimizer) and one for communication (each bucket's all-reduce), in
    milliseconds from the step's start. Tables from ``comm_engineering.timeline_table``."""
    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(9.0, 1.9 * len(timelines) + 0.6), squeeze=False
    )
    end = max(t["end_ms"].max() for t in timelines.values())
    for ax, (name, table) in zip(axes[:, 0], timelines.items(), strict=True):
        for y, row in enumerate(("communication", "compute")):
            parts = table[table["row"] == row].reset_index(drop=True)
            for k, part in parts.iterrows():
                colour = f"C{k % 10}" if row == "compute" else ("C3" if k % 2 else "C1")
                width = part["end_ms"] - part["start_ms"]
                ax.broken_barh([(part["start_ms"], width)], (y - 0.35, 0.7), color=colour)
                if width > 0.06 * end:
                    label = part["what"].replace("backward ", "bwd ")
                    ax.text(
                        part["start_ms"] + width / 2,
                        y,
                        label,
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white",
                    )
        ax.set_yticks([0, 1], ["communication", "compute"])
        ax.set_xlim(0, end * 1.02)
        ax.set_title(name, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("milliseconds from the start of the step (rank 0)")
    fig.suptitle(f"One training step: compute and communication\n{banner}", fontsize=10)
    return fig


# --------------------------------------------------------------------------- notebook 08: sharding


def plot_memory(table: pd.DataFrame, banner: str) -> Figure:
    """Per run, the MB of parameters, gradients and optimizer state a worker holds (stacked, read
    from its tensors) beside the growth of its peak RSS while training. Table from
    ``helpers.experiments.sharding.memory_table``."""
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    x = range(len(table))
    bottom = pd.Series(0.0, index=table.index)
    for i, part in enumerate(("parameters", "gradients", "optimizer_state")):
        ax.bar([p - 0.2 for p in x], table[part], 0.4, bottom=bottom, color=f"C{i}",
               label=part.replace("_", " "))
        bottom += table[part]
    ax.bar([p + 0.2 for p in x], table["peak_rss_growth"], 0.4, color="0.6",
           label="peak RSS growth while training")
    ax.set_xticks(list(x), table.index, fontsize=9)
    ax.set_ylabel("MB per worker (rank 0)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"What a worker holds: its tensors against its peak RSS\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------ notebook 07: techniques, summary


def plot_technique_speedups(
    measured: pd.DataFrame,
    model: pd.DataFrame,
    panels: dict[str, list[str]],
    banner: str,
    ceiling: pd.DataFrame | None = None,
    goal: tuple[int, float] | None = None,
    world: int = 2,
) -> Figure:
    """Speed-up of ``world`` workers over one against the global batch (log-2 axis), one panel
    per entry of ``panels`` (title: the variants it shows), one colour per variant, the same in
    every panel: measured points as markers, the model as a line. ``measured`` and ``model`` have
    columns variant, global_batch, speedup; ``ceiling`` (global_batch, speedup), the speed-up with
    communication free, is drawn dotted in every panel, and ``goal`` (global batch, speed-up) as
    a star."""
    from math import ceil, floor, log2

    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.0 * len(panels), 6.0), sharey=True, squeeze=False
    )
    colours = {}
    for names in panels.values():
        for name in names:
            colours.setdefault(name, f"C{len(colours) % 10}")
    tops = [float(world), measured["speedup"].max(), model["speedup"].max()]
    if ceiling is not None:
        tops.append(ceiling["speedup"].max())
    low, high = model["global_batch"].min(), model["global_batch"].max()
    powers = {2**k for k in range(ceil(log2(low)), floor(log2(high)) + 1)}
    batches = sorted(powers | {int(b) for b in measured["global_batch"]})
    for ax, (title, names) in zip(axes[0], panels.items(), strict=True):
        handles = []
        for name in names:
            colour = colours[name]
            line = model[model["variant"] == name].sort_values("global_batch")
            ax.plot(line["global_batch"], line["speedup"], "-", color=colour, lw=1.5)
            points = measured[measured["variant"] == name].sort_values("global_batch")
            ax.plot(points["global_batch"], points["speedup"], "o", color=colour, ms=7)
            handles.append(Line2D([], [], color=colour, marker="o", lw=1.5, label=name))
        if ceiling is not None:
            c = ceiling.sort_values("global_batch")
            handles += ax.plot(c["global_batch"], c["speedup"], ":", color="black", lw=1.5,
                               label="communication free (the ceiling)")  # fmt: skip
        if goal is not None:
            label = f"goal: {goal[1]:g}x at {goal[0]}"
            handles += ax.plot([goal[0]], [goal[1]], "*", color="black", ms=14,
                               markerfacecolor="none", label=label)  # fmt: skip
        handles.append(ax.axhline(1.0, color="grey", lw=1, label="1 worker (break-even)"))
        handles.append(ax.axhline(world, color="grey", lw=1, ls="--", label=f"ideal, {world}x"))
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_ylim(0, 1.1 * max(tops))
        ax.set_xlabel("global batch size (samples per step, all workers together)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13),
                  ncol=2)  # fmt: skip
    axes[0, 0].set_ylabel(f"speed-up of {world} workers over 1 (x)")
    fig.suptitle(
        f"Speed-up of {world} workers against global batch: points measured (medians), lines the "
        f"model\n{banner}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ notebooks 03 and 04: rounding


def plot_loss_curves(losses: dict[int, list[float]], banner: str) -> Figure:
    """The training loss at every step for each world size (top), and each world size's
    ``|loss - loss(1 worker)|`` on a log scale (bottom), beside the spacing of float32 numbers
    near the loss: curves that overlap on top can still be told apart, and the gap read against
    rounding. Steps where the two losses are the same bits have no point below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    one = np.asarray(losses[1])
    steps = np.arange(len(one))
    for world, curve in losses.items():
        top.plot(steps, curve, lw=1.2 if world == 1 else 0.8, ls="-" if world == 1 else "--",
                 color=_WORLD_COLOURS.get(world), label=f"{world} worker(s)")
        if world != 1:
            gap = np.abs(np.asarray(curve) - one)
            shown = gap > 0
            bottom.plot(steps[shown], gap[shown], ".", ms=4, color=_WORLD_COLOURS.get(world),
                        label=f"|loss({world} workers) - loss(1 worker)|")
    bottom.plot(steps, np.spacing(one.astype(np.float32)), color="grey", lw=1,
                label="spacing of float32 numbers near the loss (one rounding)")
    top.set_ylabel("training loss (global batch)")
    top.set_title(f"The same training on 1 and more workers, step by step\n{banner}", fontsize=10)
    top.legend(fontsize=8)
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("difference of the losses")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_weight_gaps(gaps: pd.DataFrame, atol: float, banner: str) -> Figure:
    """``helpers.experiments.ddp_script.tensor_gaps``: each run's largest weight difference from
    one process, one marker per parameter tensor, on a log scale, with the tolerance the grader
    uses ("to rounding") as a line. Identical bits (a gap of 0) are drawn on the bottom edge."""
    fig, ax = plt.subplots(figsize=(9, 4))
    positive = gaps.to_numpy()[gaps.to_numpy() > 0]
    floor = positive.min() / 10 if positive.size else atol / 1e6
    markers = "os^vDP"
    for j, tensor in enumerate(gaps.columns):
        xs = np.arange(len(gaps)) + (j - (len(gaps.columns) - 1) / 2) * 0.1
        ax.scatter(xs, gaps[tensor].clip(lower=floor), marker=markers[j % len(markers)], s=22,
                   label=tensor)
    ax.axhline(atol, color="black", ls="--", lw=1, label=f"tolerance, {atol:g}")
    ax.axhline(floor, color="grey", ls=":", lw=1, label="0: the same bits")
    ax.set_yscale("log")
    ax.set_xticks(range(len(gaps)), [textwrap.fill(name, 13) for name in gaps.index], fontsize=8)
    ax.set_ylabel("max |w - w(1 process)| in the tensor")
    ax.set_title(f"Each run's weights against one process's, tensor by tensor\n{banner}",
                 fontsize=10)
    ax.legend(fontsize=7, ncols=2, loc="upper left")
    fig.tight_layout()
    return fig
