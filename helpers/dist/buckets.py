"""DDP's gradient buckets, and the step-time model with overlap.

**Buckets.** DDP does not all-reduce each gradient on its own (every call pays the latency
``alpha``): it packs them into buckets and all-reduces each bucket once it is full. After the
first step it rebuilds the buckets in the order the gradients became ready in backward, which for
a sequential model is the parameters in reverse: a bucket takes tensors until its size reaches its
cap, so the tensor that crosses the cap is still in it. The cap is ``bucket_cap_mb`` (25 MiB by
default), except that when ``bucket_cap_mb`` is left at its default, the *first* bucket is capped
at 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``) so that communication can start
early. ``bucket_plan`` reproduces that rule; ``tests/test_comm_engineering.py`` checks it against
DDP's own record of its buckets.

**Overlap.** DDP hands a bucket to the all-reduce as soon as its last gradient is computed, while
backward goes on with the earlier layers. Buckets are all-reduced one after another, so::

    start_i = max(ready_i, end_{i-1})     end_i = start_i + alpha + beta * bytes_i

and only what ends after backward (``exposed``) adds to the step. ``pipeline`` computes it from
the times at which the buckets become ready; ``backward_shares`` estimates those from the layers'
sizes (each layer's backward costs two matrix products per sample, the first layer's one, since
nothing needs the gradient of the input data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist.comm_model import AlphaBeta

if TYPE_CHECKING:  # pandas only for tables: every training worker imports this module
    import pandas as pd

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25  # DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES  # 1 MiB, only with the default cap


@dataclass(frozen=True)
class Bucket:
    """One bucket: the parameters in it (in the order backward produces their gradients)."""

    index: int
    names: tuple[str, ...]
    nbytes: int


def bucket_plan(model: nn.Module, bucket_cap_mb: float | None = None) -> list[Bucket]:
    """The buckets DDP uses from the second step on, for a model whose gradients become ready in
    reverse parameter order (a sequential model). ``bucket_cap_mb=None`` is DDP's default: 25 MiB
    buckets after a first bucket of 1 MiB; an explicit cap applies to every bucket."""
    cap = (DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB
    first_cap = FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    buckets: list[Bucket] = []
    names: list[str] = []
    size = 0
    for name, p in reversed(list(model.named_parameters())):
        names.append(name)
        size += p.numel() * p.element_size()
        if size >= (first_cap if not buckets else cap):
            buckets.append(Bucket(len(buckets), tuple(names), size))
            names, size = [], 0
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), size))
    return buckets


def logged_buckets(model: nn.Module) -> list[int]:
    """The bytes of each bucket DDP all-reduces from its second step on, as DDP itself logged
    them (``_get_ddp_logging_data``'s ``rebuilt_bucket_sizes``): what a step really sends, not a
    plan of it. Empty for a model that is not DDP, or whose buckets DDP has not rebuilt yet (in
    its first steps); one worker, on a group of one rank, logs them too (notebook 03)."""
    if not isinstance(model, DDP):
        return []
    sizes = str(model._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
    return [int(size) for size in sizes.split(",") if size.strip()]


def ddp_bucket_record(
    rank: int, world_size: int, widths: Sequence[int], caps: Sequence[float | None]
) -> dict[str, list[int]]:
    """Inside a worker of ``helpers.dist.launch``: for each cap, an MLP of these layer ``widths``
    in DDP with ``bucket_cap_mb=cap``, three forward and backward passes on 2 random samples (DDP
    rebuilds its buckets at the second and logs them at the third), and the buckets DDP logged
    (``logged_buckets``): DDP's own record, for any model size, to check a plan or a model
    against. Keyed by ``str(cap)``."""
    record = {}
    for cap in caps:
        torch.manual_seed(0)
        layers = [nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)]
        model = DDP(nn.Sequential(*layers), bucket_cap_mb=cap)
        for _ in range(3):
            model(torch.randn(2, widths[0])).square().mean().backward()
        record[str(cap)] = logged_buckets(model)
        del model, layers  # one model's parameters, gradients and buckets at a time
    return record


def bucket_table(buckets: Sequence[Bucket]) -> pd.DataFrame:
    """A plan for reading: bucket, its tensors, bytes."""
    import pandas as pd

    return pd.DataFrame(
        [{"bucket": b.index, "tensors": ", ".join(b.names), "bytes": b.nbytes} for b in buckets]
    )


def backward_shares(layers: Sequence[tuple[int, int]]) -> np.ndarray:
    """Each linear layer's share of backward's compute, in the order backward runs (last layer
    first), from its ``(inputs, outputs)``: two matrix products per sample (the gradient of the
    weights and of the inputs), one for the first layer, whose inputs are the data."""
    work = [(1 if i == 0 else 2) * n_in * n_out for i, (n_in, n_out) in enumerate(layers)]
    work = np.asarray(work[::-1], dtype=float)
    return work / work.sum()


def forward_and_backward_work(layers: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Multiply-adds per sample in forward (one product per layer) and in backward."""
    forward = float(sum(n_in * n_out for n_in, n_out in layers))
    backward = float(sum((1 if i == 0 else 2) * a * b for i, (a, b) in enumerate(layers)))
    return forward, backward


@dataclass(frozen=True)
class Pipeline:
    """What ``pipeline`` found, in seconds from the start of backward."""

    starts: np.ndarray
    ends: np.ndarray
    backward_end: float

    @property
    def exposed(self) -> float:
        """Communication that finishes after backward: what it adds to the step."""
        return max(0.0, float(self.ends[-1]) - self.backward_end) if len(self.ends) else 0.0

    @property
    def total(self) -> float:
        """Communication time summed over the buckets, as if none of it overlapped."""
        return float(np.sum(self.ends - self.starts))


def pipeline(
    ready: Sequence[float], comm_seconds: Sequence[float], backward_end: float
) -> Pipeline:
    """All-reduce the buckets one after another, each from when it is ready (``ready``, seconds
    from the start of backward, in bucket order) or when the previous one ends."""
    starts, ends, free = [], [], 0.0
    for r, c in zip(ready, comm_seconds, strict=True):
        start = max(r, free)
        starts.append(start)
        free = start + c
        ends.append(free)
    return Pipeline(np.asarray(starts), np.asarray(ends), backward_end)


def bucket_ready_fractions(
    buckets: Sequence[Bucket], layer_of: dict[str, int], shares: np.ndarray
) -> list[float]:
    """For each bucket, the fraction of backward done when its last gradient is ready:
    ``layer_of`` maps a parameter name to its layer's position in backward (0: first to run)."""
    done = np.cumsum(shares)
    return [float(done[max(layer_of[n] for n in b.names)]) for b in buckets]


def overlap_step_seconds(
    forward_seconds: float,
    backward_seconds: float,
    other_seconds: float,
    ready_fractions: Sequence[float],
    bucket_bytes: Sequence[int],
    comm: AlphaBeta,
    collectives_per_bucket: int = 1,
) -> tuple[float, Pipeline]:
    """One step with overlap: forward, then backward with the buckets' all-reduces running
    behind it, then whatever of them is left (``exposed``), then ``other_seconds`` (the
    optimizer). Each bucket pays ``collectives_per_bucket`` latencies."""
    comm_seconds = [
        (collectives_per_bucket - 1) * comm.alpha + float(comm.predict(b)) for b in bucket_bytes
    ]
    ready = [f * backward_seconds for f in ready_fractions]
    pipe = pipeline(ready, comm_seconds, backward_seconds)
    return forward_seconds + backward_seconds + pipe.exposed + other_seconds, pipe
