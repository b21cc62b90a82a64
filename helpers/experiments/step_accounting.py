"""Where a training step's time goes (notebook 08): the step split into the compute of the same
step without communication, its collectives replayed alone, and what is left; and the minor page
faults a step takes, the price of memory that comes fresh from the kernel at every step.

A step's time alone says that one wrapping is slower, not why. Set beside a run that trains the
same slices with no communication (``sync="none"``) and its own collectives timed alone
(``ShardingProbe(replay_repeats=...)``), the rest of the step is what neither explains: the
wrapper's own work, or memory mapped afresh, which the page faults count.
"""

from __future__ import annotations

import resource
import statistics
from itertools import pairwise
from pathlib import Path

import pandas as pd

from helpers.experiments.memory import THP, huge_pages_mode
from helpers.training import RunResult


def minor_faults() -> int:
    """The minor page faults this process has taken so far: each is the kernel mapping a fresh
    page at its first touch, which a freed block returned to the kernel costs again when reused."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def why_no_page_count(thp: Path = THP) -> str | None:
    """None where a minor fault maps one base page (4 KiB on x86), so that faults count pages;
    else why not: with transparent huge pages always on, one fault may map 2 MiB."""
    if huge_pages_mode(thp) == "always":
        return f"transparent huge pages are always on ({thp}): a fault may map 2 MiB, not a page"
    return None


def median_step_faults(marks: list[int]) -> float | None:
    """The median minor page faults per step from ``minor_faults()`` read at each step's end (the
    first mark at the first step's start), leaving out the first step, as the step times do."""
    counts = [b - a for a, b in pairwise(marks)][1:]
    return statistics.median(counts) if counts else None


def step_accounting(runs: dict[str, list[RunResult]]) -> pd.DataFrame:
    """Per launch (``runs``' keys, e.g. the allocator each ran with) and per training of it, rank
    0's median step split in three: ``compute ms``, the median step of the launch's training
    with no communication (``sync="none"``: the same slices, each worker alone), ``collectives
    alone ms`` (replayed), and ``left ms``, the rest, negative where communication overlapped
    compute. Beside them, the median minor page faults per step of the fewest and the most
    faulting rank."""
    from helpers.experiments.sharding import label  # the same labels as the other tables

    rows = []
    for launch, trainings in runs.items():
        alone = [run for run in trainings if run.sync == "none"]
        if len(alone) != 1:
            raise ValueError(f"{launch!r} needs one training with sync='none' to time the compute")
        base = 1e3 * alone[0].probes[0]["step_seconds"]
        for run in trainings:
            if run.sync == "none":
                continue
            probe = run.probes[0]
            step, comm = 1e3 * probe["step_seconds"], 1e3 * (probe["replay_seconds"] or 0.0)
            faults = [p["step_minor_faults"] for p in run.probes]
            rows.append({"launch": launch, "run": label(run), "step ms": step, "compute ms": base,
                         "collectives alone ms": comm, "left ms": step - base - comm,
                         "faults per step, fewest rank": min(faults),
                         "faults per step, most": max(faults)})  # fmt: skip
    return pd.DataFrame(rows).set_index(["launch", "run"])
