"""Grading a training script by what it did, not by how it reads: the rows each rank trained on
(the ``seen_rank{r}.pt`` files it writes), which ranks printed and saved (torchrun's per-rank
logs), and its checkpoint's weights against a one-process run and the course's reference.

The scripts' global batches can be compared with the reference's because ``DistributedSampler``
(``shuffle=True``, ``drop_last=True``) orders an epoch by ``randperm(n)`` seeded with
``seed + epoch``, as ``helpers.training.order.epoch_order`` does with the epoch, and hands rank r
the rows at positions r, r + N, r + 2N, ... of that order: with B / N rows per rank and step,
the ranks' i-th batches together are positions i·B to (i+1)·B - 1, the reference's i-th global
batch, in another order within it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import torch

from helpers.experiments.ddp_script.run import ScriptRun
from helpers.experiments.replicas import weight_gap
from helpers.training import final_weights, steps_per_epoch
from helpers.training.model import make_mlp
from helpers.training.order import epoch_order

# "To rounding" for notebook 04's runs: 2 epochs, 56 steps at global batch 256 (notebook 03's
# SAME_TRAINING_ATOL is for its 140). After 56 steps, one process against 2 workers, rounding moved
# the weights by 2e-8 natively (AMD) and by up to 3e-5 on the simulated processor
# (ATEN_CPU_CAPABILITY=default), on the recordings and the stand-in; another data order moved them
# by 8e-3 to 1.4e-2. The geometric middle, 5e-4, leaves a factor of over 15 on either side.
SCRIPT_ATOL = 5e-4

SAVED = "saved "  # the line a script prints after writing its checkpoint
ACCURACY = re.compile(r"test accuracy: (\d+)/(\d+)")


def seen(run: ScriptRun) -> list[torch.Tensor]:
    """Rank by rank, the rows it trained on: one row of the tensor per step."""
    paths = [run.folder / f"seen_rank{rank}.pt" for rank in range(run.world)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"{run.folder} lacks {', '.join(missing)}: did every rank save its rows?")
    return [torch.load(p) for p in paths]


def reference_batches(n: int, global_batch: int, epochs: int) -> torch.Tensor:
    """The course's global batches, one row per step: contiguous chunks of ``epoch_order``."""
    per_epoch = steps_per_epoch(n, global_batch)
    return torch.cat([
        epoch_order(n, epoch)[: per_epoch * global_batch].view(per_epoch, global_batch)
        for epoch in range(epochs)
    ])  # fmt: skip


def global_batches(rows: list[torch.Tensor]) -> torch.Tensor:
    """Every step's rows from all ranks together, one row per step (rank 0's share first)."""
    if len({r.shape[0] for r in rows}) != 1:
        raise ValueError(f"the ranks took different numbers of steps: {[len(r) for r in rows]}")
    return torch.cat(rows, dim=1)


def same_batches(batches: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether every step used the reference's global batch (in any order within it)."""
    if batches.shape != reference.shape:
        return False
    return torch.equal(batches.sort(dim=1).values, reference.sort(dim=1).values)


def visits(batches: torch.Tensor, n: int, per_epoch: int, epoch: int = 0) -> dict[int, int]:
    """How many samples the ranks together used 0, 1, 2, ... times in one epoch."""
    used = batches[epoch * per_epoch : (epoch + 1) * per_epoch].flatten()
    counts = torch.bincount(used, minlength=n)
    times, how_many = counts.unique(return_counts=True)
    return dict(zip(times.tolist(), how_many.tolist(), strict=True))


def each_sample_once(batches: torch.Tensor, n: int, per_epoch: int) -> bool:
    """Whether no sample was used twice within any epoch."""
    epochs = len(batches) // per_epoch
    return all(max(visits(batches, n, per_epoch, e)) <= 1 for e in range(epochs))


def new_order_each_epoch(batches: torch.Tensor, per_epoch: int) -> bool:
    """Whether every epoch after the first visited the samples in another order than the first."""
    first = batches[:per_epoch]
    later = batches[per_epoch:].split(per_epoch)
    return all(not torch.equal(epoch, first) for epoch in later)


def checkpoint_weights(run: ScriptRun, name: str = "checkpoint.pt") -> np.ndarray:
    """The weights in the run's checkpoint, loaded into the course's MLP and flattened as
    ``RunResult.weights`` are (a checkpoint with DDP's "module." keys does not load)."""
    state = torch.load(run.folder / name)["model"]
    model = make_mlp()
    model.load_state_dict(state)
    return final_weights(model)


def writers(run: ScriptRun) -> list[int]:
    """The ranks that said they saved the checkpoint."""
    return [rank for rank in range(run.world) if run.lines(rank, SAVED)]


def printers(run: ScriptRun) -> list[int]:
    """The ranks that printed anything at all."""
    return [rank for rank, out in enumerate(run.stdout) if out.strip()]


def accuracy_counts(run: ScriptRun) -> tuple[int, int]:
    """(correct, counted) from rank 0's ``test accuracy: C/N`` line."""
    found = [m for line in run.stdout[0].splitlines() if (m := ACCURACY.match(line))]
    if len(found) != 1:
        raise ValueError(f"rank 0 printed {len(found)} 'test accuracy: C/N' lines, not one")
    return int(found[0][1]), int(found[0][2])


def grade(
    run: ScriptRun,
    n_train: int,
    global_batch: int,
    epochs: int,
    one_process: np.ndarray,
    reference: np.ndarray,
    atol: float = SCRIPT_ATOL,
) -> dict[str, bool]:
    """Yes or no, for each thing a correct script must do (the same on every processor when the
    weight gaps are far from ``atol``, as rounding's and real changes' are; ``SCRIPT_ATOL`` is
    derived for 2 epochs at global batch 256: a longer training needs its own)."""
    run.check()
    per_epoch = steps_per_epoch(n_train, global_batch)
    batches = global_batches(seen(run))
    weights = checkpoint_weights(run)
    return {
        "one writer": writers(run) == [0],
        "only rank 0 prints": printers(run) == [0],
        "each sample once": each_sample_once(batches, n_train, per_epoch),
        "new order each epoch": new_order_each_epoch(batches, per_epoch),
        "reference's batches": same_batches(
            batches, reference_batches(n_train, global_batch, epochs)
        ),
        "= 1 process": weight_gap(weights, one_process) <= atol,
        "= reference": weight_gap(weights, reference) <= atol,
    }


def grade_table(runs: dict[str, ScriptRun], **grading) -> pd.DataFrame:
    """``grade`` for every run, one row each, with its number of workers."""
    return pd.DataFrame(
        [{"run": name, "workers": run.world, **grade(run, **grading)} for name, run in runs.items()]
    ).set_index("run")


def gap_table(
    runs: dict[str, ScriptRun], one_process: np.ndarray, reference: np.ndarray
) -> pd.DataFrame:
    """The measurements behind the weight verdicts: rank 0's largest weight difference from the
    one-process run's and from the reference's (they depend on the processor's rounding)."""
    rows = []
    for name, run in runs.items():
        weights = checkpoint_weights(run)
        rows.append({
            "run": name,
            "max |w - w(1 process)|": f"{weight_gap(weights, one_process):.0e}",
            "max |w - w_ref|": f"{weight_gap(weights, reference):.0e}",
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("run")


def tensor_gaps(runs: dict[str, ScriptRun], one_process: np.ndarray) -> pd.DataFrame:
    """``max |w - w(1 process)|`` of rank 0's checkpoint, parameter tensor by parameter tensor
    (one column per tensor of the MLP, in ``parameters()`` order; one row per run): where a
    change of the training first shows, and whether rounding stays small in every layer."""
    named = list(make_mlp().named_parameters())
    bounds = np.cumsum([0] + [p.numel() for _, p in named])
    rows = {}
    for name, run in runs.items():
        diff = np.abs(checkpoint_weights(run) - np.asarray(one_process))
        spans = zip(named, bounds[:-1], bounds[1:], strict=True)
        rows[name] = {n: float(diff[a:b].max()) for (n, _), a, b in spans}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("run")
