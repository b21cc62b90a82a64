"""The yardstick of notebook 09: a few SGD steps of the course's training on one worker, which
every other way of splitting it (tensor, pipeline, a 2-D mesh) must reproduce to rounding.

``Steps`` names the training (seed, width, depth, batch, rate, the batches visited), ``one_worker``
runs it in this process and records what a split is compared on: the logits of the first
forward, the gradients of the first backward, the loss of every step and the final weights.
``gaps`` measures how far a split's record is from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from helpers.data import load_har
from helpers.training.metrics import final_weights
from helpers.training.model import make_mlp
from helpers.training.order import epoch_order

# A split that does the training it splits ends a few steps within float rounding of one worker:
# the same products and sums, added in another order (about 1e-7 on weights of order 0.05). One
# that drops a shard's contribution, scales a gradient wrongly or mixes up the micro-batches
# moves the weights by the order of an update, lr times a gradient: 1e-4 to 1e-2 per step.
# The bound sits between the two, as notebook 08's and its unit tests' do.
SAME_STEPS_ATOL = 1e-5


@dataclass(frozen=True)
class Steps:
    """A few steps of the reference training: the MLP from ``seed``, plain SGD at ``lr``, on the
    first ``steps`` global batches of epoch 0's order (the order every notebook's workers use)."""

    steps: int = 4
    global_batch: int = 256
    lr: float = 0.05
    seed: int = 0
    hidden: int = 1024
    hidden_layers: int = 2
    data: str | None = None  # a source name, resolved by the caller (workers load the same)

    def model(self) -> nn.Sequential:
        """The model every worker starts from: the same weights, from the seed."""
        torch.manual_seed(self.seed)
        return make_mlp(hidden=self.hidden, hidden_layers=self.hidden_layers)

    def batches(self, n_samples: int) -> list[torch.Tensor]:
        """The sample indices of each step's global batch."""
        if self.steps * self.global_batch > n_samples:
            raise ValueError(
                f"{self.steps} steps of {self.global_batch} samples need more than the "
                f"{n_samples} training samples: take fewer steps or a smaller batch"
            )
        order = epoch_order(n_samples, 0)
        return [order[i * self.global_batch : (i + 1) * self.global_batch]
                for i in range(self.steps)]  # fmt: skip

    def data_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training split as tensors (in a worker: the cached data, never a download)."""
        data = load_har(self.data, download=False)
        return torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)


def record(logits: torch.Tensor, grads: list[torch.Tensor], losses: list[float],
           weights: np.ndarray) -> dict:  # fmt: skip
    """What a split is compared on, as plain arrays."""
    return {
        "logits": logits.detach().double().numpy(),
        "grads": np.concatenate([g.detach().double().numpy().ravel() for g in grads]),
        "losses": np.asarray(losses, dtype=float),
        "weights": weights,
    }


def one_worker(spec: Steps, X: torch.Tensor | None = None, y: torch.Tensor | None = None) -> dict:
    """The training on one worker, in this process: the yardstick."""
    if X is None or y is None:
        X, y = spec.data_tensors()
    model = spec.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    losses, first = [], None
    for idx in spec.batches(len(X)):
        optimizer.zero_grad()
        logits = model(X[idx])
        loss = F.cross_entropy(logits, y[idx])
        loss.backward()
        if first is None:
            first = (logits, [p.grad.clone() for p in model.parameters()])
        losses.append(loss.item())
        optimizer.step()
    return record(*first, losses, final_weights(model))


def gaps(split: dict, reference: dict) -> dict[str, float]:
    """Largest absolute difference from the reference in each record both have (0.0: the same
    bits)."""
    return {key: float(np.max(np.abs(split[key] - reference[key])))
            for key in reference if split.get(key) is not None}  # fmt: skip


def several(rank: int, world_size: int, jobs: list[tuple[Callable, tuple, dict]]) -> list:
    """Worker: run several worker functions, ``(fn, args, kwargs)``, one after the other in one
    launch, so that the workers' start-up (processes, imports, data) is paid once."""
    return [fn(rank, world_size, *args, **kwargs) for fn, args, kwargs in jobs]
