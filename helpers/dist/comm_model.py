"""The latency-bandwidth model of communication time, ``t = alpha + beta * bytes``.

``alpha`` (seconds) is what any all-reduce costs, however small: starting the call, the
handshakes between processes, waking the other process up. ``beta`` (seconds per byte) is what
each further byte costs: copying it through the transport and adding it up; ``1 / beta`` is the
effective bandwidth. Measure with ``measure_allreduce``, fit with ``fit_alpha_beta``, then
predict the time of any message, for example a model's gradients every training step::

    times = measure_allreduce(world_sizes=[2])
    model = fit_alpha_beta(times["bytes"], times["seconds"])
    model.predict(6_524_952)  # seconds to all-reduce the reference MLP's gradients

The fit describes one world size on one machine; fit each world size separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from helpers.dist.collectives import time_allreduce
from helpers.dist.cores import default_threads_per_worker, plan_world_sizes
from helpers.dist.launch import launch

if TYPE_CHECKING:  # pandas only for tables: every training worker imports this module
    import pandas as pd

# 4 KiB, 8 KiB, ..., 16 MiB: from latency-bound to bandwidth-bound messages, evenly spaced on a
# log scale, so that small and large messages weigh alike in the fit.
DEFAULT_SIZES: tuple[int, ...] = tuple(4096 * 2**k for k in range(13))


def ring_factor(world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce, per byte of message: ``2 (N - 1) / N``.

    1 for 2 workers, 1.5 for 4, approaching 2 as N grows: the per-byte cost hardly grows with
    the number of workers."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ``t = alpha + beta * nbytes``: ``alpha`` in seconds, ``beta`` in seconds/byte."""

    alpha: float
    beta: float

    def predict(self, nbytes: float | Sequence[float] | np.ndarray) -> float | np.ndarray:
        """Predicted seconds for messages of ``nbytes`` (a number or an array of them)."""
        if np.ndim(nbytes) == 0:
            return self.alpha + self.beta * float(nbytes)  # type: ignore[arg-type]
        return self.alpha + self.beta * np.asarray(nbytes, dtype=float)

    @property
    def bandwidth(self) -> float:
        """Effective bandwidth for large messages, in bytes per second: ``1 / beta``."""
        return 1.0 / self.beta

    def bus_bandwidth(self, world_size: int) -> float:
        """Bytes per second each rank actually sends in a ring all-reduce of a large message:
        ``ring_factor(world_size) / beta`` (nccl-tests' "bus bandwidth"). Unlike ``bandwidth``
        it is comparable across world sizes, since it counts the bytes that travel."""
        return ring_factor(world_size) / self.beta

    @property
    def half_size(self) -> float:
        """The message size, in bytes, at which ``alpha`` and ``beta * bytes`` are equal: smaller
        messages are dominated by latency, larger ones by bandwidth."""
        return self.alpha / self.beta

    def __str__(self) -> str:
        return (
            f"alpha = {self.alpha * 1e6:.1f} us, beta = {self.beta * 1e9:.3f} ns/byte "
            f"({self.bandwidth / 1e9:.2f} GB/s)"
        )


def fit_alpha_beta(
    nbytes: Sequence[float] | np.ndarray | pd.Series,
    seconds: Sequence[float] | np.ndarray | pd.Series,
    relative: bool = True,
) -> AlphaBeta:
    """Fit ``seconds = alpha + beta * nbytes`` by least squares.

    With ``relative=True`` (the default) the fit minimises the *relative* errors,
    ``sum(((alpha + beta * b - t) / t) ** 2)``: a 16 MB message taking milliseconds would
    otherwise outweigh every small message taking microseconds, and ``alpha`` would come out as
    noise. ``relative=False`` gives the ordinary fit in absolute seconds.

    Needs at least two distinct sizes and positive, finite times. The fit is not constrained:
    check ``alpha > 0`` and ``beta > 0`` on noisy data.
    """
    b = np.asarray(nbytes, dtype=float).ravel()
    t = np.asarray(seconds, dtype=float).ravel()
    if b.shape != t.shape:
        raise ValueError(f"got {b.size} sizes but {t.size} times")
    if b.size < 2:
        raise ValueError(f"fitting alpha and beta needs at least 2 points, got {b.size}")
    if np.unique(b).size < 2:
        raise ValueError("fitting alpha and beta needs at least 2 different message sizes")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError("times must be positive and finite")
    if not (np.all(np.isfinite(b)) and np.all(b >= 0)):
        raise ValueError("sizes must be non-negative and finite")
    weight = 1.0 / t if relative else np.ones_like(t)
    design = np.column_stack([np.ones_like(b), b]) * weight[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    return AlphaBeta(float(alpha), float(beta))


def measure_allreduce(
    world_sizes: Sequence[int] = (2, 4),
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 15,
    warmup: int = 3,
    threads_per_worker: int | None = None,
    oversubscribe: bool = False,
) -> pd.DataFrame:
    """Time ``dist.all_reduce`` of float32 tensors of each size (bytes), for each world size that
    fits this machine's cores (see ``helpers.dist.launch.plan_world_sizes``; the others are skipped,
    their reasons in ``result.attrs["skipped"]``).

    Returns one row per (world, size): ``world``, ``bytes`` (actually all-reduced, rounded down
    to whole float32 elements), ``seconds`` (median over ``repeats`` of the slowest rank's time),
    ``seconds_p25`` and ``seconds_p75`` (first and third quartiles of those repeats, a measure of
    the noise). Raises ``ValueError`` if no world size fits.
    """
    threads = default_threads_per_worker() if threads_per_worker is None else threads_per_worker
    plans = plan_world_sizes(world_sizes, threads, oversubscribe=oversubscribe)
    running = [p for p in plans if p.runs]
    if not running:
        reasons = "; ".join(p.reason for p in plans)
        raise ValueError(f"no world size fits this machine: {reasons}")
    import pandas as pd

    frames = []
    for plan in running:
        rows = launch(
            time_allreduce,
            plan.world_size,
            list(sizes),
            repeats,
            warmup,
            threads_per_worker=plan.threads_per_worker,
        )[0]  # every rank returns the same table
        frames.append(pd.DataFrame(rows).assign(world=plan.world_size))
    table = pd.concat(frames, ignore_index=True)
    table = table[["world", "bytes", "seconds", "seconds_p25", "seconds_p75"]]
    table.attrs["skipped"] = [p.reason for p in plans if not p.runs]
    return table


def timings_table(times: pd.DataFrame) -> pd.DataFrame:
    """``measure_allreduce``'s table for reading: milliseconds (median and quartiles) and the
    message bytes moved per second."""
    return (
        times.assign(
            median_ms=times["seconds"] * 1e3,
            p25_ms=times["seconds_p25"] * 1e3,
            p75_ms=times["seconds_p75"] * 1e3,
            GB_per_s=times["bytes"] / times["seconds"] / 1e9,
        )
        .drop(columns=["seconds", "seconds_p25", "seconds_p75"])
        .round(3)
    )
