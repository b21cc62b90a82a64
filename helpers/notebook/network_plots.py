"""Notebook 10's figure of what a network costs data parallelism: the speed-up that notebook 05's
model predicts for 2 workers on two machines, against the global batch, for a few links; and the
batch at which they break even, against how fast one worker computes. The lesson is in the second
panel: a faster device needs a proportionally larger batch to pay for the same all-reduce."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from helpers.dist.comm_model import AlphaBeta
from helpers.experiments.scaling import ComputeModel, batch_for_speedup, predict_speedup


def plot_break_even(
    compute: ComputeModel,
    links: dict[str, AlphaBeta],
    banner: str,
    speedups: tuple[int, ...] = (1, 10, 100, 1000),
    world: int = 2,
) -> Figure:
    """Left: the predicted speed-up of ``world`` workers against the global batch on each link,
    break-even (1x) marked. Right: the break-even batch on each link against the compute made
    ``speedups`` times faster per sample (``c1 / k``: all cores, a GPU), ``c0`` unchanged."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    batches = np.geomspace(16, 1 << 20, 200)
    for i, (name, link) in enumerate(links.items()):
        left.plot(batches, predict_speedup(compute, link, batches, world), color=f"C{i}",
                  label=name)  # fmt: skip
        even = batch_for_speedup(compute, link, world, 1.0)
        if np.isfinite(even):
            left.plot(even, 1.0, "o", color=f"C{i}", mfc="white")
        faster = [ComputeModel(compute.c0, compute.c1 / k) for k in speedups]
        right.plot(speedups, [batch_for_speedup(f, link, world, 1.0) for f in faster], "o-",
                   color=f"C{i}", label=name)  # fmt: skip
    left.axhline(1.0, color="grey", lw=1, ls=":")
    left.axhline(world, color="grey", lw=1, ls="--")
    left.set(xscale="log", xlabel="global batch (samples)", ylabel=f"speed-up of {world} workers",
             ylim=(0, world + 0.2),
             title=f"{world} machines, one worker each (model; dots: break-even)")
    left.legend(fontsize=8, loc="upper left")
    right.set(xscale="log", yscale="log",
              xlabel="compute per sample, times faster than this worker (c1 / k)",
              ylabel="break-even global batch (samples)",
              title="A faster worker needs a larger batch to break even")
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(banner, fontsize=9)
    return fig
