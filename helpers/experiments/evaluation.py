"""Evaluating in parallel without counting wrong (notebook 11).

``DistributedSampler`` gives every rank the same number of samples: when the world size does not
divide the data set it pads the last ranks with samples from the start (``drop_last=False``, the
default), so a metric summed over ranks counts those samples twice; with ``drop_last=True`` it
drops the tail, and they are never counted. Either way the test split is not what was measured.
Two exact ways, each summing *counts* (correct, seen) over ranks with one all-reduce:

* ``strided``: rank r takes samples r, r + N, r + 2N, ... with no padding (ranks differ by one
  sample at most);
* ``drop_last_remainder``: ``DistributedSampler(drop_last=True)``, and rank 0 also takes the
  few samples it dropped.

Averaging each rank's *accuracy* instead is exact only when the ranks see equally many samples:
``by_volunteer`` splits the test split by volunteer (as data sharded by file would be), and the
mean of its ranks' accuracies weighs a rank with fewer windows as much as one with more.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from helpers.data import load_har
from helpers.training.model import make_mlp

SPLITS = ("padded", "drop_last", "strided", "drop_last_remainder", "by_volunteer")


def shard(split: str, n: int, rank: int, world_size: int,
          subjects: np.ndarray | None = None) -> list[int]:  # fmt: skip
    """The test-sample indices rank ``rank`` of ``world_size`` evaluates under ``split``."""
    if split in ("padded", "drop_last", "drop_last_remainder"):
        drop = split != "padded"
        sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank,
                                     shuffle=False, drop_last=drop)  # fmt: skip
        mine = list(sampler)
        if split == "drop_last_remainder" and rank == 0:
            mine += list(range(len(sampler) * world_size, n))  # the tail drop_last left out
        return mine
    if split == "strided":
        return list(range(rank, n, world_size))
    if split == "by_volunteer":
        if subjects is None:
            raise ValueError("by_volunteer needs each sample's volunteer (subjects)")
        # whole volunteers, in order, as data sharded by file would be: uneven shards
        volunteers = np.array_split(sorted(set(subjects.tolist())), world_size)[rank]
        return np.flatnonzero(np.isin(subjects, volunteers)).tolist()
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def padding_table(n: int, worlds: list[int]) -> list[dict]:
    """For each world size, what ``DistributedSampler`` makes of ``n`` samples: how many it
    hands out in all with padding, and how many it drops with ``drop_last=True``."""
    rows = []
    for w in worlds:
        padded = len(DistributedSampler(range(n), num_replicas=w, rank=0, shuffle=False)) * w
        kept = len(DistributedSampler(range(n), num_replicas=w, rank=0, shuffle=False,
                                      drop_last=True)) * w  # fmt: skip
        rows.append({"workers": w, "handed_out_padded": padded, "counted_twice": padded - n,
                     "dropped_with_drop_last": n - kept})  # fmt: skip
    return rows


@torch.no_grad()
def evaluation_worker(rank: int, world_size: int, state: dict, data: str | None = None) -> dict:
    """Evaluate the model whose ``state`` (a state dict) it is given on this rank's shard of the
    test split, for every split of ``SPLITS``. For each: the indices it took, its own correct and
    seen counts, the counts summed over ranks (one all-reduce), and the mean over ranks of
    their accuracies."""
    har = load_har(data, download=False)
    X, y = torch.from_numpy(har.X_test), torch.from_numpy(har.y_test)
    model: nn.Module = make_mlp()
    model.load_state_dict(state)
    model.eval()
    out = {}
    for split in SPLITS:
        mine = shard(split, len(X), rank, world_size, har.subject_test)
        correct, seen = int((model(X[mine]).argmax(dim=1) == y[mine]).sum()), len(mine)
        counts = torch.tensor([correct, seen], dtype=torch.float64)
        dist.all_reduce(counts)  # summed counts: the pooled accuracy
        mean = torch.tensor([correct / seen if seen else 0.0], dtype=torch.float64)
        dist.all_reduce(mean)
        out[split] = {"indices": mine, "correct": correct, "seen": seen,
                      "summed_correct": int(counts[0]), "summed_seen": int(counts[1]),
                      "mean_of_ranks": float(mean[0]) / world_size}  # fmt: skip
    if rank == 0:  # one process on the whole split: what every split should agree with
        logits = model(X)
        top2 = logits.topk(2, dim=1).values
        out["reference"] = {"correct": int((logits.argmax(dim=1) == y).sum()), "seen": len(y),
                            "closest_call": float((top2[:, 0] - top2[:, 1]).min())}  # fmt: skip
    return out
