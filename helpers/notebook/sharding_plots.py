"""Notebook 08's figures of what sharding costs in communication: the bytes Gloo puts on the wire
for each collective against a ring's, a step's time against its collectives' alone, and a step's
time split into compute, collectives and the rest. Tables
say the numbers; these show at a glance which bar is out of line. Each returns its figure; the
notebook calls ``plt.show()``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from helpers.dist.counting import COUNTED


def plot_wire_bytes(sent: dict[str, float], ring: dict[str, float], source: str) -> Figure:
    """Per collective, the bytes each worker sent per byte of the message (measured, filled)
    beside what a ring sends (outlined): a filled bar above its outline is traffic the backend
    adds. ``sent`` and ``ring`` map a collective's name to a ratio; the bars follow ``sent``'s
    order, and every name in it must be in ``ring``."""
    missing = sorted(set(sent) - set(ring))
    if missing:
        raise ValueError(f"no ring figure for {', '.join(missing)}: give ring a ratio for each")
    names = list(sent)
    x = list(range(len(names)))
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    ax.bar([p - 0.18 for p in x], [sent[n] for n in names], 0.36, color="C0",
           label="measured (TCP/IP headers included)")  # fmt: skip
    ax.bar([p + 0.18 for p in x], [ring[n] for n in names], 0.36, fill=False, edgecolor="black",
           label="a ring: the bandwidth-optimal bytes")  # fmt: skip
    for p, name in zip(x, names, strict=True):
        ax.annotate(f"{sent[name]:.2f}", (p - 0.18, sent[name]), xytext=(0, 3),
                    textcoords="offset points", ha="center", fontsize=9)  # fmt: skip
    ax.set_xticks(x, [n.replace("_", "-") for n in names], fontsize=9)
    ax.set_ylabel("bytes sent per worker\nper byte of the message")
    ax.set_ylim(0, 1.3 * max(*sent.values(), *ring.values()))
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"What each collective puts on the wire, against a ring\n{source}", fontsize=10)
    fig.tight_layout()
    return fig


def _calls(row: pd.Series) -> str:
    """``6 all-gathers, 3 reduce-scatters``: the collectives a traffic row counted."""
    parts = [f"{int(row[f'{k} calls'])} {k}s" for k in COUNTED if row.get(f"{k} calls", 0) > 0]
    return ", ".join(parts) or "no collectives"


def plot_step_against_collectives(table: pd.DataFrame, banner: str) -> Figure:
    """Per run, a training step's time beside its collectives replayed alone (both medians,
    rank 0), each run labelled with the collectives it issued: where the two bars are far apart,
    the step's time is compute, and sending more bytes costs little. A whisker on each step bar
    spans its quartiles, the middle half of the steps: two runs whose whiskers overlap tie.
    ``table`` from ``helpers.experiments.sharding.traffic_table`` (``step ms``, its quartiles
    ``step q1 ms`` and ``step q3 ms``, ``collectives alone ms`` and the calls of each kind)."""
    y = list(range(len(table)))[::-1]  # the first run on top
    fig, ax = plt.subplots(figsize=(8.0, 1.1 * len(table) + 1.4))
    spread = [table["step ms"] - table["step q1 ms"], table["step q3 ms"] - table["step ms"]]
    ax.barh([p + 0.18 for p in y], table["step ms"], 0.36, color="0.6", xerr=spread, capsize=4,
            label="training step (whisker: middle half of the steps)")  # fmt: skip
    ax.barh([p - 0.18 for p in y], table["collectives alone ms"], 0.36, color="C3",
            label="its collectives alone (replayed)")  # fmt: skip
    for p, (_, row) in zip(y, table.iterrows(), strict=True):
        for column, end, offset in (("step ms", "step q3 ms", 0.18),
                                    ("collectives alone ms", "collectives alone ms", -0.18)):
            ax.annotate(f"{row[column]:.0f} ms", (row[end], p + offset), xytext=(6, 0),
                        textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    ax.set_yticks(y, [f"{run}\n{_calls(row)}" for run, row in table.iterrows()], fontsize=8)
    ax.set_xlabel("milliseconds (medians, rank 0; whiskers: quartiles across steps)")
    ax.set_xlim(0, 1.25 * table[["step q3 ms", "collectives alone ms"]].to_numpy().max())
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"A step's time against its collectives' alone\n{banner}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_step_split(table: pd.DataFrame, source: str) -> Figure:
    """Per launch and run (``table``'s rows, the first on top), rank 0's median step split into
    the compute, the collectives alone and what is left, stacked; what is left is hatched, and
    drawn back over the collectives where it is negative (communication that overlapped the
    compute). Each bar is labelled with the step's time and the page faults a step took (the
    most faulting rank). ``table`` from ``helpers.experiments.step_accounting.step_accounting``."""
    y = list(range(len(table)))[::-1]
    fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(table) + 1.8))
    compute, alone, left = table["compute ms"], table["collectives alone ms"], table["left ms"]
    ax.barh(y, compute, 0.6, color="0.6", label="compute (the same step, no communication)")
    ax.barh(y, alone, 0.6, left=compute, color="C3", label="its collectives alone (replayed)")
    ax.barh(y, left, 0.6, left=compute + alone, color="C1", alpha=0.6, hatch="//",
            label="left: the rest of the step")  # fmt: skip
    for p, (_, row) in zip(y, table.iterrows(), strict=True):
        end = max(row["step ms"], row["compute ms"] + row["collectives alone ms"])
        ax.annotate(f"{row['step ms']:.0f} ms, {row['faults per step, most']:,.0f} faults",
                    (end, p), xytext=(6, 0), textcoords="offset points", va="center",
                    fontsize=8)  # fmt: skip
    ax.set_yticks(y, [f"{launch}: {run}" for launch, run in table.index], fontsize=8)
    ax.set_xlabel("milliseconds, rank 0's median step (label: the step, and its page faults)")
    ends = np.maximum(table["step ms"], compute + alone)
    ax.set_xlim(0, 1.45 * ends.max())
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16 - 0.6 / len(table)),
              ncol=2)  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"Where a step's time goes\n{source}", fontsize=10)
    fig.tight_layout()
    return fig
