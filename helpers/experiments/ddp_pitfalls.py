"""What DDP needs from every step, and what it does when a step breaks it (notebook 11).

DDP all-reduces the gradients bucket by bucket, as backward produces them, and it expects every
parameter's gradient at every step on every rank. Two ordinary situations break that:

* **Unused parameters**: a model with a branch a step does not use (an auxiliary head, a
  mixture-of-experts layer that gets no token) never produces those gradients, so their bucket
  never fills, and DDP stops at the next step with an error listing them (by
  index; by name with ``TORCH_DISTRIBUTED_DEBUG=INFO``).
  ``find_unused_parameters=True`` makes DDP walk the autograd graph after every forward to mark
  what was not used (a cost every step); ``static_graph=True`` learns the set once, at the
  first step, when it is the same at every step.
* **Uneven inputs**: a rank with fewer batches leaves the loop while the others still call
  backward, whose all-reduce then waits for it. ``torch.distributed.algorithms.join.Join`` with
  DDP's join hook lets the finished rank shadow the others' all-reduces (with zeros) until all
  are done, then makes the replicas equal again.
"""

from __future__ import annotations

import contextlib
import re
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.data import load_har
from helpers.dist import comm_hooks
from helpers.training.metrics import weights_digest
from helpers.training.model import N_CLASSES, make_mlp
from helpers.training.order import epoch_order, local_slice

GLOBAL_BATCH = 256
LR = 0.05


class WithAuxHead(nn.Module):
    """The reference MLP, and an auxiliary head on its output that the training steps do not
    use (it would serve another task, or evaluation only)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = make_mlp()
        self.aux = nn.Linear(N_CLASSES, N_CLASSES)

    def forward(self, x: torch.Tensor, use_aux: bool = False) -> torch.Tensor:
        out = self.body(x)
        return self.aux(out) if use_aux else out


def _batches(n: int, rank: int, world_size: int, steps: int) -> list[torch.Tensor]:
    """This rank's slices of the first ``steps`` global batches (notebook 03's data order)."""
    per_epoch = n // GLOBAL_BATCH
    out = []
    for step in range(steps):
        epoch, i = divmod(step, per_epoch)
        batch = epoch_order(n, epoch)[i * GLOBAL_BATCH : (i + 1) * GLOBAL_BATCH]
        out.append(local_slice(batch, rank, world_size))
    return out


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, X, y, idx) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(X[idx]), y[idx]).backward()
    optimizer.step()


def _built(variant: str) -> DDP:
    """A fresh replica (seed 0) wrapped as ``variant`` says."""
    torch.manual_seed(0)
    if variant == "no head, plain DDP":
        return DDP(make_mlp())
    if variant == "find_unused_parameters=True":
        return DDP(WithAuxHead(), find_unused_parameters=True)
    if variant == "static_graph=True":
        return DDP(WithAuxHead(), static_graph=True)
    if variant == "plain DDP":
        return DDP(WithAuxHead())
    raise ValueError(f"unknown variant {variant!r}")


VARIANTS = ("no head, plain DDP", "find_unused_parameters=True", "static_graph=True")


def unused_error(X, y, rank: int, world_size: int) -> dict:
    """Plain DDP on the model with an unused head: the error it raises at the second step, and
    the names of the parameters it lists (DDP gives their indices)."""
    model = _built("plain DDP")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    names = [name for name, _ in model.module.named_parameters()]
    try:
        for idx in _batches(len(X), rank, world_size, 2):
            _step(model, optimizer, X, y, idx)
    except RuntimeError as err:
        message = str(err)
    else:
        raise RuntimeError("DDP trained a model with unused parameters without complaint")
    listed = re.search(r"did not receive grad for rank \d+: ([\d ]+)", message)
    indices = [int(i) for i in listed.group(1).split()] if listed else []
    return {"error": message, "unused": [names[i] for i in indices]}


def compare_variants(X, y, rank: int, world_size: int, steps: int) -> dict[str, dict]:
    """The three variants trained side by side, one step of each in turn (a burst of load
    from elsewhere hits all three alike): seconds per step, DDP's own record of unused
    parameters, and the trained body's digest."""
    models = {v: _built(v) for v in VARIANTS}
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=LR) for v, m in models.items()}
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for idx in _batches(len(X), rank, world_size, steps):
        for v, model in models.items():
            dist.barrier()  # each timed step starts together on every rank
            started = time.perf_counter()
            _step(model, optimizers[v], X, y, idx)
            seconds[v].append(time.perf_counter() - started)
    out = {}
    for v, model in models.items():
        logged = model._get_ddp_logging_data()  # what DDP records about itself
        body = model.module if isinstance(model.module, nn.Sequential) else model.module.body
        out[v] = {
            "step_ms": 1e3 * float(np.median(seconds[v][1:])),  # the first builds the buckets
            "find_unused_parameters": bool(logged.get("find_unused_parameters", 0)),
            "unused_parameter_bytes": int(logged.get("unused_parameter_size", 0)),
            "static_graph": bool(model.static_graph),
            "body_digest": weights_digest(body),
        }
    return out


def uneven(X, y, rank: int, world_size: int, steps: int, short_by: int, join: bool) -> dict:
    """Rank 1 gets ``short_by`` batches fewer than the others. Without ``join`` the others'
    next all-reduce waits for it; with it, DDP's join hook shadows them. Returns the batches
    this rank's data gave it, the optimizer steps it took (counted by a hook on the optimizer),
    the gradient buckets it all-reduced (counted by a comm hook, which DDP also runs for the
    join hook's all-reduces of zeros) and its weights' digest afterwards."""
    model = _built("no head, plain DDP")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    taken: list[int] = []
    optimizer.register_step_post_hook(lambda *_: taken.append(1))
    buckets: list[tuple] = []
    comm_hooks.register(model, comm_hooks.CommHook.ALLREDUCE, log=buckets)  # as DDP, logged
    mine = _batches(len(X), rank, world_size, steps - (short_by if rank == 1 else 0))
    with Join([model]) if join else contextlib.nullcontext():
        for idx in mine:
            _step(model, optimizer, X, y, idx)
    return {"batches": len(mine), "steps": len(taken), "bucket_allreduces": len(buckets),
            "digest": weights_digest(model.module)}  # fmt: skip


def pitfalls_worker(rank: int, world_size: int, data: str | None = None, steps: int = 12,
                    short_by: int = 3) -> dict:  # fmt: skip
    """Everything of this module in one launch: the unused-parameter error, the three variants
    side by side, and uneven inputs under ``Join``."""
    har = load_har(data, download=False)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    return {
        "error": unused_error(X, y, rank, world_size),
        "variants": compare_variants(X, y, rank, world_size, steps),
        "join": uneven(X, y, rank, world_size, steps, short_by, join=True),
    }


def uneven_worker(rank: int, world_size: int, data: str | None = None, steps: int = 6,
                  short_by: int = 3) -> dict:  # fmt: skip
    """Uneven inputs without ``Join``: rank 1 runs out of batches first."""
    har = load_har(data, download=False)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    return uneven(X, y, rank, world_size, steps, short_by, join=False)
