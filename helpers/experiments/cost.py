"""What reaching an accuracy costs, in time, money and energy, on 1 or N workers (notebook 11).

Every configuration here does the same training: DDP's N workers do what one worker does on the
whole global batch (notebook 03), so the epochs needed to reach a target test accuracy depend on
the global batch and the learning rate, not on how the work is split. ``epochs_to_target``
trains in this process until the target is reached (the same training, without workers); the
seconds per step of each configuration are measured separately (``step_seconds``: a short timed
run of each). Then, for each configuration and global batch::

    time   = epochs * steps per epoch * seconds per step
    cost   = time * cores * price per core-hour / 3600
    energy = time * cores * watts per core

Every core a configuration holds is paid for, busy or waiting. Start-up, evaluation and data
loading are left out (seconds here, the same for every configuration). ``Prices`` holds example
figures with their sources: replace them with your own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from helpers.data import load_har
from helpers.training import TrainConfig, accuracy, run_trainings, train_in_process, train_steps
from helpers.training.config import epochs_for_min_steps, make_model, steps_per_epoch, total_steps
from helpers.training.runs import torch_threads

UNTIMED = 2  # steps before the clock starts (DDP builds its buckets at the first)


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


class _Reached(Exception):
    """Raised from the per-epoch evaluation to stop the training at the target."""


def epochs_to_target(global_batch: int, target: float, max_epochs: int, lr: float = 0.05,
                     data: str | None = None, threads: int = 1) -> dict:  # fmt: skip
    """Train in this process, evaluating after each epoch, until the test accuracy reaches
    ``target`` (or ``max_epochs`` pass): the epochs it took (``inf`` if never) and the
    accuracy after each epoch."""
    har = load_har(data)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    X_test, y_test = torch.from_numpy(har.X_test), torch.from_numpy(har.y_test)
    config = TrainConfig(global_batch=global_batch, epochs=max_epochs, lr=lr, data=har.source)
    accuracies: list[float] = []

    def evaluate(model: torch.nn.Module) -> float:
        accuracies.append(accuracy(model, X_test, y_test))
        if accuracies[-1] >= target:
            raise _Reached
        return accuracies[-1]

    with torch_threads(threads), contextlib.suppress(_Reached):
        torch.manual_seed(config.seed)
        train_steps(make_model(config), X, y, config, evaluate=evaluate)
    reached = accuracies[-1] >= target if accuracies else False
    return {"global_batch": global_batch, "epochs": len(accuracies) if reached else math.inf,
            "accuracies": accuracies}  # fmt: skip


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
    batches one after the other). Columns: workers, threads, cores, global_batch, step_seconds."""
    har = load_har(data)
    rows = []
    for setup in setups:
        configs = timing_configs(global_batches, len(har.y_train), steps, har.source)
        if setup.workers == 1:
            runs = [train_in_process(c, threads=setup.threads) for c in configs]
        else:
            runs = run_trainings(setup.workers, configs, threads_per_worker=setup.threads)
        for config, run in zip(configs, runs, strict=True):
            timed = total_steps(config, len(har.y_train)) - UNTIMED
            rows.append({"setup": setup.name, "workers": setup.workers, "threads": setup.threads,
                         "cores": setup.cores, "global_batch": config.global_batch,
                         "step_seconds": run.seconds / timed})  # fmt: skip
    return pd.DataFrame(rows)


def cost_table(steps: pd.DataFrame, epochs: pd.DataFrame, n_samples: int,
               prices: Prices = Prices()) -> pd.DataFrame:  # fmt: skip
    """Time, cost and energy to the target for every setup and global batch: ``steps`` from
    ``step_seconds``, ``epochs`` with columns global_batch and epochs (from
    ``epochs_to_target``). A batch that never reached the target gets ``inf`` throughout."""
    table = steps.merge(epochs[["global_batch", "epochs"]], on="global_batch")
    per_epoch = table["global_batch"].map(lambda b: steps_per_epoch(n_samples, b))
    seconds = table["epochs"] * per_epoch * table["step_seconds"]
    core_seconds = seconds * table["cores"]
    return table.assign(
        seconds=seconds,
        core_hours=core_seconds / 3600,
        usd=core_seconds / 3600 * prices.usd_per_core_hour,
        joules=core_seconds * prices.watts_per_core,
    )

