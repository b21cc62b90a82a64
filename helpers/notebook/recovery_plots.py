"""Notebook 10's figure of a recovery: the steps a killed and restarted run computed, and Young's
first-order model of the time that checkpointing at an interval loses, to saves and to redone
work (Young 1974, *A first order approximation to the optimum checkpoint interval*, CACM 17(9))."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def young_lost_share(interval_s: np.ndarray, save_s: float, mtbf_s: float) -> np.ndarray:
    """The share of time lost at a checkpoint interval: a save per interval, and on average half
    an interval redone per failure, with failures ``mtbf_s`` apart."""
    return save_s / interval_s + interval_s / (2 * mtbf_s)


def plot_recovery(
    killed_after: int,
    resumed_from: int,
    total_steps: int,
    saved_before: list[int],
    saved_after: list[int],
    banner: str,
    save_seconds: tuple[float, ...] = (5.0, 60.0, 300.0),
    mtbf_s: float = 86_400.0,
) -> Figure:
    """Left: the training step reached against the steps computed, for a run killed after step
    ``killed_after`` and resumed from ``resumed_from``, with the checkpoints each attempt saved
    (``saved_before`` inferred by the caller, ``saved_after`` as the run reported them).
    Right: Young's lost share against the interval for a few save times, optimum marked."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    first = np.arange(killed_after + 1)
    second_x = killed_after + np.arange(total_steps - resumed_from + 1)
    second_y = resumed_from + np.arange(total_steps - resumed_from + 1)
    left.plot(first, first, color="C0", label="attempt 1")
    left.plot(second_x, second_y, color="C1", label="attempt 2, after the restart")
    left.plot([killed_after, killed_after], [killed_after, resumed_from], "k:", lw=1)
    kill = f"kill after step {killed_after}"
    left.plot(killed_after, killed_after, "rx", ms=10, mew=2, label=kill)
    # the run reports where it resumed and what the second attempt saved; the first attempt's
    # saves are inferred from the interval (the killed attempt reports nothing)
    left.plot(saved_before, saved_before, "o", color="C0", mfc="white",
              label="checkpoint saved (inferred)")  # fmt: skip
    computed_at = [killed_after + s - resumed_from for s in saved_after]
    left.plot(computed_at, saved_after, "o", color="C1", mfc="white",
              label="checkpoint saved (reported)")  # fmt: skip
    redone = killed_after - resumed_from
    left.axvspan(killed_after, killed_after + redone, color="grey", alpha=0.25,
                 label=f"{redone} step(s) redone")  # fmt: skip
    left.set(xlabel="steps computed, in order", ylabel="training step reached",
             title=f"A killed worker, restarted by torchrun\n{banner}")  # fmt: skip
    left.legend(loc="upper left", fontsize=8)

    intervals = np.geomspace(10, 100_000, 200)
    for save_s in save_seconds:
        (line,) = right.plot(intervals / 60, 100 * young_lost_share(intervals, save_s, mtbf_s),
                             label=f"a save takes {save_s:g} s")  # fmt: skip
        best = np.sqrt(2 * save_s * mtbf_s)
        right.plot(best / 60, 100 * young_lost_share(np.array(best), save_s, mtbf_s), "o",
                   color=line.get_color())  # fmt: skip
    right.set(xscale="log", yscale="log", xlabel="checkpoint interval (minutes)",
              ylabel="time lost (%)", ylim=(0.1, 100),
              title=f"Young's model (1974), not measured: failures {mtbf_s / 3600:g} h apart "
                    "on average\n(dots: the best interval, sqrt(2 x save x MTBF))")  # fmt: skip
    right.legend(fontsize=8)
    return fig
