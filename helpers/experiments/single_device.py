"""The biggest single device first: one worker using every core, against N workers.

The reference article's second piece of advice before going distributed is to use the biggest
single device you can. On one machine that is one worker process whose intra-op threads
(``torch.set_num_threads``) use every core, timed against notebook 05's sweep (N workers of
``default_threads_per_worker`` threads each) at the same global batches and the same steps.
Threads split each matrix product of a step between the cores and never all-reduce; workers
split the batch and all-reduce the whole gradient at every step. The ceiling runs, N workers
that never communicate (``sync="none"``, each training alone on its slice), give what workers
reach with the all-reduce free, which tells the two reasons apart: the all-reduce, and how well
a step's products split over threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import torch
from torch import nn

from helpers.data import load_har
from helpers.dist.cores import (
    WorldPlan,
    available_cores,
    default_threads_per_worker,
    plan_world_sizes,
)
from helpers.experiments.scaling import DEFAULT_BATCHES, UNTIMED_STEPS, budget
from helpers.training import RunResult, TrainConfig, run_trainings

SINGLE_DEVICE, NO_COMMUNICATION = "single device", "no communication"


class ThreadsProbe:
    """Reads, inside each worker, the intra-op threads PyTorch really ran with (a
    ``helpers.training.Probe``): the plan's word is not taken for it."""

    def start(self, rank: int, world_size: int) -> None:
        pass

    def ready(self, model: nn.Module) -> None:
        pass

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return {"threads": torch.get_num_threads()}


def single_device_plan(cores: int | None = None) -> WorldPlan:
    """One worker, one intra-op thread per core: every core the course may use."""
    cores = available_cores() if cores is None else cores
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    return WorldPlan(1, cores, cores, True, False, f"1 worker x {cores} threads: every core")


def ceiling_plan(cores: int | None = None, threads: int | None = None) -> WorldPlan | None:
    """The most workers of ``threads`` threads (default: the sweep's) that fit the cores, at
    least 2; None where not even 2 fit."""
    cores = available_cores() if cores is None else cores
    threads = default_threads_per_worker(cores) if threads is None else threads
    fitting = [p for p in plan_world_sizes([2, 4], threads, cores) if p.runs]
    return fitting[-1] if fitting else None


def _rows(layout: str, results: list[RunResult], points: pd.DataFrame) -> list[dict]:
    rows = []
    for run, point in zip(results, points.itertuples(index=False), strict=True):
        rows.append(
            {
                "layout": layout,
                "world": run.world,
                "threads_per_worker": run.threads_per_worker,
                "threads_used": min(probe["threads"] for probe in run.probes),  # every worker's
                "global_batch": run.global_batch,
                "epochs": run.epochs,
                "steps": run.steps,
                "timed_steps": int(point.timed_steps),
                "seconds": run.seconds,
                "step_seconds": run.seconds / point.timed_steps,
                "samples_per_s": point.timed_steps * run.global_batch / run.seconds,
                "accuracy": run.accuracy,
                "checksum": run.checksums[0],
            }
        )
    return rows


def baseline_runs(
    global_batches: Sequence[int] = DEFAULT_BATCHES,
    min_steps: int = 10,
    data: str | None = None,
    lr: float = 0.05,
    cores: int | None = None,
    ceiling: bool = True,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Time the single device (one worker, every core) at every global batch, with the sweep's
    ``budget`` (the same steps, ``UNTIMED_STEPS`` off the clock), all batches in one launch so
    that its start-up is paid once; with ``ceiling``, the same for the ``ceiling_plan``'s
    workers, never communicating. Returns one row per run: layout ("single device" or
    "no communication"), world, threads_per_worker, threads_used (the fewest intra-op threads a
    worker reported running with), global_batch, epochs, steps, timed_steps,
    seconds (the slowest worker's), step_seconds, samples_per_s, accuracy, checksum (rank 0).
    Speed-ups come from ``scaling.add_baselines``, against the sweep's."""
    har = load_har(data)
    points = budget(global_batches, len(har.X_train), min_steps)

    def configs(sync: str) -> list[TrainConfig]:
        return [
            TrainConfig(global_batch=int(p.global_batch), epochs=int(p.epochs), lr=lr,
                        data=har.source, untimed_steps=UNTIMED_STEPS, sync=sync)  # fmt: skip
            for p in points.itertuples(index=False)
        ]

    plans = [(SINGLE_DEVICE, single_device_plan(cores), "ddp")]
    if ceiling and (plan := ceiling_plan(cores)) is not None:
        plans.append((NO_COMMUNICATION, plan, "none"))
    rows = []
    for layout, plan, sync in plans:
        if progress is not None:
            progress(
                f"{layout}: {plan.world_size} worker(s) x {plan.threads_per_worker} thread(s), "
                f"global batches {', '.join(str(b) for b in points['global_batch'])}"
            )
        rows += _rows(layout, run_trainings(plan, configs(sync), probe=ThreadsProbe()), points)
    table = pd.DataFrame(rows)
    table.attrs["data_source"] = har.source
    return table
