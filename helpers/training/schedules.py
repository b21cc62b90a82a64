"""Learning-rate policies for large-batch training (Goyal et al. 2017).

A schedule is a small frozen dataclass (so it travels to spawned workers) whose ``factor`` gives,
for a step, what the configured learning rate is multiplied by. It depends only on the step and
the steps per epoch, never on the world size: the same global batch trains the same way on any
number of workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Schedule(Protocol):
    def factor(self, step: int, steps_per_epoch: int) -> float: ...


@dataclass(frozen=True)
class Constant:
    """The learning rate as configured, every step."""

    def factor(self, step: int, steps_per_epoch: int) -> float:
        return 1.0


@dataclass(frozen=True)
class LinearWarmup:
    """Ramp linearly from ``start_factor`` x lr to lr over the first ``epochs`` epochs, then hold.

    Goyal et al. start at the small-batch rate and reach k times it after 5 epochs:
    ``start_factor = 1 / k``.
    """

    epochs: float = 5.0
    start_factor: float = 0.0

    def factor(self, step: int, steps_per_epoch: int) -> float:
        warmup_steps = self.epochs * steps_per_epoch
        if warmup_steps <= 0 or step >= warmup_steps:
            return 1.0
        return self.start_factor + (1.0 - self.start_factor) * step / warmup_steps


@dataclass(frozen=True)
class WarmupSteps:
    """A linear ramp of the learning rate from ``start_factor`` x lr to lr over ``steps`` steps,
    counted in steps rather than epochs, so that a large batch (few steps per epoch) still gets
    a ramp long enough to matter."""

    steps: int
    start_factor: float = 0.0

    def factor(self, step: int, steps_per_epoch: int) -> float:
        if self.steps <= 0 or step >= self.steps:
            return 1.0
        return self.start_factor + (1.0 - self.start_factor) * step / self.steps


def goyal_warmup(base_batch: int, global_batch: int, epochs: float = 5.0) -> Schedule:
    """Goyal et al.'s gradual warm-up for a global batch ``k = global_batch / base_batch`` times
    the base batch, used with the linearly scaled lr: start at the base batch's rate (factor
    ``1 / k``) and reach the scaled rate after ``epochs`` epochs. A batch no larger than the base
    batch needs no warm-up (its scaled rate is not above the base rate): ``Constant()``."""
    if base_batch < 1 or global_batch < 1:
        raise ValueError("batch sizes must be at least 1")
    if epochs <= 0 or global_batch <= base_batch:
        return Constant()
    return LinearWarmup(epochs=epochs, start_factor=base_batch / global_batch)


def linearly_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    """The linear scaling rule: multiply the batch by k, multiply the learning rate by k."""
    if base_batch < 1 or global_batch < 1:
        raise ValueError("batch sizes must be at least 1")
    return base_lr * global_batch / base_batch
