"""Step times of DDP variants, all in one launch, interleaved over repeats so that a burst of
load hits every variant alike, beside one worker's step time measured the same way; the speed-up
tables the notebook reads."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.data import load_har
from helpers.dist.comm_hooks import CommHook
from helpers.dist.launch import launch
from helpers.experiments.comm_engineering.variants import BATCHES, REPEATS, Variant, timing_config
from helpers.training import (
    TrainConfig,
    build_model,
    train_steps,
    weights_digest,
    worker_data,
)


def _local_step_seconds(rank: int, world_size: int, config: TrainConfig, X, y):
    """This rank's seconds per timed step, and its trained model (wrapped, as it trained)."""
    model = build_model(config, rank)
    if world_size > 1:
        dist.barrier()
    loop = train_steps(model, X, y, config, rank, world_size)
    seconds = (time.perf_counter() - loop.clock_start) / (config.max_steps - config.untimed_steps)
    return seconds, model

def pytorch_records(model: nn.Module) -> dict:
    """What PyTorch itself recorded of a trained model's communication: DDP's buckets as rebuilt
    after the first step and the hook it called (``_get_ddp_logging_data``), and PowerSGD's
    element counts before and after compression, summed over the steps it compressed
    (``PowerSGDState.compression_stats``); empty strings and zeros where there is none."""
    if not isinstance(model, DDP):
        return {"rebuilt_bucket_sizes": "", "comm_hook": "", "numel_before": 0, "numel_after": 0}
    logged = model._get_ddp_logging_data()  # a hook never registered is absent
    states = [s for _, s in model._comm_hooks if isinstance(s, powerSGD_hook.PowerSGDState)]
    _, before, after = states[0].compression_stats() if states else (0, 0, 0)
    return {"rebuilt_bucket_sizes": logged.get("rebuilt_bucket_sizes", ""),
            "comm_hook": logged.get("comm_hook", ""), "numel_before": before,
            "numel_after": after}  # fmt: skip

def _time_one(rank: int, world_size: int, config: TrainConfig, X, y) -> tuple[float, str, dict]:
    """Seconds per timed step (the slowest rank's), this rank's weights digest and what PyTorch
    recorded (``pytorch_records``)."""
    local, model = _local_step_seconds(rank, world_size, config, X, y)
    seconds = torch.tensor([local])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    net = model.module if isinstance(model, DDP) else model
    return seconds.item(), weights_digest(net), pytorch_records(model)

def _time_alone(rank: int, config: TrainConfig, X, y) -> float:
    """Rank 0 trains the whole global batch alone, without DDP, while the others wait: one
    worker's step time, taken in the same conditions as the variants around it."""
    seconds = torch.zeros(1)
    if rank == 0:
        plain = replace(
            config,
            sync="none",
            comm_hook=CommHook.ALLREDUCE,
            bucket_cap_mb=None,
            accumulation_steps=1,
            sync_every_micro_batch=False,
        )
        seconds[0], _ = _local_step_seconds(0, 1, plain, X, y)
    dist.broadcast(seconds, src=0)
    return seconds.item()

def timing_worker(rank: int, world_size: int, configs: Sequence[TrainConfig], repeats: int) -> dict:
    """Worker: ``repeats`` rounds; in each, every config on all workers, preceded, where a new
    global batch starts, by one worker alone at that batch. Returns ``variants``: per config,
    ``(seconds per step, replicas identical)`` per round; ``alone``: per batch, one worker's
    seconds per step per round; ``records``: per config, this rank's ``pytorch_records`` of its
    last round. Every rank returns the same timings."""
    _, X, y = worker_data(configs, world_size)
    results: list[list[tuple[float, bool]]] = [[] for _ in configs]
    records: list[dict] = [{} for _ in configs]
    alone: dict[int, list[float]] = {}
    for _ in range(repeats):
        for i, config in enumerate(configs):
            if i == 0 or configs[i - 1].global_batch != config.global_batch:
                alone.setdefault(config.global_batch, []).append(_time_alone(rank, config, X, y))
            seconds, digest, records[i] = _time_one(rank, world_size, config, X, y)
            digests: list[str] = [""] * world_size
            dist.all_gather_object(digests, digest)
            results[i].append((seconds, len(set(digests)) == 1))
    return {"variants": results, "alone": alone, "records": records}

def time_variants(
    variants: Sequence[Variant],
    batches: Sequence[int] = BATCHES,
    world: int = 2,
    repeats: int = REPEATS,
    data: str | None = None,
    threads_per_worker: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seconds per step of every variant at every batch on ``world`` workers, and of one worker
    alone (a plain model, the whole global batch, ``threads_per_worker`` threads), in one launch:
    ``repeats`` rounds, each timing one worker and then every variant in turn, so that a burst of
    load hits them alike. Each run is a fresh model timed after ``UNTIMED_STEPS``; the figure is
    the median over the rounds of the slowest worker's time (``timing_rows``)."""
    har = load_har(data)
    points = [(v, b) for b in batches for v in variants]
    configs = [v.config(timing_config(b, len(har.X_train), har.source)) for v, b in points]
    found = launch(timing_worker, world, configs, repeats, threads_per_worker=threads_per_worker)[0]
    return timing_rows([(v.name, b) for v, b in points], found)

def timing_rows(
    points: Sequence[tuple[str, int]], found: dict
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``timing_worker``'s rounds as tables: the variants' (variant, global_batch, step_seconds:
    the median over the rounds, min_seconds and max_seconds: the fastest and the slowest round,
    round_seconds: every round's, in the order of the rounds, replicas_identical in every
    round, and rank 0's ``pytorch_records`` where ``found`` has them), in the order of
    ``points``, and one worker's (global_batch, step_seconds, min_seconds, max_seconds,
    round_seconds)."""

    def spread(times: Sequence[float]) -> dict:
        return {
            "step_seconds": statistics.median(times),
            "min_seconds": min(times),
            "max_seconds": max(times),
            "round_seconds": tuple(times),
        }

    rows = [
        {
            "variant": name,
            "global_batch": b,
            **spread([s for s, _ in found["variants"][i]]),
            "replicas_identical": all(same for _, same in found["variants"][i]),
            **(found["records"][i] if "records" in found else {}),
        }
        for i, (name, b) in enumerate(points)
    ]
    one = [{"global_batch": b, **spread(times)} for b, times in sorted(found["alone"].items())]
    return pd.DataFrame(rows), pd.DataFrame(one)

def speedup_table(timed: pd.DataFrame, one: pd.DataFrame) -> pd.DataFrame:
    """``time_variants``'s table with the speed-up over one worker at the same global batch."""
    base = one.set_index("global_batch")["step_seconds"]
    return timed.assign(speedup=timed["global_batch"].map(base) / timed["step_seconds"])


def paired_shares(silent: Sequence[float], variant: Sequence[float]) -> list[float]:
    """The share of the ceiling in each round: the silent step over the variant's step of the
    same round (both ran within seconds of each other, so a burst of load slows both).
    ``silent`` and ``variant``: seconds per step, one per round, in the order of the rounds."""
    if len(silent) != len(variant) or not silent:
        raise ValueError(
            f"pair the rounds: {len(silent)} silent and {len(variant)} variant rounds"
        )
    return [s / v for s, v in zip(silent, variant, strict=True)]


def share_bracket(
    silent: Sequence[float], variant: Sequence[float]
) -> tuple[float, float]:
    """The lowest and the highest of the rounds' ``paired_shares``: the spread of the rounds, not
    a confidence interval."""
    shares = paired_shares(silent, variant)
    return min(shares), max(shares)


def goal_speedup(ceiling: float, share: float) -> float | None:
    """The goal's speed-up, ``share`` of the ceiling, or None where that is below 1x: a goal of
    being slower than one worker alone is no goal. It happens where the silent workers were
    hardly faster than one worker alone, that is where they did not each have a core."""
    goal = share * ceiling
    return goal if goal >= 1.0 else None


def goal_verdict(low: float, high: float, goal: float) -> str:
    """The goal's verdict from a measured bracket of the share, not from one number, which a
    noisy run can put on either side by chance: "met" when the bracket lies wholly at or above
    the goal, "not met" when wholly below, "within noise" when it straddles it."""
    if low > high:
        raise ValueError(f"a bracket runs from low to high, got {low} > {high}: swap them")
    if low >= goal:
        return "met"
    return "not met" if high < goal else "within noise"


def speedup_text(table: pd.DataFrame) -> str:
    """Variants down, batches across: milliseconds per step (the median over the rounds, and in
    brackets the fastest and the slowest round, where the table has them) and speed-up."""
    spread = {"min_seconds", "max_seconds"} <= set(table.columns)

    def cell(row) -> str:  # noqa: ANN001
        text = f"{row.step_seconds * 1e3:7.1f} ms"
        if spread:
            text += f" [{row.min_seconds * 1e3:.1f}-{row.max_seconds * 1e3:.1f}]"
        return f"{text} {row.speedup:5.2f}x"

    shown = table.assign(cell=[cell(row) for row in table.itertuples()])
    wide = shown.pivot(index="variant", columns="global_batch", values="cell")
    wide = wide.reindex(list(dict.fromkeys(table["variant"])))
    wide.columns = [f"global batch {b}" for b in wide.columns]
    return wide.to_string()
