"""When each layer's backward, the optimizer and each bucket's all-reduce start and end on the
workers, in one training step, for several bucket settings: the overlap, seen."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from helpers.data import load_har
from helpers.dist.launch import launch
from helpers.experiments.comm_engineering.variants import UNTIMED_STEPS, Variant, timing_config
from helpers.training import (
    TrainConfig,
    build_model,
    train_steps,
    worker_data,
)


def _timeline_one(rank: int, world_size: int, config: TrainConfig, X, y) -> dict:
    comm_log: list = []
    events: list[tuple[str, int, float]] = []  # (what, layer, perf_counter)
    model = build_model(config, rank, comm_log)
    net = model.module if hasattr(model, "module") else model
    linear = [m for m in net if isinstance(m, nn.Linear)]
    clock = time.perf_counter
    handles = [
        linear[0].register_forward_pre_hook(lambda *_: events.append(("forward", 0, clock()))),
        linear[-1].register_forward_hook(lambda *_: events.append(("forward end", 0, clock()))),
        register_optimizer_step_pre_hook(lambda *_: events.append(("optimizer", 0, clock()))),
        register_optimizer_step_post_hook(lambda *_: events.append(("optimizer end", 0, clock()))),
    ]
    for i, layer in enumerate(linear):
        handles.append(
            layer.register_full_backward_pre_hook(
                lambda *_, i=i: events.append(("backward", i, clock()))
            )
        )
        for p in layer.parameters():
            handles.append(
                p.register_post_accumulate_grad_hook(
                    lambda _, i=i: events.append(("backward end", i, clock()))
                )
            )
    dist.barrier()
    with warnings.catch_warnings():  # the first layer's inputs are data: no gradient for them
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        train_steps(model, X, y, config, rank, world_size)
    for h in handles:
        h.remove()
    start = max(t for what, _, t in events if what == "forward")  # the last step's start
    return {
        "events": [(w, i, t - start) for w, i, t in events if t >= start],
        "comm": [(b, s - start, e - start) for b, s, e in comm_log if s >= start],
    }

def timeline_worker(rank: int, world_size: int, configs: Sequence[TrainConfig]) -> list[dict]:
    """Worker: for each config, train its steps and return the events of the last one, in
    seconds from its forward's start: layers' forward and backward, the optimizer, buckets."""
    _, X, y = worker_data(configs, world_size)
    return [_timeline_one(rank, world_size, c, X, y) for c in configs]

def timeline_table(record: dict) -> pd.DataFrame:
    """One step's events as intervals: row (compute or communication), what, start_ms, end_ms."""
    events = record["events"]

    def first(what: str, layer: int = 0) -> float:
        return min(t for w, i, t in events if w == what and i == layer)

    rows = [("compute", "forward", first("forward"), first("forward end"))]
    layers = sorted({i for w, i, _ in events if w == "backward"}, reverse=True)
    for i in layers:
        end = max(t for w, j, t in events if w == "backward end" and j == i)
        rows.append(("compute", f"backward layer {i + 1}", first("backward", i), end))
    rows.append(("compute", "optimizer", first("optimizer"), first("optimizer end")))
    for b, s, e in sorted(record["comm"], key=lambda c: c[1]):
        rows.append(("communication", f"bucket {b}", s, e))
    table = pd.DataFrame(rows, columns=["row", "what", "start_ms", "end_ms"])
    table[["start_ms", "end_ms"]] *= 1e3
    return table

def record_timelines(
    variants: Sequence[Variant], global_batch: int = 2048, world: int = 2, data: str | None = None
) -> dict[str, list[pd.DataFrame]]:
    """For each variant, one step's timeline on every worker (``timeline_table``), after
    ``UNTIMED_STEPS`` steps. Keyed by the variant's name, one table per rank."""
    har = load_har(data)
    base = timing_config(global_batch, len(har.X_train), har.source)
    base = replace(base, max_steps=UNTIMED_STEPS + 1, untimed_steps=0)
    configs = [v.config(base) for v in variants]
    per_rank = launch(timeline_worker, world, configs)
    return {
        v.name: [timeline_table(records[i]) for records in per_rank] for i, v in enumerate(variants)
    }

def overlap_share(table: pd.DataFrame) -> float:
    """Fraction of the communication time that ran while a layer's backward was computing: each
    bucket's interval intersected with the backward bars themselves, so that a stall between two
    bars (a backward waiting for an all-reduce) counts as no overlap."""
    backward = table[table["what"].str.startswith("backward")]
    busy: list[list[float]] = []  # the backward bars' union, as disjoint intervals
    for s, e in sorted(zip(backward["start_ms"], backward["end_ms"], strict=True)):
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e])
    comm = table[table["row"] == "communication"]
    hidden = sum(max(0.0, min(ce, e) - max(cs, s))
                 for cs, ce in zip(comm["start_ms"], comm["end_ms"], strict=True)
                 for s, e in busy)  # fmt: skip
    total = (comm["end_ms"] - comm["start_ms"]).sum()
    return float(hidden / total) if total > 0 else 0.0
