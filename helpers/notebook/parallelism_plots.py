"""Notebook 09's figures: a pipeline step's timeline per stage, the bubble against the number of
micro-batches, the activations each schedule keeps, bf16 against float32 per instruction set,
stacked bars of the bytes each set-up sends per step (by collective), holds (by kind of state)
or saves for the backward, and the modelled step time of each parallelism against the link's
bandwidth.
Each returns its figure, titled with the source of its data (the link sweeps: captioned with
it); the notebook calls ``plt.show()``."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import ScaledTranslation


def plot_pipeline_timelines(steps: dict[str, dict[int, list[tuple]]], source: str) -> Figure:
    """One panel per schedule: a row per stage, a bar per forward (light) and backward (dark)
    of each micro-batch, numbered, in milliseconds from the step's first start, on the wall
    clock. ``steps``: a title to the stages' events (``pipeline.TimedStage.events``)."""
    fig, axes = plt.subplots(len(steps), 1, figsize=(9.0, 1.7 * len(steps) + 0.9), squeeze=False)
    for ax, (title, events) in zip(axes[:, 0], steps.items(), strict=True):
        origin = min(e[2] for evs in events.values() for e in evs)
        end = max(e[3] for evs in events.values() for e in evs) - origin
        for stage, evs in events.items():
            for kind, mb, start, stop, _ in evs:
                colour = "C0" if kind == "F" else "C3"
                left, width = 1e3 * (start - origin), 1e3 * (stop - start)
                ax.broken_barh([(left, width)], (stage - 0.38, 0.76), color=colour,
                               alpha=0.55 if kind == "F" else 0.85)  # fmt: skip
                if width > 0.025 * 1e3 * end:
                    ax.text(left + width / 2, stage, f"{kind}{mb}", ha="center", va="center",
                            fontsize=7, color="white")  # fmt: skip
        ax.set_yticks(sorted(events), [f"stage {s}" for s in sorted(events)])
        ax.invert_yaxis()
        ax.set_xlim(0, 1e3 * end * 1.01)
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("milliseconds from the first forward (wall clock); between the bars a "
                           "stage waits: the bubble, the sends, other programs")
    axes[0, 0].legend(handles=[Patch(color="C0", alpha=0.55, label="forward"),
                               Patch(color="C3", alpha=0.85, label="backward")],
                      fontsize=8, loc="upper right")  # fmt: skip
    fig.suptitle(f"One pipelined training step, 2 stages\n{source}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_bubble(table: pd.DataFrame, stages: int, source: str) -> Figure:
    """The pipeline's idle fraction against the micro-batches ``m``: measured on the wall clock
    and replayed from the CPU seconds (medians over repeats), per schedule, beside
    ``(p - 1) / (m + p - 1)`` and, where the table has it, the floor unequal stages leave.
    ``table``: ``pipeline.bubble_table`` as a DataFrame."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    m = np.unique(table["m"])
    grid = np.geomspace(m.min(), m.max(), 100)
    ax.plot(grid, (stages - 1) / (grid + stages - 1), "k-", lw=1,
            label=f"(p - 1) / (m + p - 1), p = {stages}: equal stages")  # fmt: skip
    for i, (name, rows) in enumerate(table.groupby("schedule")):
        rows = rows.sort_values("m")
        ax.plot(rows["m"], rows["pipeline idle (wall)"], "o--", color=f"C{i}",
                label=f"{name}: measured, wall clock")  # fmt: skip
        ax.plot(rows["m"], rows["pipeline idle (replayed)"], "s-", color=f"C{i}", mfc="none",
                label=f"{name}: replayed from CPU seconds")  # fmt: skip
        if "imbalance floor" in rows:
            ax.plot(rows["m"], rows["imbalance floor"], ":", color=f"C{i}", lw=1.5,
                    label=f"{name}: unequal stages' floor, 1 - sum / (p max)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(m, [str(v) for v in m])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches per step, m")
    ax.set_ylabel("idle fraction of the stages' time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"The pipeline bubble against the number of micro-batches\n{source}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def plot_link_sweeps(sweeps: dict[str, pd.DataFrame], source: str,
                     marks: dict[str, dict[str, float]] | None = None) -> Figure:  # fmt: skip
    """One panel per workload: the modelled step time of each strategy against the link's
    bandwidth (``parallelism_costs.sweep_links``), strategies that do not fit the memory left
    out; vertical lines at named bandwidths (``marks``: per panel title, name to bytes per
    second, so that a link is marked only where it exists)."""
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 5.2), squeeze=False,
                             layout="constrained")  # fmt: skip
    unknown = set(marks or {}) - set(sweeps)
    if unknown:
        raise ValueError(f"marks for panels not in sweeps: {sorted(unknown)}; key them by title")
    for ax, (title, sweep) in zip(axes[0], sweeps.items(), strict=True):
        for i, strategy in enumerate(sweep.columns):
            fits = sweep[strategy].notna().any()
            ax.plot(sweep.index / 1e9, sweep[strategy], color=f"C{i}",
                    label=strategy if fits else f"{strategy}: does not fit")  # fmt: skip
        for name, bandwidth in (marks or {}).get(title, {}).items():
            ax.axvline(bandwidth / 1e9, color="0.6", lw=0.8, ls=":")
            ax.text(bandwidth / 1e9, 0.02, f"{name} ", transform=ax.get_xaxis_transform(),
                    rotation=90, ha="right", va="bottom", fontsize=7, color="0.3")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link bandwidth (GB/s)")
        ax.set_ylabel("modelled step time (ms)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        # below the panel, where no curve or link label can hide it
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2)
    fig.suptitle("Which parallelism when: modelled step time per link", fontsize=10)
    fig.supxlabel("\n".join(textwrap.wrap(source, 150)), fontsize=8, color="0.3")  # a caption
    return fig


def plot_activation_peaks(peaks: pd.DataFrame, source: str) -> Figure:
    """One panel per stage: the MB of activations its autograd graph held at its peak, against
    the micro-batches ``m``, one line per schedule. ``peaks``: columns schedule, m, stage and
    "activations MB" (one row per schedule, m and stage)."""
    stages = sorted(peaks["stage"].unique())
    fig, axes = plt.subplots(1, len(stages), figsize=(4.4 * len(stages), 3.8), sharey=True,
                             squeeze=False)  # fmt: skip
    for ax, stage in zip(axes[0], stages, strict=True):
        for i, (name, rows) in enumerate(peaks[peaks["stage"] == stage].groupby("schedule")):
            rows = rows.sort_values("m")
            ax.plot(rows["m"], rows["activations MB"], "o-", color=f"C{i}", label=name)
        ms = np.unique(peaks["m"])
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(v) for v in ms])
        ax.set_xlabel("micro-batches per step, m")
        ax.set_title(f"stage {stage}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylim(0, 1.15 * peaks["activations MB"].max())
    axes[0, 0].set_ylabel("peak activations saved (MB)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Activations kept for the backward, per stage: GPipe against 1F1B\n{source}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def plot_bf16_ratios(table: pd.DataFrame, source: str) -> Figure:
    """Per processor and timed call (rows of ``bf16_ratios``' table), bf16's CPU time over
    float32's in interleaved pairs: a dot at the median, a whisker from the min to the max, on a
    log axis with 1 marked. Left of 1 bf16 is faster; a whisker across 1 leaves it undecided."""
    if table.empty or not {"bf16/float32", "min", "max", "pairs"} <= set(table.columns):
        raise ValueError("pass bf16_ratios' table: one row per processor and timed call, with "
                         "columns bf16/float32, min, max and pairs")  # fmt: skip
    fig, ax = plt.subplots(figsize=(8.0, 0.6 * len(table) + 2.1))
    y = np.arange(len(table))
    median, low, high = (table[c].to_numpy(dtype=float) for c in ("bf16/float32", "min", "max"))
    ax.errorbar(median, y, xerr=[median - low, high - median], fmt="o", color="C1", capsize=4,
                label="median, whisker min to max")  # fmt: skip
    for row, value, top, pairs in zip(y, median, high, table["pairs"], strict=True):
        ax.annotate(f"{value:.2f} ({pairs} pairs)", (top, row), xytext=(5, 0),
                    textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1, label="as fast as float32")
    labels = ["\n".join(str(part) for part in key) if isinstance(key, tuple) else str(key)
              for key in table.index]  # fmt: skip
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_ylim(len(table) - 0.5, -0.5)
    ax.set_xscale("log")
    left, right = min(low.min(), 1.0) / 1.5, max(high.max(), 1.0) * 4
    ax.set_xlim(left, right)
    ax.set_xlabel("bf16's CPU time / float32's, pair by pair (log scale; below 1: bf16 faster)")
    ax.grid(axis="x", alpha=0.3, which="both")
    # below the x label, half an inch under the axes whatever the figure's height: a dot can sit
    # in any corner (left of 1 where bf16 is faster), so no place inside the axes is always free
    below = ax.transAxes + ScaledTranslation(0, -0.5, fig.dpi_scale_trans)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below,
              ncols=2)  # fmt: skip
    source = textwrap.fill(source, 90)  # a long source would widen the figure, not the plot
    ax.set_title(f"bf16 against float32, timed in turn in one process\n{source}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_stacked_bars(table: pd.DataFrame, title: str, xlabel: str, source: str,
                      decimals: int = 3) -> Figure:  # fmt: skip
    """One horizontal bar per set-up (rows of ``table``), stacked by its columns (values >= 0 in
    the unit ``xlabel`` names), the total written at its end: which set-up costs most, and in
    what. A column that is zero in every row gets no legend entry."""
    if table.empty or (table < 0).any().any():
        raise ValueError("a stacked bar chart needs one row per set-up and values >= 0 in every "
                         "column")  # fmt: skip
    fig, ax = plt.subplots(figsize=(8.0, 0.45 * len(table) + 1.6))
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for i, kind in enumerate(table.columns):
        values = table[kind].to_numpy(dtype=float)
        if values.any():
            ax.barh(y, values, 0.6, left=left, color=f"C{i}", label=kind)
        left += values
    for row, total in zip(y, left, strict=True):
        ax.annotate(f"{total:.{decimals}f}", (total, row), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    ax.set_yticks(y, [str(label) for label in table.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.4 * left.max())  # room for the legend beside the longest bar
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"{textwrap.fill(title, 80)}\n{textwrap.fill(source, 90)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_bytes_sent(table: pd.DataFrame, title: str, source: str) -> Figure:
    """``plot_stacked_bars`` of the MB each worker sends per step (columns: the collectives),
    counted calls priced on a ring."""
    return plot_stacked_bars(table, title, "MB each worker sends per step (on a ring)", source)
