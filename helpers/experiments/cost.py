"""What reaching an accuracy costs, in time, money and energy, on 1 or N workers (notebook 11).

Every configuration here does the same training: DDP's N workers do what one worker does on the
whole global batch (notebook 03), so the steps needed to reach a target test accuracy depend on
the global batch and the learning rate, not on how the work is split. ``runs_to_target`` trains
in this process, several seeds per batch, until a moving average of the test accuracy has stayed
above the target (one seed's raw accuracy swings across it from one evaluation to the next); the
seconds per step of each configuration are measured separately (``step_seconds``: a short timed
run of each). Then, for each configuration and global batch::

    time   = median steps over the seeds * seconds per step
    cost   = time * cores * price per core-hour / 3600
    energy = time * cores * watts per core

Every core a configuration holds is paid for, busy or waiting. Start-up, evaluation and data
loading are left out (seconds here, the same for every configuration). ``Prices`` holds example
figures with their sources: replace them with your own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from helpers.data import load_har
from helpers.dist.counting import CollectiveCounter
from helpers.experiments.large_batch.target import stays_below, train_counting
from helpers.experiments.scaling import StepFacts
from helpers.training import TrainConfig, accuracy, run_trainings, train_in_process
from helpers.training.config import epochs_for_min_steps, total_steps

# steps before the clock starts: DDP builds its buckets at the first, and at the second
# broadcasts from rank 0 the layout it rebuilt them in; the third is the first steady step
UNTIMED = 3
COUNTED_STEP = UNTIMED  # the step whose collectives are counted: the last off the clock


class StepCalls(StepFacts):
    """``StepFacts``, and the collectives of step ``COUNTED_STEP`` as the dispatcher saw them
    (``CollectiveCounter``: kind and bytes, in order). That step is DDP's first steady one (its
    rebuilt buckets, their layout already broadcast), and off the clock (``UNTIMED``), so
    counting slows no timed step."""

    def __init__(self) -> None:
        self.counter: CollectiveCounter | None = None
        self.calls: list[tuple[str, int]] = []

    def start(self, rank: int, world_size: int) -> None:
        self.counter, self.calls = None, []  # each training of a launch counts its own step

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == COUNTED_STEP - 1:
            self.counter = CollectiveCounter().__enter__()
        elif step == COUNTED_STEP:
            self._stop()

    def _stop(self) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.calls, self.counter = self.counter.calls, None

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        self._stop()  # a training shorter than COUNTED_STEP steps: what it counted
        return {**super().finish(model, optimizer), "calls": self.calls}


@dataclass(frozen=True)
class Prices:
    """What a core costs per hour and draws in watts: illustrative figures of the right order, not
    quotes, to be replaced by your own. Both scale every setup's cost alike (per core-second), so
    they change the dollars and joules, never which setup is cheaper."""

    usd_per_core_hour: float = 0.34 / 8
    usd_source: str = (
        "illustrative, not a quote: $0.34 an hour for 8 vCPUs, the on-demand price AWS's EC2 Auto "
        "Scaling User Guide prints for a c5.2xlarge as an example, not as current pricing (read "
        "2026-12-01); what you pay depends on the provider, region, date and contract: enter it"
    )
    watts_per_core: float = 360 / 192
    watts_source: str = (
        "illustrative: 360 W over 192 hardware threads, the default TDP and thread count that "
        "published tables give for an AMD EPYC 9654 (hpctech.co.jp/product/amd-epyc-9004-series/, "
        "read 2026-12-01); the processor alone (no memory, fans or power supply), so a lower "
        "bound; enter your machine's"
    )


@dataclass(frozen=True)
class Setup:
    """How a training is laid out on cores: ``workers`` processes of ``threads`` threads."""

    workers: int
    threads: int

    @property
    def cores(self) -> int:
        return self.workers * self.threads

    @property
    def name(self) -> str:
        return f"{self.workers} worker{'s' * (self.workers > 1)} x {self.threads} thread" + (
            "s" * (self.threads > 1)
        )


EVAL_SAMPLES = 2048  # training samples between two evaluations: about 3.6 an epoch at any batch
WINDOW = 3  # evaluations the moving average spans: about 6,000 samples, under an epoch
HOLD = 1.25  # a count stands once its average has stayed above the target for 25% more steps


def eval_every(global_batch: int) -> int:
    """Steps between two evaluations: ``EVAL_SAMPLES`` samples' worth, at least 1."""
    return max(1, round(EVAL_SAMPLES / global_batch))


def moving_average(values: Sequence[float], window: int = WINDOW) -> list[float]:
    """The mean of each value and the ``window - 1`` before it, from the ``window``-th value on
    (shorter averages would swing as much as the values)."""
    return [sum(values[i - window + 1 : i + 1]) / window for i in range(window - 1, len(values))]


def steps_to_target(global_batch: int, target: float, seed: int, max_epochs: int,
                    lr: float = 0.05, data: str | None = None, threads: int = 1,
                    hold: float = HOLD) -> dict:  # fmt: skip
    """Train seed ``seed`` in this process (its own initial weights and data order: notebook
    06's loop, ``train_counting``), evaluating the test accuracy every
    ``eval_every(global_batch)`` steps. The count is the first evaluation from which the moving
    average of the last ``WINDOW`` accuracies stays at or above ``target``; the run stops once
    that has held for ``hold`` times its steps and ``WINDOW`` evaluations, or after
    ``max_epochs``. ``steps``: the count (``inf`` if none held), with every evaluation's step and
    accuracy."""
    har = load_har(data)
    X_test, y_test = torch.from_numpy(har.X_test), torch.from_numpy(har.y_test)
    config = TrainConfig(global_batch=global_batch, epochs=max_epochs, lr=lr, seed=seed,
                         data=har.source)  # fmt: skip
    every = eval_every(global_batch)
    marks = list(range(every, total_steps(config, len(har.y_train)) + 1, every))

    def count(done: list[int], accuracies: list[float]) -> int | None:
        # accuracy above the target is -accuracy below -target
        smoothed = [-a for a in moving_average(accuracies)]
        return stays_below(done[WINDOW - 1 :], smoothed, -target, hold, WINDOW)

    run = train_counting(har, config, marks, lambda model: accuracy(model, X_test, y_test), count,
                         threads)  # fmt: skip
    return {"global_batch": global_batch, "seed": seed,
            "steps": math.inf if run.count is None else run.count, "marks": run.marks,
            "accuracies": run.values}  # fmt: skip


def runs_to_target(global_batches: Sequence[int], seeds: Sequence[int], target: float,
                   max_epochs: int, data: str | None = None, threads: int = 1) -> pd.DataFrame:
    """``steps_to_target`` for every global batch and seed: one row per run."""
    return pd.DataFrame([steps_to_target(b, target, seed, max_epochs, data=data, threads=threads)
                         for b in global_batches for seed in seeds])  # fmt: skip


def steps_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per global batch, the seeds' steps to the target: their median (``steps``, what the costs
    use: finite while most seeds reached it), fewest and most, and how many seeds reached it."""
    by_batch = runs.groupby("global_batch")["steps"]
    return pd.DataFrame({
        "steps": by_batch.median(),
        "fewest": by_batch.min(),
        "most": by_batch.max(),
        "reached": by_batch.apply(lambda s: int(s.map(math.isfinite).sum())),
        "seeds": by_batch.size(),
    }).reset_index()  # fmt: skip


def timing_configs(global_batches: Sequence[int], n_samples: int, steps: int = 12,
                   data: str | None = None) -> list[TrainConfig]:  # fmt: skip
    """One configuration per global batch that takes ``steps`` steps: as many whole epochs as
    that needs (at 1024 of 7,415 samples an epoch holds only 7 steps), cut at ``steps``."""
    return [TrainConfig(global_batch=b, epochs=epochs_for_min_steps(b, n_samples, steps),
                        max_steps=steps, untimed_steps=UNTIMED, data=data)
            for b in global_batches]  # fmt: skip


def step_seconds(setups: Sequence[Setup], global_batches: Sequence[int], steps: int = 12,
                 data: str | None = None) -> pd.DataFrame:  # fmt: skip
    """Seconds per step of each setup at each global batch: ``steps`` steps, the first
    ``UNTIMED`` off the clock. One worker runs in this process; N workers in one launch (all
    batches one after the other). Columns: workers, threads, cores, global_batch, step_seconds;
    buckets: the bytes of each bucket DDP all-reduces a step, as DDP logged them; and calls: the
    collectives of an untimed step, counted (``StepCalls``, rank 0's; both empty for one worker),
    so that the all-reduces a step makes are read and counted, not assumed."""
    har = load_har(data)
    rows = []
    for setup in setups:
        configs = timing_configs(global_batches, len(har.y_train), steps, har.source)
        if setup.workers == 1:
            runs = [train_in_process(c, threads=setup.threads) for c in configs]
        else:
            runs = run_trainings(setup.workers, configs, threads_per_worker=setup.threads,
                                 probe=StepCalls())
        for config, run in zip(configs, runs, strict=True):
            timed = total_steps(config, len(har.y_train)) - UNTIMED
            probe = run.probes[0] if setup.workers > 1 else {"buckets": [], "calls": []}
            rows.append({"setup": setup.name, "workers": setup.workers, "threads": setup.threads,
                         "cores": setup.cores, "global_batch": config.global_batch,
                         "step_seconds": run.seconds / timed, "buckets": probe["buckets"],
                         "calls": probe["calls"]})  # fmt: skip
    return pd.DataFrame(rows)


def cost_table(steps: pd.DataFrame, reach: pd.DataFrame,
               prices: Prices = Prices()) -> pd.DataFrame:  # fmt: skip
    """Time, cost and energy to the target for every setup and global batch: ``steps`` from
    ``step_seconds``, ``reach`` with columns global_batch and steps (the steps to the target,
    ``steps_summary``). A batch that never reached the target gets ``inf`` throughout."""
    table = steps.merge(reach[["global_batch", "steps"]], on="global_batch")
    seconds = table["steps"] * table["step_seconds"]
    core_seconds = seconds * table["cores"]
    return table.assign(
        seconds=seconds,
        core_hours=core_seconds / 3600,
        usd=core_seconds / 3600 * prices.usd_per_core_hour,
        joules=core_seconds * prices.watts_per_core,
    )
