"""Trainings run from a notebook or the command line: N worker processes launched, their reports
summarised in a ``RunResult``; or the same training in this process, for experiments about what
is learnt rather than how fast."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from helpers.data import load_har
from helpers.dist.cores import WorldPlan, available_cores
from helpers.dist.launch import launch
from helpers.training.config import TrainConfig, make_model, total_steps, validate
from helpers.training.loop import train_steps
from helpers.training.metrics import accuracy_on_test
from helpers.training.worker import _report, launch_data_source, torch_threads, train_worker_many


@dataclass
class RunResult:
    """What one training run across ``world`` workers measured."""

    world: int
    global_batch: int
    epochs: int
    threads_per_worker: int
    seconds: float  # the slowest worker's training time, after a barrier
    startup_seconds: float  # from asking for workers to all of them ready to train
    accuracy: float  # rank 0's test accuracy
    replicas_identical: bool
    checksums: list[float]
    accuracies: list[float]
    steps: int
    data_source: str
    oversubscribed: bool = False
    losses: list[float] = field(default_factory=list, repr=False)
    weights: list[np.ndarray | None] = field(default_factory=list, repr=False)
    epoch_accuracies: list[float] = field(default_factory=list, repr=False)
    sync: str = "ddp"
    reshard_after_forward: bool = True
    probes: list[dict | None] = field(default_factory=list, repr=False)  # rank by rank
    # SHA-256 of each rank's weights (weights_digest): equal digests, the same bits
    digests: list[str] = field(default_factory=list, repr=False)

    def to_record(self) -> dict:
        """A JSON-friendly dict (without the per-step losses and weights)."""
        record = asdict(self)
        record.pop("losses")
        record.pop("weights")
        record.pop("epoch_accuracies")
        record.pop("probes")
        record.pop("sync")
        record.pop("reshard_after_forward")
        record.pop("digests")
        return record

def run_training(
    world: int | WorldPlan,
    config: TrainConfig = TrainConfig(),
    threads_per_worker: int = 1,
    oversubscribed: bool = False,
    **launch_options,
) -> RunResult:
    """Train across ``world`` worker processes and summarise what they report. ``world`` may
    be a ``WorldPlan`` (from ``plan_world_sizes``), which brings its threads and flags along."""
    return run_trainings(world, [config], threads_per_worker, oversubscribed, **launch_options)[0]

def run_trainings(
    world: int | WorldPlan,
    configs: Sequence[TrainConfig],
    threads_per_worker: int = 1,
    oversubscribed: bool = False,
    **launch_options,
) -> list[RunResult]:
    """Several trainings on the same ``world`` workers, one after the other, in one launch: what
    ``run_training`` does for each, with the workers' start-up paid once."""
    if isinstance(world, WorldPlan):
        world, threads_per_worker, oversubscribed = (
            world.world_size,
            world.threads_per_worker,
            world.oversubscribed,
        )
    if not configs:
        raise ValueError("give at least one TrainConfig")
    data = load_har(launch_data_source(configs))  # downloaded or built once, not in every worker
    for config in configs:
        validate(config, world, len(data.X_train))
        if (config.threads or 0) > threads_per_worker and not oversubscribed:
            raise ValueError(
                f"a training asks for {config.threads} threads where its launch reserved "
                f"{threads_per_worker} per worker: launch with threads_per_worker="
                f"{config.threads}, or pass oversubscribed=True to time contention on purpose"
            )
    configs = [replace(c, data=data.source) for c in configs]  # workers load what was resolved
    asked_at = time.time()
    per_rank = launch(
        train_worker_many, world, configs, threads_per_worker=threads_per_worker, **launch_options
    )
    return [
        summarise(
            [reports[i] for reports in per_rank],
            config,
            threads_per_worker,
            asked_at,
            oversubscribed,
        )
        for i, config in enumerate(configs)
    ]

def summarise(
    reports: list[dict],
    config: TrainConfig,
    threads_per_worker: int,
    asked_at: float,
    oversubscribed: bool = False,
) -> RunResult:
    """One ``RunResult`` from every rank's ``train_worker`` report, in rank order (whoever
    launched them: ``helpers.dist.launch`` or torchrun). ``asked_at``: ``time.time()`` when the
    workers were asked for."""
    return RunResult(
        world=len(reports),
        global_batch=config.global_batch,
        epochs=config.epochs,
        threads_per_worker=config.threads or threads_per_worker,
        seconds=max(r["seconds"] for r in reports),
        startup_seconds=max(r["ready_at"] for r in reports) - asked_at,
        accuracy=reports[0]["accuracy"],
        replicas_identical=len({r["digest"] for r in reports}) == 1,
        checksums=[r["checksum"] for r in reports],
        accuracies=[r["accuracy"] for r in reports],
        steps=reports[0]["steps"],
        data_source=reports[0]["data_source"],
        oversubscribed=oversubscribed,
        losses=reports[0]["losses"],
        weights=[r["weights"] for r in reports],
        epoch_accuracies=reports[0]["epoch_accuracies"],
        sync=config.sync,
        reshard_after_forward=config.reshard_after_forward,
        probes=[r["probe"] for r in reports],
        digests=[r["digest"] for r in reports],
    )

def train_in_process(config: TrainConfig = TrainConfig(), threads: int | None = None) -> RunResult:
    """The same training in this process, no workers: what N workers do, divided up (notebook 03
    shows they agree), so experiments about *what* is learnt can skip the start-up cost."""
    data = load_har(config.data)
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    validate(config, 1, len(X))
    with torch_threads(threads or available_cores()):
        torch.manual_seed(config.seed)
        model = make_model(config)
        evaluate = accuracy_on_test(data) if config.record_accuracy else None
        loop = train_steps(model, X, y, config, evaluate=evaluate)
        seconds = time.perf_counter() - loop.clock_start - loop.eval_seconds
        losses, epoch_accuracies = loop.losses, loop.epoch_accuracies
    r = _report(model, data, config)
    return RunResult(
        world=1,
        global_batch=config.global_batch,
        epochs=config.epochs,
        threads_per_worker=threads or available_cores(),
        seconds=seconds,
        startup_seconds=0.0,
        accuracy=r["accuracy"],
        replicas_identical=True,
        checksums=[r["checksum"]],
        accuracies=[r["accuracy"]],
        steps=total_steps(config, len(X)),
        data_source=data.source,
        losses=losses.tolist(),
        weights=[r["weights"]],
        epoch_accuracies=epoch_accuracies,
        digests=[r["digest"]],
    )
