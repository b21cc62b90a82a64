"""Notebook 07's figures: DDP's all-reduce on a timeline beside backward, the techniques' speed-ups
against the model, what each DDP knob buys against the communication-free ceiling, what each
hook's communication costs and where it pays. Each returns its figure; the notebook calls
``plt.show()``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter, PercentFormatter

from helpers.experiments.comm_engineering.knobs import GLOO_THREADS, SILENT
from helpers.experiments.comm_engineering.timing import share_bracket

# --------------------------------------------------------------------------- notebook 07: overlap


def plot_timelines(timelines: dict[str, pd.DataFrame], banner: str) -> Figure:
    """One training step on one worker per panel: a row for compute (forward, each layer's
    backward, the optimizer) and one for communication (each bucket's all-reduce), in
    milliseconds from the step's start, one colour per part in every panel, named in the legend.
    Tables from ``comm_engineering.timeline_table``."""
    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(9.0, 1.9 * len(timelines) + 1.2), squeeze=False
    )
    end = max(t["end_ms"].max() for t in timelines.values())
    parts = [what for row in ("compute", "communication") for t in timelines.values()
             for what in t.loc[t["row"] == row, "what"]]  # fmt: skip
    colours = {what: f"C{k % 10}" for k, what in enumerate(dict.fromkeys(parts))}
    for ax, (name, table) in zip(axes[:, 0], timelines.items(), strict=True):
        for y, row in enumerate(("communication", "compute")):
            bars = table[table["row"] == row]
            # the buckets' all-reduces can run at once: each bucket in a lane of its own
            lanes = len(bars) if row == "communication" else 1
            for lane, part in enumerate(bars.itertuples()):
                width, height = part.end_ms - part.start_ms, 0.7 / lanes
                bottom = y + 0.35 - height * (lane % lanes + 1)
                ax.broken_barh([(part.start_ms, width)], (bottom, height), color=colours[part.what])
                if width > 0.06 * end:
                    ax.text(part.start_ms + width / 2, bottom + height / 2,
                            part.what.replace("backward ", "bwd "), ha="center", va="center",
                            fontsize=7, color="white")  # fmt: skip
        ax.set_yticks([0, 1], ["communication", "compute"])
        ax.set_xlim(0, end * 1.02)
        ax.set_title(name, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("milliseconds from the start of the step (rank 0)")
    handles = [Patch(color=colour, label=what) for what, colour in colours.items()]
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=min(len(handles), 6))
    fig.suptitle(f"One training step: compute and communication\n{banner}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below the panels
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
            ax.plot(points["global_batch"], points["speedup"], "o", color=colour, ms=7, zorder=4)
            handles.append(Line2D([], [], color=colour, marker="o", lw=1.5, label=name))
        if ceiling is not None:
            c = ceiling.sort_values("global_batch")
            handles += ax.plot(c["global_batch"], c["speedup"], ":", color="black", lw=1.5,
                               label="communication free (the ceiling)")  # fmt: skip
        if goal is not None:
            label = f"goal: {goal[1]:.2f}x at {goal[0]}"
            handles += ax.plot([goal[0]], [goal[1]], "*", color="black", ms=16, mew=1.2,
                               markerfacecolor="none", zorder=5, label=label)  # fmt: skip
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


def knob_spread(knobs: pd.DataFrame, silent: str = SILENT.name) -> tuple[pd.Series, pd.Series]:
    """Each variant's share of the ceiling paired by round (``comm_engineering.share_bracket``):
    in each round the silent step over the variant's step of the same round, the lowest and the
    highest, so that the line drawn beside a bar (its median) shows how far the rounds spread.
    Columns variant, round_ms; the row named ``silent`` holds the silent workers' rounds."""
    rounds = knobs.set_index("variant")["round_ms"]
    pairs = [share_bracket(rounds[silent], r) for r in knobs["round_ms"]]
    return (pd.Series([p[0] for p in pairs], index=knobs.index),
            pd.Series([p[1] for p in pairs], index=knobs.index))  # fmt: skip


def plot_knobs(
    knobs: pd.DataFrame, profiled: pd.DataFrame, banner: str, goal: float | None
) -> Figure:
    """Left: each variant's share of the communication-free ceiling (``knob_table``), its
    rounds' paired spread as a line (``knob_spread``), the goal as a dashed line (none where
    ``goal`` is None: no goal on this run). Right: the profiled steps (``profile_table``),
    milliseconds per step stacked by what the training's thread did."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 5.4), width_ratios=(3, 2))
    rows = knobs.iloc[::-1]
    share = rows["share_of_ceiling"]
    reached = [goal is not None and s >= goal for s in share]
    left.barh(rows["variant"], share, color=["C2" if r else "C0" for r in reached])
    low, high = knob_spread(knobs)
    silent_ms = float(knobs.set_index("variant").loc[SILENT.name, "step_ms"])
    left.hlines(knobs["variant"], low, high, color="black", lw=1)
    if goal is not None:
        left.axvline(goal, color="C3", ls="--", lw=1.5, label=f"goal: {goal:.0%} of the ceiling")
        left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    left.xaxis.set_major_formatter(PercentFormatter(1.0))
    left.set_xlabel("share of the ceiling = silent step / step\n"
                    "(line: lowest to highest round, each over the same round's silent step)")
    left.set_title(f"2 workers at global batch 256 (silent step {silent_ms:.1f} ms)", fontsize=10)
    left.grid(axis="x", alpha=0.3)
    bottom = pd.Series(0.0, index=profiled.index)
    # the training's thread, stacked; Gloo's threads run beside it and are not part of its step
    for i, part in enumerate(c for c in profiled.columns if c not in ("step_ms", GLOO_THREADS)):
        right.bar(profiled.index, profiled[part], bottom=bottom, color=f"C{i}", label=part)
        bottom += profiled[part]
    right.set_ylabel("ms per step (the training's thread)")
    right.set_title("One step profiled (torch.profiler)", fontsize=10)
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(f"What each knob buys, and where the time goes\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_hook_costs(costs: pd.DataFrame, banner: str) -> Figure:
    """Each hook's communication per step, stacked: its compression compute, its calls' latency
    and its bytes' time, one panel per network (columns hook, network, compress_ms, latency_ms,
    bytes_ms), the parts named in one legend for all panels."""
    networks = list(dict.fromkeys(costs["network"]))
    fig, axes = plt.subplots(1, len(networks), figsize=(5.5 * len(networks), 3.8), squeeze=False)
    parts = {"compress_ms": "compression compute", "latency_ms": "latency (calls x alpha)",
             "bytes_ms": "bytes (beta x bytes)"}  # fmt: skip
    for ax, network in zip(axes[0], networks, strict=True):
        rows = costs[costs["network"] == network].iloc[::-1]
        left = pd.Series(0.0, index=rows.index)
        for i, (column, label) in enumerate(parts.items()):
            ax.barh(rows["hook"], rows[column], left=left, color=f"C{i}", label=label)
            left += rows[column]
        ax.set_xlabel("ms per step (the model, on the network's alpha and beta)")
        ax.set_title(network, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=f"C{i}", label=label) for i, label in enumerate(parts.values())]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles))
    fig.suptitle(f"What each hook's communication costs per step\n{banner}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend, which holds for every panel
    return fig


def plot_hook_payoff(
    speedups: pd.DataFrame, break_even: pd.DataFrame, bandwidths: dict[str, float], banner: str
) -> Figure:
    """Where a hook pays, by the model. Left: each hook's speed-up of 2 workers per network and
    global batch (columns hook, network, global_batch, speedup_model). Right: the bandwidth below
    which each hook pays, per model size (columns model, hook, pays_below_GB_per_s), beside the
    networks' bandwidths (``bandwidths``, GB/s by name): a hook pays on a network left of its bar's
    end."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.8))
    hooks = list(dict.fromkeys(speedups["hook"]))
    combos = list(dict.fromkeys(zip(speedups["network"], speedups["global_batch"], strict=True)))
    networks = list(dict.fromkeys(speedups["network"]))
    for k, (network, batch) in enumerate(combos):
        rows = speedups[(speedups["network"] == network) & (speedups["global_batch"] == batch)]
        rows = rows.set_index("hook").reindex(hooks)
        ax_y = [len(hooks) - 1 - i + 0.15 * (k - (len(combos) - 1) / 2) for i in range(len(hooks))]
        left.plot(rows["speedup_model"], ax_y, "os"[k % 2], ls="none",
                  color=f"C{networks.index(network)}", label=f"{network}, global batch {batch}")
    left.set_yticks(range(len(hooks)), hooks[::-1])
    left.set_xlabel("speed-up of 2 workers (model)")
    left.set_title("each hook's speed-up", fontsize=10)
    left.grid(axis="x", alpha=0.3)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    models = list(dict.fromkeys(break_even["model"]))
    names = list(dict.fromkeys(break_even["hook"]))
    height = 0.8 / len(models)
    for k, model in enumerate(models):
        rows = break_even[break_even["model"] == model].set_index("hook").reindex(names)
        y = [len(names) - 1 - i + height * (k - (len(models) - 1) / 2) for i in range(len(names))]
        right.barh(y, rows["pays_below_GB_per_s"], height=height, color=f"C{k + 2}", label=model)
    for j, (network, gb_per_s) in enumerate(bandwidths.items()):
        right.axvline(gb_per_s, color="grey", ls=("--", ":")[j % 2], lw=1.2,
                      label=f"{network}: {gb_per_s:.3g} GB/s")  # fmt: skip
    right.set_xscale("log")
    shown = [*bandwidths.values(), *break_even["pays_below_GB_per_s"]]
    low, high = min(shown) / 2, max(shown) * 2
    right.set_xlim(low, high)
    right.set_xticks([t for t in (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100) if low <= t <= high])
    right.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_yticks(range(len(names)), names[::-1])
    right.set_xlabel("pays on networks slower than (GB/s, model)")
    right.set_title("break-even bandwidth", fontsize=10)
    right.grid(axis="x", alpha=0.3)
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle(f"Where compression pays, modelled\nmodel fitted to {banner}", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ notebook 07: deeper models


def plot_overlap_depth(deep: dict[str, pd.DataFrame], banner: str, world: int = 2) -> Figure:
    """The model's speed-up against the number of layers, with overlap (solid) and without it
    (dashed), one colour per network: the tables of ``comm_engineering.overlap_table``."""
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for k, (network, table) in enumerate(deep.items()):
        colour = f"C{k}"
        ax.plot(table["layers"], table["speedup_overlap"], "o-", color=colour,
                label=f"{network}, with overlap")
        ax.plot(table["layers"], table["speedup_no_overlap"], "s--", color=colour,
                label=f"{network}, without overlap")  # fmt: skip
    ax.axhline(world, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("square layers of width 1024")
    ax.set_ylabel(f"speed-up of {world} workers (model)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Overlap against depth, modelled\nmodel fitted to {banner}", fontsize=10)
    return fig


# ------------------------------------------------------------------ notebook 07: accumulation


def plot_accumulation(table: pd.DataFrame, banner: str, world: int = 2) -> Figure:
    """The model's speed-up against the effective global batch reached by accumulation, with
    ``no_sync()`` and without it, under the communication-free ceiling: columns global_batch,
    micro_batches, speedup_no_sync, speedup_without, ceiling."""
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    b = table["global_batch"]
    ax.plot(b, table["ceiling"], ":", color="grey", label="communication free (the ceiling)")
    ax.plot(b, table["speedup_no_sync"], "o-", color="C0", label="with no_sync(): 1 all-reduce")
    ax.plot(b, table["speedup_without"], "s--", color="C3",
            label="without no_sync(): one all-reduce per micro-batch")  # fmt: skip
    for x, y, k in zip(b, table["speedup_without"], table["micro_batches"], strict=True):
        ax.annotate(f"k={k}", (x, y), textcoords="offset points", xytext=(0, -14),
                    ha="center", fontsize=8)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(b, [str(x) for x in b])
    ax.minorticks_off()
    ax.margins(y=0.15)  # room for the k labels under the lowest points
    ax.set_xlabel("effective global batch (k micro-batches per worker and step)")
    ax.set_ylabel(f"speed-up of {world} workers (model)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    ax.set_title(f"Accumulation against the effective batch, modelled\n"
                 f"model fitted to {banner}",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig

