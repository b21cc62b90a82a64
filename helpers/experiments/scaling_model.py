"""The step-time model of data parallelism (``helpers.experiments.scaling``'s docstring derives it):
one worker's compute ``c0 + c1 * B`` fitted to the 1-worker runs, and N workers'
``c0 + c1 * B / N`` plus the all-reduce, set beside what the sweep measured."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from helpers.dist.comm_model import AlphaBeta, fit_alpha_beta
from helpers.training.model import GRADIENT_BYTES


@dataclass(frozen=True)
class ComputeModel:
    """One worker's seconds per training step for a batch of ``B`` samples:
    ``c0 + c1 * B``."""

    c0: float  # seconds per step whatever the batch
    c1: float  # seconds per sample

    def predict(self, batch: float | np.ndarray) -> float | np.ndarray:
        """Seconds for one step on ``batch`` samples (a number or an array)."""
        if np.ndim(batch) == 0:
            return self.c0 + self.c1 * float(batch)  # type: ignore[arg-type]
        return self.c0 + self.c1 * np.asarray(batch, dtype=float)

    def __str__(self) -> str:
        return (
            f"c0 = {self.c0 * 1e3:.2f} ms per step, c1 = {self.c1 * 1e6:.2f} us per sample "
            f"({1 / self.c1:,.0f} samples/s)"
        )


def fit_compute(table: pd.DataFrame) -> ComputeModel:
    """Fit ``step_seconds = c0 + c1 * global_batch`` to the 1-worker rows of a sweep.

    The same straight line in relative error as ``fit_alpha_beta`` (the batch sizes double from
    one point to the next, and an absolute fit would let the largest batch decide alone)."""
    one = table[table["world"] == 1]
    if one["global_batch"].nunique() < 2:
        raise ValueError("fitting the compute time needs 1-worker runs at 2 or more global batches")
    try:
        line = fit_alpha_beta(one["global_batch"], one["step_seconds"])
    except ValueError as err:
        raise ValueError(f"step times: {err}") from None
    return ComputeModel(line.alpha, line.beta)


def fit_compute_physical(table: pd.DataFrame) -> ComputeModel:
    """``fit_compute``, with a step's fixed cost kept at 0 or more: a negative ``c0`` is load
    distorting the points (no step costs less than nothing), and it would let the model predict
    N workers more than N times faster. Then ``c1`` is refitted through the origin, in relative
    error as ``fit_compute`` fits."""
    fit = fit_compute(table)
    if fit.c0 >= 0:
        return fit
    one = table[table["world"] == 1]
    per = one["global_batch"] / one["step_seconds"]  # minimises the relative error of c1 * B
    return ComputeModel(0.0, float(per.sum() / (per**2).sum()))


def predict_step_seconds(
    compute: ComputeModel,
    comm: AlphaBeta | None,
    global_batch: float | np.ndarray,
    world: int,
    nbytes: int = GRADIENT_BYTES,
) -> float | np.ndarray:
    """Seconds per step with ``world`` workers: compute on ``global_batch / world`` samples, then
    all-reduce ``nbytes`` of gradients (nothing to all-reduce with one worker)."""
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    if world > 1 and comm is None:
        raise ValueError(f"{world} workers all-reduce their gradients: give their AlphaBeta fit")
    allreduce = comm.predict(nbytes) if world > 1 else 0.0  # type: ignore[union-attr]
    return compute.predict(np.asarray(global_batch, dtype=float) / world) + allreduce


def predict_speedup(
    compute: ComputeModel,
    comm: AlphaBeta | None,
    global_batch: float | np.ndarray,
    world: int,
    nbytes: int = GRADIENT_BYTES,
) -> float | np.ndarray:
    """Predicted speed-up of ``world`` workers over one: ``t_1(B) / t_N(B)``."""
    one = compute.predict(np.asarray(global_batch, dtype=float))
    return one / predict_step_seconds(compute, comm, global_batch, world, nbytes)


def prediction_table(
    compute: ComputeModel,
    comms: dict[int, AlphaBeta],
    global_batches: Sequence[float] | np.ndarray,
    nbytes: int = GRADIENT_BYTES,
) -> pd.DataFrame:
    """The model's step time, speed-up and efficiency for every world size in ``comms`` (each
    with its own all-reduce fit) at every global batch: columns world, global_batch,
    step_seconds, speedup, efficiency."""
    frames = []
    batches = np.asarray(global_batches, dtype=float)
    for world, comm in sorted(comms.items()):
        s = predict_speedup(compute, comm, batches, world, nbytes)
        frames.append(
            pd.DataFrame(
                {
                    "world": world,
                    "global_batch": batches,
                    "step_seconds": predict_step_seconds(compute, comm, batches, world, nbytes),
                    "speedup": s,
                    "efficiency": s / world,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def batch_for_speedup(
    compute: ComputeModel,
    comm: AlphaBeta,
    world: int,
    target: float,
    nbytes: int = GRADIENT_BYTES,
) -> float:
    """The global batch at which the model's speed-up reaches ``target``: solving
    ``c0 + c1 B = target * (c0 + c1 B / N + a)`` for ``B``, with ``a`` the all-reduce time.
    ``inf`` if the target is out of reach (at least ``N``, or no per-sample cost to share)."""
    if world < 2:
        raise ValueError("a speed-up needs at least 2 workers")
    a = float(comm.predict(nbytes))
    gain = compute.c1 * (1 - target / world)  # per sample: saved by sharing, less the target's
    if gain <= 0:
        return math.inf
    return max(0.0, (target * (compute.c0 + a) - compute.c0) / gain)


def compute_fit_text(table: pd.DataFrame, compute: ComputeModel) -> str:
    """One worker's measured step times beside the fitted ``c0 + c1 * B``, in milliseconds."""
    one = table[table["world"] == 1]
    return pd.DataFrame(
        {
            "global_batch": one["global_batch"],
            "measured_ms": one["step_seconds"] * 1e3,
            "fitted_ms": compute.predict(one["global_batch"].to_numpy()) * 1e3,
        }
    ).to_string(index=False, float_format="{:.2f}".format)


def measured_and_model(table: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """The runs of more than one worker beside the model's prediction for the same point:
    columns world, global_batch, speedup_measured, speedup_model (and the rest of both)."""
    return table[table["world"] > 1].merge(
        predicted, on=["world", "global_batch"], suffixes=("_measured", "_model")
    )


def measured_and_model_text(both: pd.DataFrame) -> str:
    shown = both[["world", "global_batch", "speedup_measured", "speedup_model"]]
    return shown.to_string(index=False, float_format="{:.2f}x".format)
