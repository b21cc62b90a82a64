"""The step-time model with overlap and compression: notebook 05's c0 + c1 B / N + alpha + beta *
bytes, with DDP's buckets running behind backward (``helpers.dist.buckets``), a hook's bytes and
compute, the ceiling with communication free, deeper models, and the activations autograd keeps."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from torch import nn

from helpers.dist import buckets as bk
from helpers.dist.comm_hooks import CommHook, bytes_per_step, collectives_per_bucket
from helpers.dist.comm_model import AlphaBeta
from helpers.experiments.comm_engineering.variants import Variant
from helpers.experiments.scaling import ComputeModel, fit_compute
from helpers.training.model import gradient_bytes, make_mlp

GIGABIT_BETA = 8e-9  # seconds per byte at 1 Gbit/s (125 MB/s)
# An all-reduce's fixed cost on a 1 Gbit/s Ethernet link, not the loopback's fit: an assumption,
# 0.5 ms a call, notebook 10's, of the order of Gloo's fixed cost on the loopback (larger when
# fitted under load). Measured beside it: Gloo over the kernel's TCP stack between two network
# namespaces, a veth pair that tc limits to 1 Gbit/s, from about 0.03 to 1 ms in notebook 10's
# runs, as the load moved (``python -m helpers.experiments.veth``); a real link adds its round
# trip through network cards and a switch, tens of microseconds. At 1 Gbit/s the gradient's bytes
# (52 ms) outweigh 0.5 ms a hundredfold.
GIGABIT_ALPHA = 0.5e-3

# One worker's step on a quiet machine, from issue 9's quick check (1 worker x 1 thread, random
# data of HAR's shape: 23.1 ms at global batch 256, 156 ms at 2048, the straight line through
# them): a fixed reference for the model's claims, where this machine's own fit moves with load.
QUIET_COMPUTE = ComputeModel(c0=4.1e-3, c1=74e-6)
# A launch counts as quiet only when its CPUs were at least this idle over the half second before
# it (``helpers.training.measure.idle_share``): other programs then held under a tenth of their
# time, a fifth of one core of 2. One other busy thread on 2 cores leaves them half idle.
QUIET_IDLE = 0.9

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
    matrix_rank: int = 1,
    overlap: bool = True,
    compress_seconds: float = 0.0,
) -> float:
    """Notebook 05's ``c0 + c1 B / N + alpha + beta * bytes``, with the buckets of
    ``bucket_cap_mb`` and, if ``overlap``, their all-reduces running behind backward
    (``helpers.dist.buckets.overlap_step_seconds``): ``c1 B / N`` split into forward and backward by
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
    nbytes = [bytes_per_step([shapes[n] for n in b.names], hook, matrix_rank) for b in plan]
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
    parallel: ComputeModel | None = None,
) -> pd.DataFrame:
    """The model's speed-up over one worker (``compute.predict(B)``) of each variant at each
    global batch: ``model_step_seconds`` with the variant's buckets and hook, its bytes and calls,
    and ``compress_seconds[variant name]`` of compression compute (0 where not given), each
    worker's compute taken from ``parallel`` if given (``calibrated_compute``), else from
    ``compute``. Variants with accumulation are left out: the model has no term for a
    micro-batch's fixed costs. Columns variant, global_batch, speedup."""
    compress_seconds = compress_seconds or {}
    parallel = parallel or compute
    rows = [
        {
            "variant": v.name,
            "global_batch": b,
            "speedup": compute.predict(b)
            / model_step_seconds(
                parallel,
                comm,
                b,
                world,
                bucket_cap_mb=v.bucket_cap_mb,
                hook=v.comm_hook,
                matrix_rank=v.powersgd_rank,
                compress_seconds=compress_seconds.get(v.name, 0.0),
            ),
        }
        for v in variants
        if v.accumulation_steps == 1
        for b in batches
    ]
    return pd.DataFrame(rows)

def communication_free_ceiling(
    compute: ComputeModel,
    global_batch: float,
    world: int = 2,
    parallel: ComputeModel | None = None,
) -> float:
    """The speed-up ``world`` workers would reach if communication cost nothing:
    ``(c0 + c1 B) / (c0 + c1 B / N)``, the denominator from ``parallel`` if given (each worker's
    compute while all run at once, ``calibrated_compute``), capped at ``N``: ``N`` workers do at
    most ``N`` times the work of one, and a larger ratio is a fit's error, not a speed-up. No
    communication technique can go beyond it; for ``c0 >= 0`` and no ``parallel`` it lies
    between 1 and ``N``."""
    parallel = parallel or compute
    return capped_ceiling(compute.predict(global_batch) / parallel.predict(global_batch / world),
                          world)  # fmt: skip


def capped_ceiling(speedup: float, world: int) -> float:
    """A communication-free speed-up of ``world`` workers (modelled or measured), capped at
    ``world``: ``N`` workers do at most ``N`` times the work of one, so a larger ratio is taken as
    a fit's error or noise. (A superlinear speed-up, from a share of the batch that fits a faster
    cache, is possible in general; the cap claims none.)"""
    return min(float(speedup), float(world))


# How far one round of the silent workers may lie from the calibrated line before the rounds are
# called uneven: a round a quarter slower or faster than the line got a different share of the
# cores than the others. Reported, not refused: the line goes through the rounds' medians, which
# one such round does not move.
MAX_ROUND_DEVIATION = 0.25


def calibrated_compute(silent: pd.DataFrame, world: int = 2) -> ComputeModel:
    """Each worker's ``c0 + c1 b`` on its share ``b = B / N`` while all ``world`` workers compute
    at once, fitted on steps of workers that never communicate (``silent``: columns
    global_batch, step_seconds; 2 batches or more). On shared cores it is slower than one worker
    alone (memory bandwidth, caches, the operating system's other threads), and the model's
    step should start from it, not from one worker's. The free fit, not clipped: check it with
    ``calibration_problems`` before using it."""
    return fit_compute(silent.assign(global_batch=silent["global_batch"] / world, world=1))


def calibration_problems(
    compute: ComputeModel, one: pd.DataFrame, silent: pd.DataFrame, *, fit: ComputeModel
) -> list[str]:
    """Why ``fit``, ``calibrated_compute(silent)``, is not physical, one sentence each; empty where
    it is plausible. ``compute``: one worker alone; ``one``: one worker's measured steps
    (global_batch, step_seconds); ``silent``: the silent workers' (global_batch, step_seconds),
    which ``fit`` was drawn through. Refused: a fixed cost per step below 0; a cost per sample
    below one worker's alone (sharing the cores cannot make a worker faster, and the ceiling
    would pass ``N``); silent workers no faster than one worker alone at a measured batch (a
    ceiling under 1x). Uneven rounds are not a reason: ``uneven_rounds`` reports them."""
    problems = []
    if fit.c0 < 0:
        problems.append(f"the fitted fixed cost per step is {fit.c0 * 1e3:.2f} ms, below 0")
    if fit.c1 < compute.c1:
        problems.append(
            f"the fitted cost per sample, {fit.c1 * 1e6:.1f} us, is below one worker's alone "
            f"({compute.c1 * 1e6:.1f} us): sharing the cores cannot make a worker faster, and the "
            "model would pass 2x at large batches"
        )
    alone = one.set_index("global_batch")["step_seconds"]
    for row in silent.itertuples():
        if row.global_batch in alone.index and row.step_seconds >= alone[row.global_batch]:
            problems.append(
                f"at global batch {row.global_batch} the silent workers' step "
                f"({row.step_seconds * 1e3:.1f} ms) is no shorter than one worker's alone "
                f"({alone[row.global_batch] * 1e3:.1f} ms): a ceiling under 1x; most likely they "
                "did not each have a core throughout"
            )
    return problems


def uneven_rounds(
    silent: pd.DataFrame,
    *,
    fit: ComputeModel,
    world: int = 2,
    max_deviation: float = MAX_ROUND_DEVIATION,
) -> str | None:
    """The silent workers' round furthest from the calibrated line ``fit``
    (``calibrated_compute(silent, world)``), in a sentence, where it lies more than
    ``max_deviation`` from it (``silent``: global_batch, step_seconds, round_seconds); else None.
    A caution for the reader, not a refusal: the line goes through the medians."""
    worst = max(
        ((abs(t / line - 1) if line > 0 else float("inf"), row.global_batch, t)
         for row in silent.itertuples()
         for line in [fit.predict(row.global_batch / world)] for t in row.round_seconds),
        default=None,
    )  # fmt: skip
    if worst is None or worst[0] <= max_deviation:
        return None
    return (f"a round at global batch {worst[1]} ({worst[2] * 1e3:.1f} ms) lies {worst[0]:.0%} "
            f"from the fitted line, more than {max_deviation:.0%}: the rounds got different "
            "shares of the cores; the line goes through their medians")  # fmt: skip


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
    parallel: ComputeModel | None = None,
) -> pd.DataFrame:
    """The model's step for MLPs of ``depths`` square layers of ``width``: gradient bytes,
    DDP's default buckets, the all-reduce time in all, how much of it the default buckets leave
    exposed after backward, and the speed-up without overlap (one bucket) and with it. Both
    computes are carried over by ``scaled_compute``: one worker's (``compute``) is the speed-up's
    numerator; each worker's while all run (``parallel``, ``calibrated_compute``; ``compute`` if
    not given) is the step's, as in ``model_speedups``."""
    parallel = parallel or compute
    rows = []
    for depth in depths:
        model = deep_mlp(depth, width)
        alone = scaled_compute(compute, model)
        fit = scaled_compute(parallel, model)
        plan = bk.bucket_plan(model)
        one = alone.predict(global_batch)
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
