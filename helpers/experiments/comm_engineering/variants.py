"""The variants of the reference DDP training that notebook 07 compares (bucket caps, hooks,
accumulation), and the short training each is timed on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd
from torch import nn

from helpers.dist import buckets as bk
from helpers.dist.comm_hooks import CommHook, bytes_per_step, collectives_per_bucket
from helpers.training import (
    Sync,
    TrainConfig,
    epochs_for_min_steps,
)
from helpers.training.model import GRADIENT_BYTES, make_mlp

ONE_BUCKET_MB = math.ceil(GRADIENT_BYTES / bk.MIB)  # 7 MiB: every gradient in one bucket

# Off the clock: DDP rebuilds its buckets after step 1; PowerSGD compresses from step 2 on and
# allocates its factors and error buffers then.
UNTIMED_STEPS = 3

TIMED_STEPS = 4

REPEATS = 3

# a small global batch, where communication is much of the step, and a larger one, where it is
# less; 1024 rather than 2048 keeps the notebook's timings short (a step at 2048 costs twice that)
BATCHES = (256, 1024)

@dataclass(frozen=True)
class Variant:
    """A named change to the reference DDP training, for one row of a table."""

    name: str
    bucket_cap_mb: float | None = None
    comm_hook: CommHook = CommHook.ALLREDUCE
    powersgd_rank: int = 1
    accumulation_steps: int = 1
    sync_every_micro_batch: bool = False
    sync: Sync = "ddp"  # "none": the workers never communicate (the ceiling, measured)

    def config(self, base: TrainConfig) -> TrainConfig:
        return replace(
            base,
            sync=self.sync,
            bucket_cap_mb=self.bucket_cap_mb,
            comm_hook=self.comm_hook,
            powersgd_rank=self.powersgd_rank,
            accumulation_steps=self.accumulation_steps,
            sync_every_micro_batch=self.sync_every_micro_batch,
        )

BUCKET_VARIANTS = (
    Variant("default (2 buckets)"),
    Variant("bucket_cap_mb=0.001 (5 buckets)", bucket_cap_mb=0.001),
    Variant(f"one bucket (cap {ONE_BUCKET_MB} MiB)", bucket_cap_mb=ONE_BUCKET_MB),
)

# every compression on one bucket: PowerSGD needs it on Gloo, and the others are compared alike
HOOK_VARIANTS = (
    Variant("fp16", ONE_BUCKET_MB, CommHook.FP16),
    Variant("PowerSGD r=1", ONE_BUCKET_MB, CommHook.POWER_SGD, 1),
    Variant("PowerSGD r=2", ONE_BUCKET_MB, CommHook.POWER_SGD, 2),
    Variant("PowerSGD r=4", ONE_BUCKET_MB, CommHook.POWER_SGD, 4),
)

ACCUMULATION_VARIANTS = (
    Variant("4 micro-batches, no_sync", accumulation_steps=4),
    Variant("4 micro-batches, all-reduce each", accumulation_steps=4, sync_every_micro_batch=True),
)

# the two workers with no communication at all: each trains alone on its half (the replicas
# part); their step is each worker's compute while both run, the model's calibration
NO_COMMUNICATION = Variant("2 workers, no communication", sync="none")

def timing_config(global_batch: int, n_samples: int, data: str | None = None) -> TrainConfig:
    """A short training for timing: ``UNTIMED_STEPS`` then ``TIMED_STEPS`` steps."""
    steps = UNTIMED_STEPS + TIMED_STEPS
    return TrainConfig(
        global_batch=global_batch,
        epochs=epochs_for_min_steps(global_batch, n_samples, steps),
        untimed_steps=UNTIMED_STEPS,
        max_steps=steps,
        data=data,
    )

def bytes_table(variants: Sequence[Variant], model: nn.Module | None = None) -> pd.DataFrame:
    """Bytes each worker hands to the all-reduce per step, for each hook (counted from the
    gradients' shapes, PowerSGD's rule included), and the all-reduce calls per bucket."""
    model = model or make_mlp()
    shapes = [tuple(p.shape) for p in model.parameters()]
    full = bytes_per_step(shapes, CommHook.ALLREDUCE)
    rows = []
    for v in variants:
        n = bytes_per_step(shapes, v.comm_hook, v.powersgd_rank)
        rows.append(
            {
                "hook": v.comm_hook.label(v.powersgd_rank),
                "bytes_per_step": n,
                "reduction": f"{full / n:,.0f}x",
                "calls_per_bucket": collectives_per_bucket(v.comm_hook),
            }
        )
    return pd.DataFrame(rows)
