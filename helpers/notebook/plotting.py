"""Plots shared by the notebooks: one function per kind of figure, axes labelled with their
units, a title that names the data the result came from. Each returns its figure; the notebook
calls ``plt.show()``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, PercentFormatter

from helpers.dist.comm_model import AlphaBeta
from helpers.experiments.scaling import (
    GRADIENT_BYTES,
    ComputeModel,
    batch_for_speedup,
    predict_step_seconds,
)
from helpers.notebook.before_workers import draw_baselines

# --------------------------------------------------------------------------- notebook 05: scaling

WORLD_COLOURS = {1: "C0", 2: "C1", 4: "C2", 8: "C3", 16: "C4"}
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
            color=WORLD_COLOURS.get(world),
            label=f"measured, {world} workers",
        )
        if metric == "speedup":
            ax.axhline(
                world, color=WORLD_COLOURS.get(world), lw=1, ls=":", label=f"ideal, {world}x"
            )
    highest = 0.0
    if baselines is not None:
        highest = draw_baselines(ax, measured, baselines, metric, WORLD_COLOURS)
    for world, group in predicted[predicted["world"] > 1].groupby("world"):
        group = group.sort_values("global_batch")
        ax.plot(
            group["global_batch"],
            group[metric],
            "--",
            color=WORLD_COLOURS.get(world),
            label=f"model, {world} workers",
        )
    for world, group in published.groupby("world"):
        ax.plot(
            group["global_batch"],
            group[metric],
            "*",
            markersize=13,
            markerfacecolor="none",
            color=WORLD_COLOURS.get(world),
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


def plot_step_model(
    table: pd.DataFrame,
    compute: ComputeModel,
    comms: dict[int, AlphaBeta],
    banner: str,
    nbytes: int = GRADIENT_BYTES,
) -> Figure:
    """The model of notebook 05 beside what it was built from: one worker's measured step times
    and the fitted ``c0 + c1 B``; for each world ``N`` in ``comms``, DDP's measured step times
    and the model's ``c0 + c1 B / N + a``, with the all-reduce ``a`` alone as a flat line. Where
    the N-worker line crosses one worker's, the speed-up is 1 (marked). ``table`` needs world,
    global_batch and step_seconds (DDP's rows)."""
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    batches = np.geomspace(table["global_batch"].min() / 2, table["global_batch"].max() * 2, 100)
    one = table[table["world"] == 1].sort_values("global_batch")
    ax.plot(one["global_batch"], one["step_seconds"] * 1e3, "o", color=WORLD_COLOURS[1],
            label="1 worker (plain model), measured")  # fmt: skip
    ax.plot(batches, compute.predict(batches) * 1e3, "-", color=WORLD_COLOURS[1],
            label="1 worker, fitted c0 + c1 B")  # fmt: skip
    for world, comm in comms.items():
        colour = WORLD_COLOURS.get(world)
        runs = table[table["world"] == world].sort_values("global_batch")
        ax.plot(runs["global_batch"], runs["step_seconds"] * 1e3, "o", color=colour,
                label=f"{world} workers with DDP, measured")  # fmt: skip
        ax.plot(batches, predict_step_seconds(compute, comm, batches, world, nbytes) * 1e3, "--",
                color=colour, label=f"{world} workers, model c0 + c1 B / {world} + a")  # fmt: skip
        a = float(comm.predict(nbytes))
        ax.axhline(a * 1e3, color=colour, lw=1, ls=":",
                   label=f"a: a step's all-reduce of {nbytes / 1e6:.1f} MB, modelled")  # fmt: skip
        even = batch_for_speedup(compute, comm, world, 1.0, nbytes)
        if np.isfinite(even):
            ax.plot(even, compute.predict(even) * 1e3, "s", color=colour, mfc="white", ms=9,
                    label=f"model: {world} workers break even at {even:,.0f}")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="global batch (samples)", ylabel="time per step (ms)",
           title=f"One step's time: measured, and the model built from one worker\n{banner}")
    ax.legend(fontsize=8, loc="upper left")
    return fig


# ------------------------------------------------------ notebooks 03 and 04: zeros on a log scale


def zero_floor(values: np.ndarray | list[float], fallback: float) -> float:
    """Where a log axis draws exact zeros: ten times below the smallest positive value
    (``fallback`` if none is positive), since a log scale has no 0."""
    positive = np.asarray(values, dtype=float)
    positive = positive[positive > 0]
    return float(positive.min()) / 10 if positive.size else fallback


def label_zero_floor(ax: plt.Axes, floor: float) -> None:
    """Put ``ax`` on a log scale whose bottom tick, at ``floor``, reads "0 (same bits)": the
    points drawn there are exact zeros, not tiny values. The decades above it keep their
    labels; minor ticks go, so that none sits between the floor and the first decade."""
    ax.set_yscale("log")
    top = ax.get_ylim()[1]
    decades = [d for d in range(int(np.floor(np.log10(top))), -400, -1) if 10.0**d >= 3 * floor]
    ticks = [floor, *(10.0**d for d in reversed(decades))]
    ax.set_yticks(ticks, ["0 (same bits)", *(f"$10^{{{d}}}$" for d in reversed(decades))])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(floor / 2, top)
    ax.axhline(floor, color="grey", ls=":", lw=1)


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


def plot_mistake_gaps(runs: dict[tuple[str, str], dict], atol: float, banner: str) -> Figure:
    """Notebook 03's mistakes, step by step, from each run's ``GapProbe`` report (rank 0's,
    keyed by (mistake, sync)), on a log scale: left, the largest difference between the
    replicas after every step; right, the largest difference from the reference's weights every
    few steps, with the tolerance that still calls a run the same training. A gap of 0 (the same
    bits) is drawn on the bottom tick, labelled 0, and the runs that stay there, whose lines
    would hide one another, are named beside it."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    values = [v for r in runs.values() for v in [*r["replica_gaps"], *r["reference_gaps"].values()]]
    floor = zero_floor(values, atol / 1e6)
    colours = {mistake: f"C{i}" for i, mistake in enumerate(dict.fromkeys(m for m, _ in runs))}
    styles = {"none": ":", "allreduce": "--", "ddp": "-"}
    always_zero: dict[plt.Axes, list[str]] = {left: [], right: []}
    for (mistake, sync), report in runs.items():
        style = dict(color=colours[mistake], ls=styles.get(sync, "-."), lw=1.4,
                     label=f"{mistake}, sync={sync}")  # fmt: skip
        gaps = np.asarray(report["replica_gaps"], dtype=float)
        left.plot(np.arange(1, len(gaps) + 1), np.where(gaps > 0, gaps, floor), **style)
        steps = sorted(report["reference_gaps"])
        reference = np.array([report["reference_gaps"][s] for s in steps], dtype=float)
        right.plot(steps, np.where(reference > 0, reference, floor), marker=".", **style)
        for ax, drawn in ((left, gaps), (right, reference)):
            if drawn.size and not drawn.any():
                always_zero[ax].append(f"{mistake}, sync={sync}")
    right.axhline(atol, color="black", ls="-", lw=0.8, label=f"same training: within {atol:g}")
    for ax in (left, right):
        label_zero_floor(ax, floor)
        ax.set_xlabel("step")
        if always_zero[ax]:
            ax.annotate("at 0 at every step:\n" + "\n".join(always_zero[ax]), (0.02, floor),
                        xycoords=("axes fraction", "data"), xytext=(0, 6),
                        textcoords="offset points", fontsize=7, va="bottom")
    left.set_ylabel("largest weight difference")
    left.set_title("between the two replicas, after every step", fontsize=10)
    right.set_title("from the reference's weights (any replica)", fontsize=10)
    left.legend(fontsize=7, loc="center right")
    handles, labels = right.get_legend_handles_labels()
    right.legend(handles[-1:], labels[-1:], fontsize=7, loc="center right")
    fig.suptitle(f"Two mistakes x three kinds of sync, weight gaps step by step\n{banner}",
                 fontsize=10)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------- notebook 02: call times and the tick


def plot_allreduce_times(
    wakeups: pd.DataFrame, banner: str, top_ms: float = 16.0, width_ms: float = 0.25
) -> Figure:
    """Histogram of each condition's all-reduce times from ``probe_wakeups``'s table (its rows,
    its ``attrs["times"]`` in seconds and ``attrs["hz"]``), one outline per condition, in bins of
    ``width_ms`` up to ``top_ms``. Every slower call counts in one last bin, shaded and labelled
    "≥16" (``top_ms``), so that slow outliers stay visible instead of falling off the axis.
    Dotted lines mark the multiples of the timer tick (none where ``hz`` is not known)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    overflow = 4 * width_ms  # the last bin, wider so that it can be seen and labelled
    edges = np.append(np.arange(0, top_ms + width_ms / 2, width_ms), top_ms + overflow)
    for row, times in zip(wakeups.itertuples(), wakeups.attrs["times"], strict=True):
        ms = np.asarray(times, dtype=float) * 1e3
        counts, _ = np.histogram(np.minimum(ms, top_ms), bins=edges)  # the last bin: top_ms and up
        ax.stairs(counts, edges, label=f"cores: {row.cores}, competitor: {row.competitor}")
    ax.axvspan(top_ms, top_ms + overflow, color="grey", alpha=0.15, lw=0)
    hz = wakeups.attrs.get("hz")
    for tick in np.arange(1, int(top_ms * hz / 1e3) + 1) * 1e3 / hz if hz else []:
        ax.axvline(tick, color="grey", linestyle=":", linewidth=1)
    numbers = np.arange(0, top_ms, 2)
    ax.set_xticks([*numbers, top_ms + overflow / 2], [*(f"{v:g}" for v in numbers), f"≥{top_ms:g}"])
    ax.set_xlim(0, top_ms + overflow)
    ax.set_xlabel("all-reduce time, slowest rank (ms); dotted: multiples of the timer tick")
    ax.set_ylabel("calls")
    ax.set_title(banner, fontsize=10)
    ax.legend(fontsize=8)
    return fig


# --------------------------------------------------------------------------- notebook 08: sharding


def plot_memory(table: pd.DataFrame, banner: str, source: str) -> Figure:
    """Per run, the MB of parameters, gradients and optimizer state a worker holds (stacked, read
    from its tensors) beside the growth of its RSS while training, stacked by part: the setup
    (imports, the model, its wrapper), the first step, the later steps' peak. Table from
    ``helpers.experiments.sharding.memory_table``; ``source`` says where both were read, the
    legend, outside the bars, which bar is which."""
    fig, ax = plt.subplots(figsize=(10.5, 4.0))
    x = range(len(table))
    bottom = pd.Series(0.0, index=table.index)
    for i, part in enumerate(("parameters", "gradients", "optimizer_state")):
        ax.bar([p - 0.2 for p in x], table[part], 0.4, bottom=bottom, color=f"C{i}",
               label=f"left bar, tensors: {part.replace('_', ' ')}")
        bottom += table[part]
    bottom = pd.Series(0.0, index=table.index)
    parts = {"setup_growth": ("0.85", "setup (imports, model, wrapper)"),
             "first_step_growth": ("0.6", "first step"),
             "later_steps_growth": ("0.35", "later steps' peak")}  # fmt: skip
    for column, (grey, name) in parts.items():
        height = table[column].fillna(0.0)
        ax.bar([p + 0.2 for p in x], height, 0.4, bottom=bottom, color=grey,
               label=f"right bar, RSS growth: {name}")
        bottom += height
    ax.set_xticks(list(x), table.index, fontsize=9)
    ax.set_ylabel("MB per worker (rank 0)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"What a worker holds: its tensors against its RSS growth\n{source}\n{banner}",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    return fig


def plot_zero_stages(param_bytes: float, optimizer: str, world_sizes: list[int],
                     source: str, budget: float | None = None) -> Figure:  # fmt: skip
    """One panel per world size: the MB a worker holds at each ZeRO stage (0 is DDP), stacked
    by parameters, gradients and optimizer state, from ``memory.expected_bytes``: a model's
    arithmetic, which the measured bars of ``plot_state_held`` then test. A memory budget in MB,
    if given, is drawn across every panel (dashed): the stages whose bars stay below it fit."""
    from helpers.experiments.memory import MB, STAGES, expected_bytes

    fig, axes = plt.subplots(1, len(world_sizes), figsize=(3.2 * len(world_sizes) + 1.2, 3.8),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, n in zip(axes[0], world_sizes, strict=True):
        held = [expected_bytes(param_bytes, optimizer, n, stage) for stage in STAGES]
        bottom = np.zeros(len(held))
        for i, part in enumerate(("parameters", "gradients", "optimizer_state")):
            values = np.array([h[part] / MB for h in held])
            ax.bar(range(len(held)), values, 0.6, bottom=bottom, color=f"C{i}",
                   label=part.replace("_", " "))  # fmt: skip
            bottom += values
        for x, total in enumerate(bottom):
            ax.annotate(f"{total:.1f}", (x, total), xytext=(0, 2), textcoords="offset points",
                        ha="center", fontsize=8)  # fmt: skip
        ax.set_xticks(range(len(held)), ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"], fontsize=8)
        ax.set_title(f"{n} worker{'s' if n > 1 else ''}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        if budget is not None:
            ax.axhline(budget, color="C3", linestyle="--", linewidth=1,
                       label=f"a budget of {budget:.0f} MB")  # fmt: skip
    axes[0, 0].set_ylabel("MB per worker")
    axes[0, 0].set_ylim(0, 1.45 * max(axes[0, 0].get_ylim()[1], budget or 0))
    axes[0, -1].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"What a worker holds at each ZeRO stage, with {optimizer}\n{source}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def plot_state_held(
    table: pd.DataFrame, expected: pd.Series, banner: str, title: str,
    budget: float | None = None,
) -> Figure:  # fmt: skip
    """Per run, the MB of parameters, gradients and optimizer state a worker holds, read from its
    tensors (stacked), beside what the arithmetic expects for that wrapping and world size (a
    black bar's outline), and a memory budget if given (dashed): the measurement and the
    prediction on one axis. ``table`` from ``helpers.experiments.sharding.memory_table``,
    ``expected`` MB per run on the same index."""
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    x = list(range(len(table)))
    bottom = pd.Series(0.0, index=table.index)
    for i, part in enumerate(("parameters", "gradients", "optimizer_state")):
        ax.bar(x, table[part], 0.5, bottom=bottom, color=f"C{i}",
               label=f"{part.replace('_', ' ')} (measured)")
        bottom += table[part]
    ax.bar(x, expected.loc[table.index], 0.62, fill=False, edgecolor="black", linewidth=1.2,
           label="expected: parameter bytes x copies / sharding")
    for p, total in zip(x, bottom, strict=True):
        ax.annotate(f"{total:.0f} MB", (p, total), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8)
    if budget is not None:
        ax.axhline(budget, color="C3", linestyle="--", linewidth=1,
                   label=f"a budget of {budget:.0f} MB")
    ax.set_xticks(x, table.index, fontsize=9)
    ax.set_ylabel("MB per worker (rank 0)")
    ax.set_ylim(0, 1.5 * max(bottom.max(), expected.max(), budget or 0))
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{title}\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_traffic(table: pd.DataFrame, banner: str) -> Figure:
    """Per run (rows), the MB each worker sends in one training step, stacked by collective
    (columns), on a ring: what a bandwidth-optimal algorithm sends for the calls counted.
    Table from ``helpers.experiments.sharding.traffic_by_kind``."""
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    x = list(range(len(table)))
    bottom = pd.Series(0.0, index=table.index)
    for i, kind in enumerate(table.columns):
        ax.bar(x, table[kind], 0.5, bottom=bottom, color=f"C{i + 3}", label=kind)
        bottom += table[kind]
    for p, total in zip(x, bottom, strict=True):
        ax.annotate(f"{total / bottom.iloc[0]:.2f}x", (p, total), xytext=(0, 3),
                    textcoords="offset points", ha="center", fontsize=9)
    ax.set_xticks(x, table.index, fontsize=9)
    ax.set_ylabel("MB each worker sends per step (ring)")
    ax.set_ylim(0, 1.2 * bottom.max())
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"One step's collectives, counted, as a ring sends them\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig

