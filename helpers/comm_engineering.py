"""Notebook 06's experiments: making DDP's communication cheaper, measured.

* ``record_timelines`` (a launch): when each layer's backward, the optimizer and each bucket's
  all-reduce start and end on the workers, one training step, for several bucket settings;
* ``time_variants``: step times of DDP variants (bucket caps, hooks, accumulation), all in one
  launch, interleaved over repeats so that a burst of load hits every variant alike, beside one
  worker's step time measured the same way;
* the tables the notebook reads (``speedup_table``, ``bytes_table``), the step-time model with
  overlap and compression (``model_step_seconds``, ``model_speedups``), and the goal: the best
  speed-up among the techniques that keep the accuracy (``best_within_tolerance``) beside the
  ceiling with communication free (``communication_free_ceiling``);
* the activations autograd keeps for backward, counted (``activation_bytes``) and seen
  (``saved_activation_bytes``).

The training loop is ``helpers.training``'s; the buckets and the overlap model are
``helpers.buckets``'s; the hooks ``helpers.comm_hooks``'s.

``python -m helpers.comm_engineering`` runs the longer measurements the notebook leaves out (more
repeats, more seeds for PowerSGD's accuracy).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from helpers import buckets as bk
from helpers.comm_hooks import CommHook, bytes_per_step, collectives_per_bucket
from helpers.comm_model import AlphaBeta
from helpers.data import load_har
from helpers.launch import launch
from helpers.model import gradient_bytes, make_mlp
from helpers.scaling import ComputeModel
from helpers.training import (
    RunResult,
    Sync,
    TrainConfig,
    build_model,
    epochs_for_min_steps,
    run_trainings,
    torch_threads,
    train_steps,
    weights_digest,
    worker_data,
)

GRADIENT_BYTES = gradient_bytes(make_mlp())
ONE_BUCKET_MB = math.ceil(GRADIENT_BYTES / bk.MIB)  # 7 MiB: every gradient in one bucket
# Off the clock: DDP rebuilds its buckets after step 1; PowerSGD compresses from step 2 on and
# allocates its factors and error buffers then.
UNTIMED_STEPS = 3
TIMED_STEPS = 4
REPEATS = 3
BATCHES = (256, 2048)
GIGABIT_BETA = 8e-9  # seconds per byte at 1 Gbit/s (125 MB/s)
# One worker's step on a quiet machine, from issue 9's quick check (1 worker x 1 thread, random
# data of HAR's shape: 23.1 ms at global batch 256, 156 ms at 2048, the straight line through
# them): a fixed reference for the model's claims, where this machine's own fit moves with load.
QUIET_COMPUTE = ComputeModel(c0=4.1e-3, c1=74e-6)


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
    Variant(f"one bucket ({ONE_BUCKET_MB} MiB)", bucket_cap_mb=ONE_BUCKET_MB),
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


# --------------------------------------------------------------------------- step times


def _local_step_seconds(rank: int, world_size: int, config: TrainConfig, X, y):
    """This rank's seconds per timed step, and its trained model (unwrapped)."""
    model = build_model(config, rank)
    if world_size > 1:
        dist.barrier()
    loop = train_steps(model, X, y, config, rank, world_size)
    seconds = (time.perf_counter() - loop.clock_start) / (config.max_steps - config.untimed_steps)
    return seconds, (model.module if hasattr(model, "module") else model)


def _time_one(rank: int, world_size: int, config: TrainConfig, X, y) -> tuple[float, str]:
    """Seconds per timed step (the slowest rank's) and this rank's weights digest."""
    local, net = _local_step_seconds(rank, world_size, config, X, y)
    seconds = torch.tensor([local])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return seconds.item(), weights_digest(net)


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
    seconds per step per round. Every rank returns the same."""
    _, X, y = worker_data(configs, world_size)
    results: list[list[tuple[float, bool]]] = [[] for _ in configs]
    alone: dict[int, list[float]] = {}
    for _ in range(repeats):
        for i, config in enumerate(configs):
            if i == 0 or configs[i - 1].global_batch != config.global_batch:
                alone.setdefault(config.global_batch, []).append(_time_alone(rank, config, X, y))
            seconds, digest = _time_one(rank, world_size, config, X, y)
            digests: list[str] = [""] * world_size
            dist.all_gather_object(digests, digest)
            results[i].append((seconds, len(set(digests)) == 1))
    return {"variants": results, "alone": alone}


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
    replicas_identical in every round), in the order of ``points``, and one worker's
    (global_batch, step_seconds, min_seconds, max_seconds)."""

    def spread(times: Sequence[float]) -> dict:
        return {
            "step_seconds": statistics.median(times),
            "min_seconds": min(times),
            "max_seconds": max(times),
        }

    rows = [
        {
            "variant": name,
            "global_batch": b,
            **spread([s for s, _ in found["variants"][i]]),
            "replicas_identical": all(same for _, same in found["variants"][i]),
        }
        for i, (name, b) in enumerate(points)
    ]
    one = [{"global_batch": b, **spread(times)} for b, times in sorted(found["alone"].items())]
    return pd.DataFrame(rows), pd.DataFrame(one)


def speedup_table(timed: pd.DataFrame, one: pd.DataFrame) -> pd.DataFrame:
    """``time_variants``'s table with the speed-up over one worker at the same global batch."""
    base = one.set_index("global_batch")["step_seconds"]
    return timed.assign(speedup=timed["global_batch"].map(base) / timed["step_seconds"])


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


# --------------------------------------------------------------------------- bytes


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


# --------------------------------------------------------------------------- the timeline


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
    """Fraction of the communication time that ran while backward was still computing."""
    backward = table[table["what"].str.startswith("backward")]
    b_start, b_end = backward["start_ms"].min(), backward["end_ms"].max()
    comm = table[table["row"] == "communication"]
    hidden = (np.minimum(comm["end_ms"], b_end) - np.maximum(comm["start_ms"], b_start)).clip(0)
    total = (comm["end_ms"] - comm["start_ms"]).sum()
    return float(hidden.sum() / total) if total > 0 else 0.0


# --------------------------------------------------------------------------- the model


def mlp_layers(model: nn.Module) -> list[tuple[int, int]]:
    """``(inputs, outputs)`` of each linear layer, in forward order."""
    return [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]


def layer_of_parameters(model: nn.Module) -> dict[str, int]:
    """Each parameter's linear layer, counted in the order backward reaches them (0: last)."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return {
        f"{name}.{p}": len(names) - 1 - k
        for k, name in enumerate(names)
        for p, _ in dict(model.named_modules())[name].named_parameters()
    }


def model_step_seconds(
    compute: ComputeModel,
    comm: AlphaBeta,
    global_batch: float,
    world: int,
    model: nn.Module | None = None,
    bucket_cap_mb: float | None = None,
    hook: CommHook = CommHook.ALLREDUCE,
    rank: int = 1,
    overlap: bool = True,
    compress_seconds: float = 0.0,
) -> float:
    """Notebook 04's ``c0 + c1 B / N + alpha + beta * bytes``, with the buckets of
    ``bucket_cap_mb`` and, if ``overlap``, their all-reduces running behind backward
    (``helpers.buckets.overlap_step_seconds``): ``c1 B / N`` split into forward and backward by
    the layers' multiply-adds, ``c0`` after backward (the optimizer). A hook changes the bytes
    (``comm_hooks.bytes_per_step``), the calls per bucket, and adds ``compress_seconds`` of
    compute per step."""
    model = model or make_mlp()
    per_sample = compute.c1 * global_batch / world
    fwd_work, bwd_work = bk.forward_and_backward_work(mlp_layers(model))
    forward = per_sample * fwd_work / (fwd_work + bwd_work)
    backward = per_sample - forward
    if world == 1:
        return compute.c0 + per_sample
    plan = bk.bucket_plan(model, bucket_cap_mb)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    nbytes = [bytes_per_step([shapes[n] for n in b.names], hook, rank) for b in plan]
    calls = collectives_per_bucket(hook)
    if not overlap:
        comm_total = sum(calls * comm.alpha + comm.beta * b for b in nbytes)
        return compute.c0 + per_sample + compress_seconds + comm_total
    ready = bk.bucket_ready_fractions(
        plan, layer_of_parameters(model), bk.backward_shares(mlp_layers(model))
    )
    step, _ = bk.overlap_step_seconds(forward, backward, compute.c0, ready, nbytes, comm, calls)
    return step + compress_seconds


def model_speedups(
    variants: Sequence[Variant],
    compute: ComputeModel,
    comm: AlphaBeta,
    batches: Sequence[float],
    world: int = 2,
    compress_seconds: dict[str, float] | None = None,
) -> pd.DataFrame:
    """The model's speed-up over one worker (``compute.predict(B)``) of each variant at each
    global batch: ``model_step_seconds`` with the variant's buckets and hook, its bytes and calls,
    and ``compress_seconds[variant name]`` of compression compute (0 where not given). Variants
    with accumulation are left out: the model has no term for a micro-batch's fixed costs.
    Columns variant, global_batch, speedup."""
    compress_seconds = compress_seconds or {}
    rows = [
        {
            "variant": v.name,
            "global_batch": b,
            "speedup": compute.predict(b)
            / model_step_seconds(
                compute,
                comm,
                b,
                world,
                bucket_cap_mb=v.bucket_cap_mb,
                hook=v.comm_hook,
                rank=v.powersgd_rank,
                compress_seconds=compress_seconds.get(v.name, 0.0),
            ),
        }
        for v in variants
        if v.accumulation_steps == 1
        for b in batches
    ]
    return pd.DataFrame(rows)


def communication_free_ceiling(compute: ComputeModel, global_batch: float, world: int = 2) -> float:
    """The speed-up ``world`` workers would reach if communication cost nothing:
    ``(c0 + c1 B) / (c0 + c1 B / N)``. No communication technique can go beyond it; for
    ``c0 >= 0`` it lies between 1 and ``N``."""
    return float(compute.predict(global_batch) / compute.predict(global_batch / world))


def deep_mlp(layers: int, width: int = 1024) -> nn.Module:
    """An MLP of ``layers`` square layers on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return make_mlp_stack([width] * (layers + 1))


def make_mlp_stack(widths: Sequence[int]) -> nn.Sequential:
    parts: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        parts += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*parts[:-1])


def scaled_compute(compute: ComputeModel, model: nn.Module) -> ComputeModel:
    """The reference MLP's ``c0 + c1 B`` carried over to another MLP: ``c1`` by the ratio of
    multiply-adds per sample, ``c0`` (the optimizer's update, mostly) by the ratio of
    parameters. A first guess, for matrix products as efficient as the reference's."""
    ref = make_mlp()
    work = sum(bk.forward_and_backward_work(mlp_layers(model)))
    ref_work = sum(bk.forward_and_backward_work(mlp_layers(ref)))
    params = sum(p.numel() for p in model.parameters())
    ref_params = sum(p.numel() for p in ref.parameters())
    return ComputeModel(compute.c0 * params / ref_params, compute.c1 * work / ref_work)


def overlap_table(
    compute: ComputeModel,
    comm: AlphaBeta,
    depths: Sequence[int],
    global_batch: int,
    world: int = 2,
    width: int = 1024,
) -> pd.DataFrame:
    """The model's step for MLPs of ``depths`` square layers of ``width``: gradient bytes,
    DDP's default buckets, the all-reduce time in all, how much of it the default buckets leave
    exposed after backward, and the speed-up without overlap (one bucket) and with it."""
    rows = []
    for depth in depths:
        model = deep_mlp(depth, width)
        fit = scaled_compute(compute, model)
        plan = bk.bucket_plan(model)
        one = fit.predict(global_batch)
        _, pipe = _pipeline_of(fit, comm, global_batch, world, model)
        rows.append(
            {
                "layers": depth,
                "gradient_MB": gradient_bytes(model) / 1e6,
                "buckets": len(plan),
                "compute_ms": (fit.predict(global_batch / world)) * 1e3,
                "allreduce_ms": pipe.total * 1e3,
                "exposed_ms": pipe.exposed * 1e3,
                "speedup_no_overlap": one
                / model_step_seconds(fit, comm, global_batch, world, model, overlap=False),
                "speedup_overlap": one / model_step_seconds(fit, comm, global_batch, world, model),
            }
        )
    return pd.DataFrame(rows)


def _pipeline_of(compute, comm, global_batch, world, model) -> tuple[float, bk.Pipeline]:
    per_sample = compute.c1 * global_batch / world
    fwd_work, bwd_work = bk.forward_and_backward_work(mlp_layers(model))
    backward = per_sample * bwd_work / (fwd_work + bwd_work)
    plan = bk.bucket_plan(model)
    ready = bk.bucket_ready_fractions(
        plan, layer_of_parameters(model), bk.backward_shares(mlp_layers(model))
    )
    return bk.overlap_step_seconds(
        per_sample - backward, backward, compute.c0, ready, [b.nbytes for b in plan], comm
    )


# --------------------------------------------------------------------------- memory and compression


def activation_bytes(batch: int, model: nn.Module | None = None) -> int:
    """Bytes of the activations autograd keeps for backward on ``batch`` samples of an MLP of
    linear layers with ReLUs between them and a cross-entropy loss, in float32: the input (for
    the first layer's weight gradient), each ReLU's output (which the ReLU's backward and the next
    layer's weight gradient both use: one tensor, kept once) and the log-softmax's output (for the
    loss's backward). The linear layers' outputs before the ReLUs are not kept. Accumulating over
    ``k`` micro-batches needs those of one micro-batch only, since each micro-batch's backward
    frees them before the next. ``saved_activation_bytes`` checks it against autograd."""
    model = model or make_mlp()
    layers = mlp_layers(model)
    per_sample = layers[0][0] + sum(n_out for _, n_out in layers[:-1]) + layers[-1][1]
    return 4 * batch * per_sample


def saved_activation_bytes(batch: int, model: nn.Module | None = None) -> int:
    """Bytes of the activations autograd actually keeps for one forward of ``model`` and its
    cross-entropy loss on ``batch`` random samples, as ``torch.autograd.graph.saved_tensors_hooks``
    sees them: every tensor saved for backward, each storage counted once (a ReLU's output is
    saved by the ReLU and by the next layer), leaving out the model's parameters (saved by the
    layers, but no activations) and what has no row per sample (the labels, which are integers,
    and the loss's scalar weight)."""
    model = model or make_mlp()
    n_in = mlp_layers(model)[0][0]
    n_out = mlp_layers(model)[-1][1]
    X = torch.randn(batch, n_in, generator=torch.Generator().manual_seed(0))
    y = torch.arange(batch) % n_out
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        is_activation = t.is_floating_point() and t.dim() >= 1 and t.shape[0] == batch
        if is_activation and storage.data_ptr() not in params:
            saved[storage.data_ptr()] = t  # kept alive, so no other tensor reuses the address
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(X), y)
    total = sum(t.untyped_storage().nbytes() for t in saved.values())
    del loss
    return total


def compression_seconds(
    hook: CommHook, rank: int = 1, repeats: int = 5, model: nn.Module | None = None
) -> float:
    """One worker's compute per step for a hook's compression, measured in this process on
    one thread (the fastest of ``repeats``: the compute itself, without what other programs took
    from it): the casts of FP16/BF16, or PowerSGD's products
    ``P = M Q``, ``Q = M^T P`` and ``M ~ P Q^T`` with its orthogonalisation and error feedback,
    for every gradient matrix it compresses. Zero for ``ALLREDUCE``."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    if hook is CommHook.ALLREDUCE:
        return 0.0
    model = model or make_mlp()
    grads = [torch.randn(p.shape) for p in model.parameters()]
    flat = torch.cat([g.ravel() for g in grads])
    error = torch.zeros_like(flat)

    def powersgd() -> None:
        flat.add_(error)  # error feedback in
        copy = flat.clone()
        for g in grads:
            if g.dim() < 2:
                continue
            m = g.view(g.shape[0], -1)
            r = min(*m.shape, rank)
            if m.numel() <= (sum(m.shape) * r) * 2:
                continue
            q = torch.randn(1, m.shape[1], r)
            p = torch.bmm(m.unsqueeze(0), q)
            _orthogonalize(p)
            q = torch.bmm(m.t().unsqueeze(0), p)
            m.copy_(torch.bmm(p, q.transpose(1, 2))[0])
        torch.sub(copy, flat, out=error)  # error feedback out

    def cast() -> None:
        dtype = torch.float16 if hook is CommHook.FP16 else torch.bfloat16
        flat.copy_(flat.to(dtype).div_(2))

    work = powersgd if hook is CommHook.POWER_SGD else cast
    with torch_threads(1):
        work()  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
    return min(times)


# --------------------------------------------------------------------------- accuracy


def train_hooks(
    variants: Sequence[Variant], base: TrainConfig, world: int = 2, threads_per_worker: int = 1
) -> list[RunResult]:
    """The same training under each variant, in one launch, final weights returned."""
    return run_trainings(
        world, [replace(v.config(base), return_weights=True) for v in variants], threads_per_worker
    )


def best_within_tolerance(
    table: pd.DataFrame,
    accuracy: dict[str, float],
    reference_accuracy: float,
    tolerance: float,
    global_batch: int = 256,
) -> pd.DataFrame:
    """The rows of ``speedup_table``'s table at ``global_batch`` whose variant's test accuracy
    (``accuracy``, by variant name; variants without one are left out) lies within
    ``tolerance`` of ``reference_accuracy``, fastest first, with their accuracy and its gap."""
    rows = table[(table["global_batch"] == global_batch) & table["variant"].isin(list(accuracy))]
    rows = rows.assign(accuracy=rows["variant"].map(accuracy))
    rows = rows.assign(accuracy_gap=(rows["accuracy"] - reference_accuracy).abs())
    kept = rows[rows["accuracy_gap"] <= tolerance + 1e-12]
    return kept.sort_values("speedup", ascending=False).reset_index(drop=True)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timing rounds (default 7)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds of the accuracy runs"
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs of each accuracy run")
    parser.add_argument("--data", default=None, help="auto | uci | recordings | standin")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 1:
        parser.error("--repeats and --epochs must be at least 1")
    print(f"load average {os.getloadavg()}")
    timed, one = time_variants(
        BUCKET_VARIANTS + HOOK_VARIANTS + ACCUMULATION_VARIANTS,
        repeats=args.repeats,
        data=args.data,
    )
    print(speedup_text(speedup_table(timed, one)))
    print(f"load average {os.getloadavg()}")
    reference = Variant(f"one bucket ({ONE_BUCKET_MB} MiB)", bucket_cap_mb=ONE_BUCKET_MB)
    variants = (reference,) + HOOK_VARIANTS
    for seed in args.seeds:
        runs = train_hooks(variants, TrainConfig(epochs=args.epochs, seed=seed, data=args.data))
        line = ", ".join(
            f"{v.name} {r.accuracy:.2%}{'' if r.replicas_identical else ' (replicas differ!)'}"
            for v, r in zip(variants, runs, strict=True)
        )
        print(f"seed {seed}, {args.epochs} epochs at 256: {line}", flush=True)


if __name__ == "__main__":
    main()
