"""Plots shared by the notebooks: one function per kind of figure, axes labelled with their
units, a title that names the data the result came from. Each returns its figure; the notebook
calls ``plt.show()``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

# --------------------------------------------------------------------------- notebook 04: scaling

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
) -> Figure:
    """Speed-up or efficiency (``metric``) against the global batch on a log-2 axis, one colour
    per world size: measured points joined by lines, the model's prediction dashed, published
    reference points as hollow stars. Tables need world, global_batch and the metric column."""
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
    tops = [measured[metric].max(), predicted[metric].max(), published[metric].max()]
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
    ``helpers.replicas.mistakes_table``, the reference run's accuracy as a dashed line: replicas
    that agree give bars of equal height, the same training gives bars on the line."""
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


# ------------------------------------------------------------------------ notebook 05: large batch

_POLICY_STYLES = {  # colour and line style per learning-rate policy of helpers.large_batch
    "constant lr": ("C3", "-", "s"),
    "linear scaling": ("C0", "--", "o"),
    "linear scaling + warm-up": ("C2", "-", "^"),
}


def _policy_style(policy: str) -> tuple[str | None, str, str]:
    return _POLICY_STYLES.get(policy, (None, "-", "o"))


def _plain_log_y(ax: plt.Axes) -> None:
    """A log-scale y axis labelled 0.5, 0.7, 1, 1.5, 2, 3, ... rather than in powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_batch_sweep(sweep: pd.DataFrame, banner: str, base_batch: int = 256) -> Figure:
    """Two panels against the global batch (log-2 axis), one line per lr policy: the test
    accuracy after the epoch budget, and the mean training loss over the last epoch (log
    scale). Runs whose loss rose above its starting value are ringed in black. Each tick also
    says how many steps (updates) the budget gives that batch. The table comes from
    ``helpers.large_batch.run_sweep``."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (
        ("accuracy", "test accuracy after the last epoch (%)", "Test accuracy"),
        ("last_epoch_loss", "training loss, mean over the last epoch (log scale)", "Training loss"),
    )
    steps = sweep.drop_duplicates("global_batch").sort_values("global_batch")
    ticks = [f"{b}\n({s})" for b, s in zip(steps["global_batch"], steps["steps"], strict=True)]
    for ax, (column, ylabel, name) in zip(axes, panels, strict=True):
        for policy, group in sweep.groupby("policy", sort=False):
            colour, style, marker = _policy_style(policy)
            group = group.sort_values("global_batch")
            ax.plot(
                group["global_batch"],
                group[column],
                ls=style,
                marker=marker,
                color=colour,
                label=policy,
            )
        bad = sweep[sweep["diverged"]]
        ax.plot(
            bad["global_batch"],
            bad[column],
            "o",
            ms=13,
            mfc="none",
            mec="black",
            label="loss rose above its start (diverged)",
        )
        ax.axvline(base_batch, color="grey", lw=0.8, ls=":", label=f"base batch {base_batch}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(steps["global_batch"], ticks)
        ax.minorticks_off()
        ax.set_xlabel("global batch size (samples per step); in brackets, steps in the budget")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name} against global batch size", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].yaxis.set_major_formatter(PercentFormatter(1.0))
    axes[0].set_ylim(0, 1)
    _plain_log_y(axes[1])
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle(f"The same epoch budget at every batch size\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_loss_curves(sweep: pd.DataFrame, batches: list[int], banner: str) -> Figure:
    """Training loss at every step against epochs (so that batches with different numbers of
    steps share an axis), one panel per global batch in ``batches``, one line per lr policy.
    The table needs global_batch, policy, steps_per_epoch and losses (a list per row)."""
    fig, axes = plt.subplots(1, len(batches), figsize=(5.0 * len(batches), 4.0), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        runs = sweep[sweep["global_batch"] == batch]
        repeats = runs[runs["same_as"] != ""] if "same_as" in runs else runs.iloc[:0]
        for _, run in runs.drop(repeats.index).iterrows():
            colour, style, _ = _policy_style(run["policy"])
            same = repeats[repeats["same_as"] == run["policy"]]["policy"].tolist()
            epochs = [(step + 1) / run["steps_per_epoch"] for step in range(len(run["losses"]))]
            ax.plot(
                epochs,
                run["losses"],
                ls=style,
                color=colour,
                lw=1.2,
                label=" = ".join([run["policy"], *same]) + f" (lr {run['lr']:.4g})",
            )
        _plain_log_y(ax)
        ax.set_xlabel("epochs of training")
        ax.set_ylabel("training loss (cross-entropy, log scale)")
        steps = int(sweep[sweep["global_batch"] == batch]["steps"].iloc[0])
        ax.set_title(f"global batch {batch} ({steps} steps)", fontsize=10)
        ax.legend(fontsize=8, loc="best")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Training loss per step\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_time_to_accuracy(table: pd.DataFrame, target: float, banner: str) -> Figure:
    """Test accuracy after each epoch against the estimated wall-clock time (epochs x measured
    seconds per epoch), one line per configuration, the target as a horizontal line and the
    moment each configuration first reaches it as a large marker. The table comes from
    ``helpers.large_batch.time_to_accuracy_table``."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (_, row) in enumerate(table.iterrows()):
        colour = f"C{i}"
        curve = row["epoch_accuracies"]
        times = [(epoch + 1) * row["seconds_per_epoch"] for epoch in range(len(curve))]
        ax.plot(times, curve, "o-", ms=3, color=colour, label=row["configuration"])
        if row["seconds_to_target"] != float("inf"):
            ax.plot(row["seconds_to_target"], target, "*", ms=14, color=colour)
    ax.axhline(target, color="grey", lw=1, ls="--", label=f"target {target:.0%}")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_ylim(bottom=max(0.0, min(min(c) for c in table["epoch_accuracies"]) - 0.02))
    ax.set_xlabel("estimated training time (s): epochs x measured seconds per epoch")
    ax.set_ylabel("test accuracy after the epoch (%)")
    ax.set_title(f"Time to accuracy (star: target first reached)\n{banner}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
