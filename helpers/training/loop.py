"""The training loop: every step, this rank's slice of the global batch, forward, backward (where
DDP averages the gradients), the optimizer's step. The model comes wrapped (DDP, FSDP2) or not;
the loop is the same."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist.checkpoint import Checkpointer
from helpers.training.config import TrainConfig, lr_at, steps_per_epoch, total_steps
from helpers.training.order import local_slice, worker_order
from helpers.training.wrap import make_optimizer


class Loop(NamedTuple):
    """What ``train_steps`` hands back besides the trained model."""

    losses: torch.Tensor  # this rank's loss at every step (empty unless record_loss)
    epoch_accuracies: list[float]  # test accuracy after every epoch (if evaluated)
    eval_seconds: float  # time spent evaluating after the clock started: not training
    clock_start: float  # perf_counter() at the first timed step (after config.untimed_steps)
    optimizer: torch.optim.Optimizer | None = None  # with its state (Adam's moments, momentum)


# after_step(steps_done, model, optimizer): steps are counted from 1, as checkpoints count them
AfterStep = Callable[[int, nn.Module, torch.optim.Optimizer], None]


class _Clock:
    """The training's clock: started at the first timed step, with evaluation taken off it."""

    def __init__(self, untimed_steps: int) -> None:
        self.untimed_steps, self.start, self.eval_seconds = untimed_steps, time.perf_counter(), 0.0
        self.accuracies: list[float] = []

    def at_step(self, step: int) -> None:
        if step == self.untimed_steps > 0:
            self.start, self.eval_seconds = time.perf_counter(), 0.0

    def evaluate(self, evaluate: Callable[[nn.Module], float], model: nn.Module) -> None:
        started = time.perf_counter()
        self.accuracies.append(evaluate(model))
        self.eval_seconds += time.perf_counter() - started


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
    """Train ``model`` on this rank's share of every global batch. The training time is
    ``perf_counter()`` afterwards minus ``clock_start`` minus ``eval_seconds``. ``evaluate``
    runs after every whole epoch (never a partial one, when ``max_steps`` stops early);
    ``after_step`` after every step (notebook 08 accounts memory there). With a ``checkpoint``,
    it starts from the latest one and saves as it goes (notebook 10)."""
    optimizer = make_optimizer(model, config)
    per_epoch, last = steps_per_epoch(len(X), config.global_batch), total_steps(config, len(X))
    losses = torch.zeros(last if config.record_loss else 0)
    first = checkpoint.restore(model, optimizer, losses, per_epoch) if checkpoint else 0
    clock, order = _Clock(config.untimed_steps), None
    for step in range(first, last):
        epoch, i = divmod(step, per_epoch)
        if order is None or i == 0:  # the epoch's order, the same on every worker
            order = worker_order(len(X), epoch, rank, config.order_per_rank)
        clock.at_step(step)
        batch = order[i * config.global_batch : (i + 1) * config.global_batch]
        lr = lr_at(config, step, per_epoch)
        idx = local_slice(batch, rank, world_size)
        loss = sgd_step(model, optimizer, X, y, idx, config, lr, world_size)
        if config.record_loss:
            losses[step] = loss
        if after_step is not None:
            after_step(step + 1, model, optimizer)
        if checkpoint:
            checkpoint.after_step(model, optimizer, losses, step + 1, per_epoch, last)
        if i == per_epoch - 1:  # a whole epoch: evaluate after it
            _end_of_epoch(clock, evaluate, model, config, rank, epoch)
    return Loop(losses, clock.accuracies, clock.eval_seconds, clock.start, optimizer)


def _end_of_epoch(clock: _Clock, evaluate, model: nn.Module, config: TrainConfig, rank: int,
                  epoch: int) -> None:  # fmt: skip
    if evaluate is not None:
        clock.evaluate(evaluate, model)
    if config.show_progress and rank == 0:
        print(f"  epoch {epoch + 1}/{config.epochs}", end="\r", file=sys.stderr, flush=True)


def sgd_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    idx: torch.Tensor,
    config: TrainConfig,
    lr: float,
    world_size: int = 1,
) -> torch.Tensor:
    """One step on this rank's samples ``idx`` at rate ``lr``; returns their mean loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad()
    loss = forward_backward(model, X, y, idx, config)  # under DDP, also averages
    if config.sync == "allreduce" and world_size > 1:
        _average_gradients(model, world_size)
    optimizer.step()
    return loss


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


def _average_gradients(model: nn.Module, world_size: int) -> None:
    """Notebook 03's hand-written averaging (sync="allreduce"): what DDP does, without DDP."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size
