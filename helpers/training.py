"""The reference experiment: the same SGD training of the MLP, split across N workers.

Every worker starts from the same weights (``torch.manual_seed(0)``), visits the data in the same
order (``randperm`` seeded by the epoch) and takes its ``global_batch // world`` slice of every
global batch. DDP averages the gradients, so the N replicas stay identical and do, divided up,
the training one worker would do on the whole global batch. The incomplete last global batch of
an epoch is dropped, so every world size takes exactly the same steps.

``train_worker`` runs inside each worker process (see ``helpers.launch``); ``run_training`` is
what a notebook or the command line calls.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.checkpoint import Checkpointer, CheckpointSpec
from helpers.data import HARData, load_har
from helpers.launch import WorldPlan, available_cores, launch
from helpers.model import make_mlp
from helpers.schedules import Constant, Schedule

Sync = Literal["ddp", "allreduce", "none"]


@dataclass(frozen=True)
class TrainConfig:
    """One training run. The defaults are the reference experiment."""

    global_batch: int = 256
    epochs: int = 5
    lr: float = 0.05
    schedule: Schedule = field(default_factory=Constant)  # multiplies lr, step by step
    seed: int = 0
    # auto | uci | recordings | standin; None: $HAR_DATA, else auto (resolved once by the
    # caller, so that every worker loads the same data)
    data: str | None = None
    # The common mistakes, made switchable so that a notebook can show what they do:
    sync: Sync = "ddp"  # ddp: DDP; allreduce: average gradients by hand, no initial broadcast;
    #                     none: no communication at all, every worker trains alone
    seed_per_rank: bool = False  # each worker seeds torch with seed + rank
    order_per_rank: bool = False  # each worker shuffles with its own seed
    # the first steps run off the clock: DDP builds its buckets and allocates at the first one,
    # a cost paid once per training, not per step
    untimed_steps: int = 0
    record_loss: bool = False  # keep the global training loss of every step
    record_accuracy: bool = False  # test accuracy after every epoch (evaluation time not counted)
    return_weights: bool = False  # send every rank's final weights back (6.5 MB each)
    show_progress: bool = False  # rank 0 writes "epoch e/E" to the terminal (not in notebooks)


def local_slice(global_batch_indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous ``global_batch // world_size`` share of one global batch."""
    local = len(global_batch_indices) // world_size
    return global_batch_indices[rank * local : (rank + 1) * local]


def epoch_order(n: int, epoch: int, seed_offset: int = 0) -> torch.Tensor:
    """The order in which an epoch visits the samples: the same on every worker."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch + seed_offset))


def worker_order(n: int, epoch: int, rank: int, order_per_rank: bool = False) -> torch.Tensor:
    """The order this rank visits the samples in: the shared ``epoch_order``, or, for the
    "different data orders" mistake, one of its own."""
    return epoch_order(n, epoch, 1000 * rank if order_per_rank else 0)


def steps_per_epoch(n_samples: int, global_batch: int) -> int:
    """Full global batches per epoch (the incomplete last one is dropped)."""
    return n_samples // global_batch


def epochs_for_min_steps(global_batch: int, n_samples: int, min_steps: int) -> int:
    """Whole epochs, at least one, that take at least ``min_steps`` steps: what a timing needs
    at a large batch (one epoch at 4096 of 7,352 samples is a single step)."""
    if min_steps < 1:
        raise ValueError(f"min_steps must be at least 1, got {min_steps}")
    per_epoch = steps_per_epoch(n_samples, global_batch)
    if per_epoch < 1:
        raise ValueError(f"global batch {global_batch} is larger than the {n_samples} samples")
    return max(1, math.ceil(min_steps / per_epoch))


def lr_at(config: TrainConfig, step: int, steps_per_epoch: int) -> float:
    """The learning rate the training loop sets at ``step``: the configured lr times the
    schedule's factor."""
    return config.lr * config.schedule.factor(step, steps_per_epoch)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run a block with ``threads`` intra-op threads in this process, then restore the count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def weights_checksum(model: nn.Module) -> float:
    """Sum of every weight in float64, as in the reference article: equal replicas, equal sums."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def weights_digest(model: nn.Module) -> str:
    """SHA-256 of every weight's bytes: replicas are identical only if these match exactly."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of samples whose highest-scoring class is the label."""
    model.eval()
    correct = (model(X).argmax(dim=1) == y).float().mean().item()
    model.train()
    return correct


def validate(config: TrainConfig, world_size: int, n_samples: int) -> None:
    """Refuse configurations that cannot split evenly, with a message that says what to change."""
    if world_size < 1:
        raise ValueError(f"the number of workers must be at least 1, got {world_size}")
    if config.global_batch < 1 or config.epochs < 1:
        raise ValueError(
            f"global batch and epochs must be at least 1, got {config.global_batch} "
            f"and {config.epochs}"
        )
    if config.global_batch % world_size:
        raise ValueError(
            f"global batch {config.global_batch} is not divisible by {world_size} workers: "
            "choose a global batch that is a multiple of the number of workers"
        )
    if config.global_batch > n_samples:
        raise ValueError(
            f"global batch {config.global_batch} is larger than the {n_samples} training samples"
        )
    steps = config.epochs * steps_per_epoch(n_samples, config.global_batch)
    if not 0 <= config.untimed_steps < steps:
        raise ValueError(
            f"untimed_steps must be from 0 to {steps - 1} (the training takes {steps} steps), "
            f"got {config.untimed_steps}"
        )


def _average_gradients(model: nn.Module, world_size: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size


class Loop(NamedTuple):
    """What ``train_steps`` hands back besides the trained model."""

    losses: torch.Tensor  # this rank's loss at every step (empty unless record_loss)
    epoch_accuracies: list[float]  # test accuracy after every epoch (if evaluated)
    eval_seconds: float  # time spent evaluating after the clock started: not training
    clock_start: float  # perf_counter() at the first timed step (after config.untimed_steps)


def train_steps(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    rank: int = 0,
    world_size: int = 1,
    evaluate: Callable[[nn.Module], float] | None = None,
    checkpoint: Checkpointer | None = None,
) -> Loop:
    """The training loop, on one screen: every epoch the same order on every worker, every step
    this rank's slice of the global batch. The training time is ``perf_counter()`` afterwards
    minus ``clock_start`` minus ``eval_seconds``. With a ``checkpoint``, it starts from the
    latest checkpoint (the same epoch and step within it) and saves as it goes."""
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    steps = steps_per_epoch(len(X), config.global_batch)
    losses = torch.zeros(config.epochs * steps if config.record_loss else 0)
    start = checkpoint.restore(model, optimizer, losses, steps) if checkpoint else 0
    accuracies, eval_seconds, step, clock_start = [], 0.0, start, time.perf_counter()
    for epoch in range(start // steps, config.epochs):
        order = worker_order(len(X), epoch, rank, config.order_per_rank)
        for i in range(start % steps if epoch == start // steps else 0, steps):
            if step == config.untimed_steps > 0:
                clock_start, eval_seconds = time.perf_counter(), 0.0
            batch = order[i * config.global_batch : (i + 1) * config.global_batch]
            idx = local_slice(batch, rank, world_size)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(config, step, steps)
            loss = F.cross_entropy(model(X[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()  # under DDP, this also averages the gradients across workers
            if config.sync == "allreduce" and world_size > 1:
                _average_gradients(model, world_size)
            optimizer.step()
            if config.record_loss:
                losses[step] = loss.detach()
            step += 1
            if checkpoint:
                checkpoint.after_step(model, optimizer, losses, step, steps, config.epochs * steps)
        if evaluate is not None:
            started = time.perf_counter()
            accuracies.append(evaluate(model))
            eval_seconds += time.perf_counter() - started
        if config.show_progress and rank == 0:
            print(f"  epoch {epoch + 1}/{config.epochs}", end="\r", file=sys.stderr, flush=True)
    return Loop(losses, accuracies, eval_seconds, clock_start)


def test_accuracy_of(data: HARData) -> Callable[[nn.Module], float]:
    """A function giving a model's accuracy on the test split."""
    X_test, y_test = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    return lambda model: accuracy(model, X_test, y_test)


def _report(net: nn.Module, data: HARData, config: TrainConfig, **fields) -> dict:
    return {
        **fields,
        "checksum": weights_checksum(net),
        "digest": weights_digest(net),
        "accuracy": test_accuracy_of(data)(net),
        "data_source": data.source,
        "weights": final_weights(net) if config.return_weights else None,
    }


def run_identity(config: TrainConfig) -> dict:
    """What makes two runs the same training, for refusing to resume another run's checkpoint
    (the world size is not in it: every world size does the same training)."""
    keys = ("global_batch", "epochs", "lr", "seed", "data", "sync", "seed_per_rank",
            "order_per_rank")  # fmt: skip
    return {**{k: getattr(config, k) for k in keys}, "schedule": repr(config.schedule)}


def train_worker(
    rank: int,
    world_size: int,
    config: TrainConfig,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> dict:
    """One worker's share of the training. Runs inside a process group (``helpers.launch``, or
    torchrun through ``helpers.train``). With ``checkpoint``, resumes from its latest checkpoint
    and saves every ``checkpoint.every`` steps. ``device``: "cpu", or "cuda:N" under NCCL."""
    data = load_har(config.data, download=False)
    X, y = torch.from_numpy(data.X_train).to(device), torch.from_numpy(data.y_train).to(device)
    validate(config, world_size, len(X))
    if config.record_accuracy and device != "cpu":
        raise ValueError("record_accuracy evaluates on the CPU: train on the CPU to record it")

    torch.manual_seed(config.seed + (rank if config.seed_per_rank else 0))
    model = make_mlp().to(device)
    if config.sync == "ddp":
        # broadcasts rank 0's weights; averages gradients in backward()
        model = DDP(model, device_ids=None if device == "cpu" else [torch.device(device)])
    saver = Checkpointer(checkpoint, run_identity(config), rank) if checkpoint else None

    dist.barrier()  # start the clock when every worker is ready
    ready_at = time.time()
    evaluate = test_accuracy_of(data) if config.record_accuracy else None
    loop = train_steps(model, X, y, config, rank, world_size, evaluate, saver)
    seconds = time.perf_counter() - loop.clock_start - loop.eval_seconds
    losses, epoch_accuracies = loop.losses, loop.epoch_accuracies

    if config.record_loss and config.sync != "none":
        dist.all_reduce(losses)  # equal slices: the global loss is the mean of the local ones
        losses /= world_size
    net = (model.module if isinstance(model, DDP) else model).cpu()
    return _report(
        net,
        data,
        config,
        rank=rank,
        seconds=seconds,
        ready_at=ready_at,
        steps=steps_per_epoch(len(X), config.global_batch) * config.epochs,
        losses=losses.tolist(),
        epoch_accuracies=epoch_accuracies,
        resumed_from=saver.resumed_from if saver else 0,
        checkpoints_saved=saver.saved if saver else [],
    )


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

    def to_record(self) -> dict:
        """A JSON-friendly dict (without the per-step losses and weights)."""
        record = asdict(self)
        record.pop("losses")
        record.pop("weights")
        record.pop("epoch_accuracies")
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
    if isinstance(world, WorldPlan):
        world, threads_per_worker, oversubscribed = (
            world.world_size,
            world.threads_per_worker,
            world.oversubscribed,
        )
    data = load_har(config.data)  # download or generate and cache once, here, not in N workers
    validate(config, world, len(data.X_train))
    config = replace(config, data=data.source)  # workers load exactly what was resolved here
    asked_at = time.time()
    reports = launch(
        train_worker, world, config, threads_per_worker=threads_per_worker, **launch_options
    )
    return summarise(reports, config, threads_per_worker, asked_at, oversubscribed)


def summarise(
    reports: list[dict],
    config: TrainConfig,
    threads_per_worker: int,
    asked_at: float,
    oversubscribed: bool = False,
) -> RunResult:
    """One ``RunResult`` from every rank's ``train_worker`` report, in rank order (whoever
    launched them: ``helpers.launch`` or torchrun). ``asked_at``: ``time.time()`` when the
    workers were asked for."""
    return RunResult(
        world=len(reports),
        global_batch=config.global_batch,
        epochs=config.epochs,
        threads_per_worker=threads_per_worker,
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
    )


def train_in_process(config: TrainConfig = TrainConfig(), threads: int | None = None) -> RunResult:
    """The same training in this process, no workers: what N workers do, divided up (notebook 03
    shows they agree), so experiments about *what* is learnt can skip the start-up cost."""
    data = load_har(config.data)
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    validate(config, 1, len(X))
    with torch_threads(threads or available_cores()):
        torch.manual_seed(config.seed)
        model = make_mlp()
        evaluate = test_accuracy_of(data) if config.record_accuracy else None
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
        steps=steps_per_epoch(len(X), config.global_batch) * config.epochs,
        data_source=data.source,
        losses=losses.tolist(),
        weights=[r["weights"]],
        epoch_accuracies=epoch_accuracies,
    )


def final_weights(model: nn.Module) -> np.ndarray:
    """Every weight flattened into one float64 vector, for comparing two trainings."""
    return np.concatenate([p.detach().double().numpy().ravel() for p in model.parameters()])
