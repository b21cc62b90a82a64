"""One training run's configuration (``TrainConfig``), checked before any worker starts.

The defaults are the reference experiment: every worker starts from the same weights
(``torch.manual_seed(0)``), visits the data in the same order and takes its
``global_batch // world`` slice of every global batch; SGD with lr 0.05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import nn

from helpers.dist import comm_hooks
from helpers.dist.buckets import bucket_plan
from helpers.dist.comm_hooks import CommHook
from helpers.training.model import HIDDEN, gradient_bytes, make_mlp
from helpers.training.schedules import Constant, Schedule

# How the workers keep in step. The two that wrap the model: DDP (every worker holds the whole
# model and all-reduces the gradients) and FSDP2 (``fully_shard``: every worker holds a 1/N shard
# of the parameters, gradients and optimizer state; notebook 08). The other two are notebook 03's
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
    # DDP's communication (notebook 07): the bucket cap in MiB (None: DDP's default, 25 MiB after
    # a first bucket of 1 MiB), the hook that all-reduces each bucket, PowerSGD's rank
    bucket_cap_mb: float | None = None
    comm_hook: CommHook = CommHook.ALLREDUCE
    powersgd_rank: int = 1
    # PowerSGD compresses from this step on (2, the earliest: short timings); a training follows
    # PyTorch's advice of about 10% of its steps first with comm_hooks.powersgd_start_iter
    powersgd_start_iter: int = comm_hooks.POWERSGD_START_ITER
    # gradient accumulation: each worker's share of a global batch in this many micro-batches,
    # their gradients summed locally (DDP's no_sync()) and all-reduced once, after the last
    accumulation_steps: int = 1
    sync_every_micro_batch: bool = False  # the waste: no no_sync(), an all-reduce per micro-batch
    optimizer: OptimizerName = "sgd"  # sgd: no state; momentum: one buffer per weight; adam: two
    hidden: int = HIDDEN  # the MLP's width ...
    hidden_layers: int = 2  # ... and depth (notebook 08 widens it until it outgrows a worker)
    max_steps: int | None = None  # stop after this many steps (None: every step of every epoch)
    # intra-op threads for this training alone (None: the launch's threads per worker), so that
    # one launch can interleave layouts of one worker (05's single device beside one thread)
    threads: int | None = None

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

def total_steps(config: TrainConfig, n_samples: int) -> int:
    """Steps the training takes: every full global batch of every epoch, or ``max_steps``."""
    steps = config.epochs * steps_per_epoch(n_samples, config.global_batch)
    return steps if config.max_steps is None else min(steps, config.max_steps)

def lr_at(config: TrainConfig, step: int, steps_per_epoch: int) -> float:
    """The learning rate the training loop sets at ``step``: the configured lr times the
    schedule's factor."""
    return config.lr * config.schedule.factor(step, steps_per_epoch)

def make_model(config: TrainConfig) -> nn.Sequential:
    """The MLP of the configured width and depth (the reference MLP by default)."""
    return make_mlp(hidden=config.hidden, hidden_layers=config.hidden_layers)

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
    if config.threads is not None and config.threads < 1:
        raise ValueError(f"threads must be at least 1 (None: the launch's), got {config.threads}")
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
    if config.powersgd_start_iter < comm_hooks.POWERSGD_START_ITER:
        raise ValueError(
            f"powersgd_start_iter must be at least {comm_hooks.POWERSGD_START_ITER} (DDP "
            f"rebuilds its buckets after step 1), got {config.powersgd_start_iter}"
        )
    # shapes only, on the meta device: a check allocates no memory (a worker's peak resident
    # memory is its training's) and draws no random numbers from the caller's generator
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = make_model(config)
    comm_hooks.check_hook(
        config.comm_hook,
        len(bucket_plan(model, config.bucket_cap_mb)),
        gradient_bytes=gradient_bytes(model),
    )

def run_identity(config: TrainConfig) -> dict:
    """What makes two runs the same training, for refusing to resume another run's checkpoint
    (the world size is not in it: every world size does the same training)."""
    keys = ("global_batch", "epochs", "max_steps", "lr", "seed", "data", "sync", "optimizer",
            "hidden", "hidden_layers", "accumulation_steps", "powersgd_rank", "powersgd_start_iter",
            "seed_per_rank",
            "order_per_rank")  # fmt: skip
    return {
        **{k: getattr(config, k) for k in keys},
        "schedule": repr(config.schedule),
        "comm_hook": config.comm_hook.value,
    }
