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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, NamedTuple, Protocol, get_args

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import comm_hooks
from helpers.buckets import bucket_plan
from helpers.checkpoint import Checkpointer, CheckpointSpec
from helpers.comm_hooks import CommHook
from helpers.data import HARData, load_har
from helpers.launch import WorldPlan, available_cores, launch
from helpers.model import HIDDEN, gradient_bytes, make_mlp
from helpers.schedules import Constant, Schedule

# How the workers keep in step. The two that wrap the model: DDP (every worker holds the whole
# model and all-reduces the gradients) and FSDP2 (``fully_shard``: every worker holds a 1/N shard
# of the parameters, gradients and optimizer state; notebook 07). The other two are notebook 03's
# mistakes made switchable.
Sync = Literal["ddp", "fsdp2", "allreduce", "none"]
DDP_WRAP: Sync = "ddp"
FSDP2: Sync = "fsdp2"
OptimizerName = Literal["sgd", "momentum", "adam"]
MOMENTUM = 0.9  # SGD's momentum when optimizer="momentum"


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
    sync: Sync = "ddp"  # ddp: DDP; fsdp2: fully_shard (FSDP2), every Linear its own unit;
    #                     allreduce: average gradients by hand, no initial broadcast;
    #                     none: no communication at all, every worker trains alone
    reshard_after_forward: bool = True  # FSDP2 only: free the gathered parameters after forward
    seed_per_rank: bool = False  # each worker seeds torch with seed + rank
    order_per_rank: bool = False  # each worker shuffles with its own seed
    # the first steps run off the clock: DDP builds its buckets and allocates at the first one,
    # a cost paid once per training, not per step
    untimed_steps: int = 0
    record_loss: bool = False  # keep the global training loss of every step
    record_accuracy: bool = False  # test accuracy after every epoch (evaluation time not counted)
    return_weights: bool = False  # send every rank's final weights back (6.5 MB each)
    show_progress: bool = False  # rank 0 writes "epoch e/E" to the terminal (not in notebooks)
    # DDP's communication (notebook 06): the bucket cap in MiB (None: DDP's default, 25 MiB after
    # a first bucket of 1 MiB), the hook that all-reduces each bucket, PowerSGD's rank
    bucket_cap_mb: float | None = None
    comm_hook: CommHook = CommHook.ALLREDUCE
    powersgd_rank: int = 1
    # gradient accumulation: each worker's share of a global batch in this many micro-batches,
    # their gradients summed locally (DDP's no_sync()) and all-reduced once, after the last
    accumulation_steps: int = 1
    sync_every_micro_batch: bool = False  # the waste: no no_sync(), an all-reduce per micro-batch
    optimizer: OptimizerName = "sgd"  # sgd: no state; momentum: one buffer per weight; adam: two
    hidden: int = HIDDEN  # the MLP's width ...
    hidden_layers: int = 2  # ... and depth (notebook 07 widens it until it outgrows a worker)
    max_steps: int | None = None  # stop after this many steps (None: every step of every epoch)


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


def total_steps(config: TrainConfig, n_samples: int) -> int:
    """Steps the training takes: every full global batch of every epoch, or ``max_steps``."""
    steps = config.epochs * steps_per_epoch(n_samples, config.global_batch)
    return steps if config.max_steps is None else min(steps, config.max_steps)


def make_model(config: TrainConfig) -> nn.Sequential:
    """The MLP of the configured width and depth (the reference MLP by default)."""
    return make_mlp(hidden=config.hidden, hidden_layers=config.hidden_layers)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The configured optimizer over the model's parameters, whole or sharded: create it after
    wrapping, since FSDP2 replaces every parameter by its shard."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.lr)
    if config.optimizer == "momentum":
        return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=MOMENTUM)
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    raise ValueError(f"optimizer must be 'sgd', 'momentum' or 'adam', got {config.optimizer!r}")


def wrap_model(model: nn.Module, config: TrainConfig, comm_log: list | None = None) -> nn.Module:
    """Wrap a freshly built model as ``config.sync`` asks. Inside a process group.

    DDP broadcasts rank 0's weights and all-reduces the gradients in ``backward()``. FSDP2 keeps
    a ``1/N`` shard of every parameter on each worker: every ``Linear`` becomes one unit whose
    parameters are all-gathered just before its forward (and again before its backward, unless
    ``reshard_after_forward=False`` keeps them), and whose gradients are reduce-scattered, so
    that each worker ends with the averaged gradient of its own shard only. Every rank must build
    the same initial weights (the same seed): FSDP2 shards them where they are, it broadcasts
    nothing. Under DDP, with the configured bucket cap and communication hook (notebook 06;
    bucket timings appended to ``comm_log`` if given)."""
    if config.sync == "ddp":
        device = next(model.parameters()).device
        device_ids = None if device.type == "cpu" else [device]
        model = DDP(model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)
        comm_hooks.register(model, config.comm_hook, config.powersgd_rank, comm_log)
        return model
    if config.sync == "fsdp2":
        # imported here: every worker would otherwise pay about a second to import FSDP
        from torch.distributed.fsdp import fully_shard

        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, reshard_after_forward=config.reshard_after_forward)
        fully_shard(model, reshard_after_forward=config.reshard_after_forward)
    return model


def unwrapped(model: nn.Module, config: TrainConfig) -> nn.Module:
    """The plain model with whole weights: DDP's module, or, under FSDP2, a copy assembled from
    every rank's shards (all-gathers: every rank must call it)."""
    if isinstance(model, DDP):
        return model.module
    if config.sync == "fsdp2":
        from torch.distributed.tensor import DTensor

        whole = {
            name: value.full_tensor() if isinstance(value, DTensor) else value
            for name, value in model.state_dict().items()
        }
        with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten anyway
            plain = make_model(config)
        plain.load_state_dict(whole)
        return plain
    return model


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
    if config.max_steps is not None and config.max_steps < 1:
        raise ValueError(
            f"max_steps must be at least 1 (or None for every step), got {config.max_steps}"
        )
    if config.sync not in get_args(Sync):
        raise ValueError(f"sync must be one of {', '.join(get_args(Sync))}, got {config.sync!r}")
    steps = total_steps(config, n_samples)
    if not 0 <= config.untimed_steps < steps:
        raise ValueError(
            f"untimed_steps must be from 0 to {steps - 1} (the training takes {steps} steps), "
            f"got {config.untimed_steps}"
        )
    local = config.global_batch // world_size
    if config.accumulation_steps < 1 or local % config.accumulation_steps:
        raise ValueError(
            f"each worker's {local} samples per step cannot be split into "
            f"{config.accumulation_steps} equal micro-batches: choose accumulation_steps that "
            "divides global_batch / workers"
        )
    validate_communication(config)


def validate_communication(config: TrainConfig) -> None:
    """Refuse hooks that cannot run here (``comm_hooks.check_hook``) and options that only DDP
    has, before any worker starts."""
    if config.sync != "ddp" and (
        config.comm_hook is not CommHook.ALLREDUCE or config.bucket_cap_mb is not None
    ):
        raise ValueError(
            f"comm_hook and bucket_cap_mb are DDP's options: use sync='ddp', not {config.sync!r}"
        )
    if not isinstance(config.comm_hook, CommHook):
        raise ValueError(f"comm_hook must be a CommHook, got {config.comm_hook!r}")
    if config.bucket_cap_mb is not None and not config.bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be positive (or None), got {config.bucket_cap_mb}")
    if config.powersgd_rank < 1:
        raise ValueError(f"powersgd_rank must be at least 1, got {config.powersgd_rank}")
    with torch.random.fork_rng(devices=[]):  # leaves the caller's random state as it was
        model = make_model(config)
    comm_hooks.check_hook(
        config.comm_hook,
        len(bucket_plan(model, config.bucket_cap_mb)),
        gradient_bytes=gradient_bytes(model),
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
    optimizer: torch.optim.Optimizer | None = None  # with its state (Adam's moments, momentum)


AfterStep = Callable[[int, nn.Module, torch.optim.Optimizer], None]


def train_steps(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    rank: int = 0,
    world_size: int = 1,
    evaluate: Callable[[nn.Module], float] | None = None,
    after_step: AfterStep | None = None,
    checkpoint: Checkpointer | None = None,
) -> Loop:
    """The training loop, on one screen: every epoch the same order on every worker, every step
    this rank's slice of the global batch. The model comes wrapped (DDP, FSDP2) or not; the
    loop is the same. The training time is ``perf_counter()`` afterwards minus ``clock_start``
    minus ``eval_seconds``. ``after_step(step, model, optimizer)``, if given, runs after every
    step (notebook 07 accounts memory there). With a ``checkpoint``, it starts from the latest
    checkpoint (the same epoch and step within it) and saves as it goes (notebook 08)."""
    optimizer = make_optimizer(model, config)
    steps, last = steps_per_epoch(len(X), config.global_batch), total_steps(config, len(X))
    losses = torch.zeros(last if config.record_loss else 0)
    start = checkpoint.restore(model, optimizer, losses, steps) if checkpoint else 0
    accuracies, eval_seconds, step, clock_start = [], 0.0, start, time.perf_counter()
    for epoch in range(start // steps, config.epochs):
        order = worker_order(len(X), epoch, rank, config.order_per_rank)
        for i in range(start % steps if epoch == start // steps else 0, steps):
            if step == last:
                break
            if step == config.untimed_steps > 0:
                clock_start, eval_seconds = time.perf_counter(), 0.0
            batch = order[i * config.global_batch : (i + 1) * config.global_batch]
            idx = local_slice(batch, rank, world_size)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(config, step, steps)
            optimizer.zero_grad()
            loss = forward_backward(model, X, y, idx, config)  # under DDP, also averages
            if config.sync == "allreduce" and world_size > 1:
                _average_gradients(model, world_size)
            optimizer.step()
            if config.record_loss:
                losses[step] = loss
            if after_step is not None:
                after_step(step, model, optimizer)
            step += 1
            if checkpoint:
                checkpoint.after_step(model, optimizer, losses, step, steps, last)
        else:  # a whole epoch: evaluate after it
            if evaluate is not None:
                started = time.perf_counter()
                accuracies.append(evaluate(model))
                eval_seconds += time.perf_counter() - started
            if config.show_progress and rank == 0:
                print(f"  epoch {epoch + 1}/{config.epochs}", end="\r", file=sys.stderr, flush=True)
            continue
        break  # stopped by max_steps: no evaluation of a partial epoch
    return Loop(losses, accuracies, eval_seconds, clock_start, optimizer)


def forward_backward(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, config: TrainConfig
) -> torch.Tensor:
    """The gradient of the mean loss over this rank's samples ``idx``, in
    ``config.accumulation_steps`` equal micro-batches: each micro-batch's mean loss divided by
    their number, so the summed gradients are the whole slice's. Under DDP every micro-batch but
    the last runs in ``no_sync()`` (no all-reduce), unless ``sync_every_micro_batch``. Returns the
    slice's mean loss."""
    k = config.accumulation_steps
    total = torch.zeros(())
    for j, micro in enumerate(idx.view(k, -1)):
        quiet = isinstance(model, DDP) and j < k - 1 and not config.sync_every_micro_batch
        with model.no_sync() if quiet else nullcontext():
            loss = F.cross_entropy(model(X[micro]), y[micro]) / k
            loss.backward()
        total += loss.detach()
    return total


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


def build_model(
    config: TrainConfig, rank: int = 0, comm_log: list | None = None, device: str = "cpu"
) -> nn.Module:
    """This rank's model from the configured seed, on ``device``, wrapped as ``config.sync`` asks
    (``wrap_model``; under DDP with its bucket timings appended to ``comm_log`` if given)."""
    torch.manual_seed(config.seed + (rank if config.seed_per_rank else 0))
    return wrap_model(make_model(config).to(device), config, comm_log)


def run_identity(config: TrainConfig) -> dict:
    """What makes two runs the same training, for refusing to resume another run's checkpoint
    (the world size is not in it: every world size does the same training)."""
    keys = ("global_batch", "epochs", "max_steps", "lr", "seed", "data", "sync", "optimizer",
            "hidden", "hidden_layers", "accumulation_steps", "powersgd_rank", "seed_per_rank",
            "order_per_rank")  # fmt: skip
    return {
        **{k: getattr(config, k) for k in keys},
        "schedule": repr(config.schedule),
        "comm_hook": config.comm_hook.value,
    }


class Probe(Protocol):
    """Measurements taken inside a worker around the training (``helpers.sharding``'s
    ``ShardingProbe``): ``start`` before the model is built, ``after_step`` after every step,
    ``finish`` after the last, whose dict comes back in ``RunResult.probes``."""

    def start(self, rank: int, world_size: int) -> None: ...

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        ...

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict: ...


def train_worker(
    rank: int,
    world_size: int,
    config: TrainConfig,
    probe: Probe | None = None,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> dict:
    """One worker's share of the training. Runs inside a process group (``helpers.launch``, or
    torchrun through ``helpers.train``). With ``checkpoint``, resumes from its latest checkpoint
    and saves every ``checkpoint.every`` steps. ``device``: "cpu", or "cuda:N" under NCCL."""
    return train_worker_many(rank, world_size, [config], probe, checkpoint, device)[0]


def launch_data_source(configs: Sequence[TrainConfig]) -> str | None:
    """The one data source of trainings launched together: a mix is refused."""
    if len({c.data for c in configs}) > 1:
        raise ValueError("the trainings of one launch must use the same data source")
    return configs[0].data


def worker_data(
    configs: Sequence[TrainConfig], world_size: int, device: str = "cpu"
) -> tuple[HARData, torch.Tensor, torch.Tensor]:
    """Inside a worker: the training data the configs name, its split as tensors on ``device``,
    every config checked against it (``validate``) before anything trains."""
    data = load_har(launch_data_source(configs), download=False)
    X, y = torch.from_numpy(data.X_train).to(device), torch.from_numpy(data.y_train).to(device)
    for config in configs:
        validate(config, world_size, len(X))
    return data, X, y


def train_worker_many(
    rank: int,
    world_size: int,
    configs: Sequence[TrainConfig],
    probe: Probe | None = None,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> list[dict]:
    """One worker's share of several trainings, one after the other, in one process group: the
    start-up (processes, imports, data) is paid once. Every config must name the same data."""
    if checkpoint is not None and len(configs) > 1:
        raise ValueError("a checkpoint folder holds one training: launch the others without it")
    data, X, y = worker_data(configs, world_size, device)
    for config in configs:
        if config.record_accuracy and device != "cpu":
            raise ValueError("record_accuracy evaluates on the CPU: train on the CPU to record it")
    return [
        _train_one(rank, world_size, config, data, X, y, probe, checkpoint, device)
        for config in configs
    ]


def _train_one(
    rank: int,
    world_size: int,
    config: TrainConfig,
    data: HARData,
    X: torch.Tensor,
    y: torch.Tensor,
    probe: Probe | None = None,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> dict:
    if probe is not None:
        probe.start(rank, world_size)
    model = build_model(config, rank, device=device)
    saver = Checkpointer(checkpoint, run_identity(config), rank) if checkpoint else None
    dist.barrier()  # start the clock when every worker is ready
    ready_at = time.time()
    evaluate = test_accuracy_of(data) if config.record_accuracy else None
    after_step = probe.after_step if probe is not None else None
    loop = train_steps(model, X, y, config, rank, world_size, evaluate, after_step, saver)
    seconds = time.perf_counter() - loop.clock_start - loop.eval_seconds
    losses, epoch_accuracies = loop.losses, loop.epoch_accuracies
    probed = probe.finish(model, loop.optimizer) if probe is not None else None

    if config.record_loss and config.sync != "none":
        dist.all_reduce(losses)  # equal slices: the global loss is the mean of the local ones
        losses /= world_size
    net = unwrapped(model, config).cpu()
    return _report(
        net,
        data,
        config,
        rank=rank,
        seconds=seconds,
        ready_at=ready_at,
        steps=total_steps(config, len(X)),
        losses=losses.tolist(),
        epoch_accuracies=epoch_accuracies,
        probe=probed,
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
    sync: str = "ddp"
    reshard_after_forward: bool = True
    probes: list[dict | None] = field(default_factory=list, repr=False)  # rank by rank

    def to_record(self) -> dict:
        """A JSON-friendly dict (without the per-step losses and weights)."""
        record = asdict(self)
        record.pop("losses")
        record.pop("weights")
        record.pop("epoch_accuracies")
        record.pop("probes")
        record.pop("sync")
        record.pop("reshard_after_forward")
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
        sync=config.sync,
        reshard_after_forward=config.reshard_after_forward,
        probes=[r["probe"] for r in reports],
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
        steps=total_steps(config, len(X)),
        data_source=data.source,
        losses=losses.tolist(),
        weights=[r["weights"]],
        epoch_accuracies=epoch_accuracies,
    )


def final_weights(model: nn.Module) -> np.ndarray:
    """Every weight flattened into one float64 vector, for comparing two trainings."""
    return np.concatenate([p.detach().double().numpy().ravel() for p in model.parameters()])
