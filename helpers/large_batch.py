"""Large-batch training, measured: the linear scaling rule and warm-up (Goyal et al. 2017).

Two questions, one function each:

* ``run_sweep``: what does a bigger global batch do to what is learnt in a fixed budget of
  epochs, under three learning-rate policies (``POLICIES``): the same lr at every batch, the lr
  scaled linearly with the batch, and the scaled lr reached by a gradual warm-up? The runs use
  ``train_in_process``: N workers do exactly the same training as one, so one process suffices
  to find out *what* is learnt.
* ``sharpness``: why a learning rate can be too large. Gradient descent is unstable along any
  direction where the loss curves more sharply than ``2 / lr``; the largest such curvature (the
  top eigenvalue of the loss's Hessian) therefore caps the usable learning rate, whatever the
  batch size. The linear scaling rule works only below that cap.
* ``measure_epoch_seconds`` and ``time_to_accuracy_table``: how long, in seconds, does each
  configuration a practitioner could choose (a number of workers, a global batch, a policy) take
  to reach a given test accuracy? Epochs to reach it (from the sweep) times seconds per epoch
  (measured with real workers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from helpers.data import load_har
from helpers.launch import WorldPlan, plan_world_sizes
from helpers.model import make_mlp
from helpers.schedules import Constant, Schedule, goyal_warmup, linearly_scaled_lr
from helpers.training import (
    RunResult,
    TrainConfig,
    epochs_for_min_steps,
    run_training,
    torch_threads,
    train_in_process,
    train_steps,
)

BASE_LR = 0.05  # the reference experiment's learning rate ...
BASE_BATCH = 256  # ... at the reference experiment's global batch
BATCHES: tuple[int, ...] = tuple(64 * 2**k for k in range(7))  # 64, 128, ..., 4096

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class Policy:
    """How the learning rate follows the global batch.

    ``scale_lr``: multiply the base lr by ``global_batch / base_batch`` (the linear scaling rule).
    ``warmup_epochs``: reach that lr by a linear ramp from the base lr over this many epochs
    (Goyal et al.'s gradual warm-up; only batches above the base batch need one).
    """

    name: str
    scale_lr: bool = False
    warmup_epochs: float = 0.0

    def lr(
        self, global_batch: int, base_lr: float = BASE_LR, base_batch: int = BASE_BATCH
    ) -> float:
        """The learning rate this policy trains ``global_batch`` with (after any warm-up)."""
        if not self.scale_lr:
            return base_lr
        return linearly_scaled_lr(base_lr, base_batch, global_batch)

    def schedule(self, global_batch: int, base_batch: int = BASE_BATCH) -> Schedule:
        """What multiplies the lr step by step: a warm-up from the base lr, or nothing."""
        if self.warmup_epochs > 0 and self.scale_lr:
            return goyal_warmup(base_batch, global_batch, self.warmup_epochs)
        return Constant()

    def config(
        self,
        global_batch: int,
        epochs: int,
        base_lr: float = BASE_LR,
        base_batch: int = BASE_BATCH,
        **options: Any,
    ) -> TrainConfig:
        """The training run of this policy at ``global_batch`` (``options``: other fields of
        ``TrainConfig``, such as ``data`` or ``record_loss``)."""
        return TrainConfig(
            global_batch=global_batch,
            epochs=epochs,
            lr=self.lr(global_batch, base_lr, base_batch),
            schedule=self.schedule(global_batch, base_batch),
            **options,
        )


def make_policies(warmup_epochs: float) -> tuple[Policy, Policy, Policy]:
    """The three policies the notebook compares, with a warm-up of ``warmup_epochs``."""
    return (
        Policy("constant lr"),
        Policy("linear scaling", scale_lr=True),
        Policy("linear scaling + warm-up", scale_lr=True, warmup_epochs=warmup_epochs),
    )


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def diverged(losses: Sequence[float]) -> bool:
    """Whether the training loss ever rose above its value at the first step (or overflowed):
    the sign of a learning rate too large for the loss surface."""
    return not _finite(losses) or max(losses) > losses[0]


def last_epoch_loss(losses: Sequence[float], steps_per_epoch: int) -> float:
    """Mean training loss over the last epoch's steps: a steadier measure of how far training
    got than the last step's loss or one epoch's test accuracy."""
    last = losses[-steps_per_epoch:]
    return sum(last) / len(last) if _finite(last) else math.inf


def run_sweep(
    batches: Sequence[int],
    policies: Sequence[Policy],
    epochs: int,
    data: str | None = None,
    threads: int | None = None,
    progress: Progress = None,
) -> pd.DataFrame:
    """Train every (global batch, policy) for ``epochs`` epochs in this process and tabulate it.

    A run whose configuration equals an earlier one's (at the base batch every policy is the
    same run; below it, warm-up changes nothing) is not repeated: its row says ``same_as``.
    ``progress`` (e.g. ``print``) receives one line per run. The table has one row per
    (batch, policy), with the per-step training losses and per-epoch test accuracies in
    list-valued columns ``losses`` and ``epoch_accuracies``.
    """
    done: dict[TrainConfig, tuple[str, RunResult]] = {}
    rows = []
    for batch in batches:
        for policy in policies:
            config = policy.config(batch, epochs, data=data, record_loss=True, record_accuracy=True)
            same_as = done[config][0] if config in done else ""
            if not same_as:
                done[config] = (policy.name, train_in_process(config, threads))
            result = done[config][1]
            losses = result.losses
            rows.append(
                {
                    "global_batch": batch,
                    "policy": policy.name,
                    "lr": config.lr,
                    "warmup_epochs": getattr(config.schedule, "epochs", 0.0),
                    "steps_per_epoch": result.steps // epochs,
                    "steps": result.steps,
                    "accuracy": result.accuracy,
                    "best_accuracy": max(result.epoch_accuracies),
                    "first_loss": losses[0],
                    "peak_loss": max(losses) if _finite(losses) else math.inf,
                    "last_epoch_loss": last_epoch_loss(losses, result.steps // epochs),
                    "diverged": diverged(losses),
                    "seconds": result.seconds,
                    "same_as": same_as,
                    "data_source": result.data_source,
                    "losses": losses,
                    "epoch_accuracies": result.epoch_accuracies,
                }
            )
            if progress is not None:
                note = f" (the same run as {same_as})" if same_as else ""
                progress(
                    f"batch {batch:>4} · {policy.name:<24}: lr {config.lr:.4f}, "
                    f"{result.steps:>4} steps, test accuracy {result.accuracy:.2%}{note}"
                )
    return pd.DataFrame(rows)


def sharpness(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, iters: int = 20, seed: int = 0
) -> float:
    """The largest eigenvalue of the Hessian of the mean cross-entropy on ``(X, y)`` with respect
    to the weights: how sharply the loss curves in its most curved direction. Found by power
    iteration on Hessian-vector products (double backward), ``iters`` of them, from a random
    start seeded by ``seed``. Gradient descent with a learning rate above ``2 / sharpness``
    overshoots along that direction further every step: it diverges."""
    params = [p for p in model.parameters() if p.requires_grad]
    loss = F.cross_entropy(model(X), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    generator = torch.Generator().manual_seed(seed)
    v = [torch.randn(p.shape, generator=generator) for p in params]
    eigenvalue = 0.0
    for _ in range(iters):
        norm = torch.sqrt(sum((x * x).sum() for x in v))
        v = [x / norm for x in v]
        hv = torch.autograd.grad(grads, params, v, retain_graph=True)
        eigenvalue = float(sum((h * x).sum() for h, x in zip(hv, v, strict=True)))
        v = [h.detach() for h in hv]
    return eigenvalue


def sharpness_during_training(
    after_epochs: Sequence[int],
    config: TrainConfig,
    n_samples: int = 2048,
    iters: int = 20,
    threads: int | None = None,
) -> pd.DataFrame:
    """Sharpness of the reference MLP after training ``config`` for each number of epochs in
    ``after_epochs`` (0: at initialisation), on the first ``n_samples`` training samples, with the
    largest stable learning rate ``2 / sharpness`` beside it. Each point trains from scratch, in
    this process, exactly as ``train_in_process`` does."""
    data = load_har(config.data)
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    rows = []
    with torch_threads(threads or torch.get_num_threads()):
        for epochs in after_epochs:
            torch.manual_seed(config.seed)
            model = make_mlp()
            if epochs > 0:
                train_steps(model, X, y, replace(config, epochs=epochs))
            value = sharpness(model, X[:n_samples], y[:n_samples], iters)
            rows.append({"epochs": epochs, "sharpness": value, "max_stable_lr": 2 / value})
    return pd.DataFrame(rows)


def measure_epoch_seconds(
    world_sizes: Sequence[int],
    batches: Sequence[int],
    n_samples: int,
    data: str | None = None,
    min_steps: int = 8,
    threads_per_worker: int | None = None,
    oversubscribe: bool = False,
    progress: Progress = None,
) -> tuple[pd.DataFrame, list[WorldPlan]]:
    """Seconds per epoch of real DDP training, for every world size that fits the cores and
    every global batch: a short ``run_training`` each (start-up and evaluation excluded).

    Returns the table (world, threads_per_worker, global_batch, epochs, seconds,
    seconds_per_epoch, replicas_identical, oversubscribed) and the plans, whose ``reason`` says
    why a world size was skipped. What is learnt does not depend on the lr here, only the time:
    every run uses the base configuration.
    """
    plans = plan_world_sizes(world_sizes, threads_per_worker, oversubscribe=oversubscribe)
    rows = []
    for plan in plans:
        if not plan.runs:
            if progress is not None:
                progress(f"{plan.world_size} workers: {plan.reason}")
            continue
        for batch in batches:
            epochs = epochs_for_min_steps(batch, n_samples, min_steps)
            config = TrainConfig(global_batch=batch, epochs=epochs, data=data)
            run = run_training(
                plan.world_size, config, plan.threads_per_worker, plan.oversubscribed
            )
            rows.append(
                {
                    "world": plan.world_size,
                    "threads_per_worker": plan.threads_per_worker,
                    "global_batch": batch,
                    "epochs": epochs,
                    "steps": run.steps,
                    "seconds": run.seconds,
                    "seconds_per_epoch": run.seconds / epochs,
                    "replicas_identical": run.replicas_identical,
                    "oversubscribed": plan.oversubscribed,
                }
            )
            if progress is not None:
                progress(
                    f"{plan.world_size} worker(s) x {plan.threads_per_worker} thread(s), "
                    f"batch {batch:>4}: {run.seconds / epochs:.2f} s per epoch"
                )
    return pd.DataFrame(rows), plans


def epochs_to_reach(epoch_accuracies: Sequence[float], target: float) -> int | None:
    """The first epoch (counting from 1) after which the accuracy is at least ``target``;
    ``None`` if it never gets there."""
    for epoch, value in enumerate(epoch_accuracies, start=1):
        if value >= target:
            return epoch
    return None


def time_to_accuracy(
    epoch_accuracies: Sequence[float], target: float, seconds_per_epoch: float
) -> float:
    """Seconds of training until the test accuracy first reaches ``target``: epochs to reach it
    times seconds per epoch; ``math.inf`` if it never does."""
    epochs = epochs_to_reach(epoch_accuracies, target)
    return math.inf if epochs is None else epochs * seconds_per_epoch


@dataclass(frozen=True)
class Candidate:
    """One configuration a practitioner could choose: workers, global batch, lr policy."""

    world: int
    global_batch: int
    policy: str

    @property
    def label(self) -> str:
        workers = "1 worker" if self.world == 1 else f"{self.world} workers"
        return f"{workers}, batch {self.global_batch}, {self.policy}"


def time_to_accuracy_table(
    candidates: Sequence[Candidate],
    sweep: pd.DataFrame,
    epoch_seconds: pd.DataFrame,
    target: float,
) -> pd.DataFrame:
    """For each candidate: its accuracy curve (from ``sweep``, the same for any world size),
    its measured seconds per epoch (from ``epoch_seconds``, for its world size and batch), the
    epochs and the seconds it needs to reach ``target``, and the speed-up over the first
    candidate (the baseline). Candidates whose world size was not measured are left out."""
    rows = []
    for c in candidates:
        timed = epoch_seconds[
            (epoch_seconds["world"] == c.world) & (epoch_seconds["global_batch"] == c.global_batch)
        ]
        if timed.empty:
            continue
        run = sweep[(sweep["policy"] == c.policy) & (sweep["global_batch"] == c.global_batch)]
        if len(run) != 1:
            raise ValueError(f"the sweep has no single run of batch {c.global_batch}, {c.policy}")
        curve = run["epoch_accuracies"].iloc[0]
        per_epoch = float(timed["seconds_per_epoch"].iloc[0])
        rows.append(
            {
                "configuration": c.label,
                "world": c.world,
                "global_batch": c.global_batch,
                "policy": c.policy,
                "lr": float(run["lr"].iloc[0]),
                "seconds_per_epoch": per_epoch,
                "epochs_to_target": epochs_to_reach(curve, target),
                "seconds_to_target": time_to_accuracy(curve, target, per_epoch),
                "epoch_accuracies": curve,
            }
        )
    table = pd.DataFrame(rows)
    if not table.empty:
        table["speedup"] = table["seconds_to_target"].iloc[0] / table["seconds_to_target"]
    return table
