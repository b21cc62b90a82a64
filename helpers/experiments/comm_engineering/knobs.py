"""Notebook 07's knob study: what a CPU cluster's engineer would switch on to bring DDP at a small
global batch near the communication-free ceiling, each knob alone and combined, timed in one
launch, interleaved over rounds so that a burst of load hits every variant alike, beside one
worker alone and two workers that never communicate; and one DDP step profiled beside one
silent step, to show where the missing share goes.

Every knob is checked where it acts, not where it was asked for: DDP's own logging data (its
buckets, ``gradient_as_bucket_view``, ``static_graph``, the hook it calls), and the CPU affinity
of every thread of the worker, Gloo's included."""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

from helpers.data import load_har
from helpers.dist.cores import pin_threads, thread_affinities
from helpers.dist.launch import launch
from helpers.experiments.comm_engineering.timing import paired_shares
from helpers.experiments.comm_engineering.variants import ONE_BUCKET_MB
from helpers.training.metrics import weights_digest
from helpers.training.model import make_mlp

KNOB_BATCH = 256  # the global batch of issue 20's goal: 90% of the ceiling
KNOB_UNTIMED = 3  # DDP rebuilds its buckets after step 1 (static_graph decides at step 2)
KNOB_TIMED = 4
KNOB_ROUNDS = 3
PROFILED_STEPS = 4
GOAL_SHARE = 0.9


@dataclass(frozen=True)
class Knob:
    """One way to run the 2 workers' step: DDP with some of its options, or no DDP at all."""

    name: str
    ddp: bool = True  # False: each worker trains alone on its half (the ceiling)
    pin: bool = False  # every thread of worker r on core r (os.sched_setaffinity)
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    one_bucket: bool = False
    fp16: bool = False

    @property
    def same_math(self) -> bool:
        """Whether the knob leaves each gradient's arithmetic as default DDP's (fp16 rounds)."""
        return self.ddp and not self.fp16


SILENT = Knob("no communication", ddp=False)
DEFAULT = Knob("default DDP")
KNOBS = (
    SILENT,
    DEFAULT,
    Knob("pinned to a core", pin=True),
    Knob("gradient_as_bucket_view", gradient_as_bucket_view=True),
    Knob("static_graph", static_graph=True),
    Knob("one bucket", one_bucket=True),
    Knob("fp16 hook", fp16=True),
    Knob("all but fp16", pin=True, gradient_as_bucket_view=True, static_graph=True,
         one_bucket=True),
    Knob("all", pin=True, gradient_as_bucket_view=True, static_graph=True, one_bucket=True,
         fp16=True),
)  # fmt: skip


def build(knob: Knob, rank: int) -> nn.Module:
    """The reference MLP from seed 0, wrapped in DDP with the knob's options (these lines are
    what each knob changes)."""
    torch.manual_seed(0)
    model = make_mlp()
    if not knob.ddp:
        return model
    ddp = DDP(
        model,
        bucket_cap_mb=ONE_BUCKET_MB if knob.one_bucket else None,
        gradient_as_bucket_view=knob.gradient_as_bucket_view,
        static_graph=knob.static_graph,
    )
    if knob.fp16:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return ddp


def _batches(n: int, steps: int, global_batch: int, rank: int, world: int, alone: bool):
    """Each step's sample indices for this rank (all of them when training alone)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    share = global_batch // world
    for k in range(steps):
        chosen = order[(k * global_batch) % (n - global_batch):][:global_batch]
        yield chosen if alone else chosen[rank * share : (rank + 1) * share]


def _train(model: nn.Module, X, y, batches) -> list[float]:
    """Plain SGD steps; the seconds of each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seconds = []
    for idx in batches:
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(X[idx]), y[idx]).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return seconds


def _ddp_facts(model: nn.Module) -> dict:
    """What DDP itself records about its options (``_get_ddp_logging_data``)."""
    if not isinstance(model, DDP):
        return {"rebuilt_bucket_sizes": "", "gradient_as_bucket_view": 0, "static_graph": 0,
                "comm_hook": ""}  # fmt: skip
    logged = model._get_ddp_logging_data()  # a flag that is off may be absent
    return {"rebuilt_bucket_sizes": logged.get("rebuilt_bucket_sizes", ""),
            "gradient_as_bucket_view": int(logged.get("gradient_as_bucket_view") or 0),
            "static_graph": int(logged.get("static_graph") or 0),
            "comm_hook": logged.get("comm_hook", "")}  # fmt: skip


def _run(knob: Knob, rank: int, world: int, X, y, steps: int, untimed: int, profiled: bool = False):
    """One knob's short training on every rank: its seconds per timed step (the slowest rank's),
    DDP's facts, the threads' affinities, the final weights."""
    everywhere = os.sched_getaffinity(0)
    cores = sorted(everywhere)
    if knob.pin:
        pin_threads({cores[rank % len(cores)]})
    try:
        model = build(knob, rank)
        batches = list(_batches(len(X), steps, KNOB_BATCH, rank, world, alone=False))
        _train(model, X, y, batches[:untimed])
        dist.barrier()
        if profiled:
            summary = profile_steps(model, X, y, batches[untimed:])
            seconds = summary["step_ms"] / 1e3
        else:
            summary = None
            seconds = statistics.mean(_train(model, X, y, batches[untimed:]))
        affinity = sorted(sorted(s) for s in thread_affinities())
    finally:
        if knob.pin:
            pin_threads(everywhere)
    slowest = torch.tensor([seconds])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    net = model.module if isinstance(model, DDP) else model
    weights = torch.cat([p.detach().flatten() for p in net.parameters()]).double().numpy()
    return slowest.item(), _ddp_facts(model), affinity, weights, weights_digest(net), summary


def _alone(rank: int, X, y, steps: int, untimed: int) -> float:
    """Rank 0 trains the whole global batch without DDP while the others wait."""
    seconds = torch.zeros(1)
    if rank == 0:
        torch.manual_seed(0)
        batches = list(_batches(len(X), steps, KNOB_BATCH, 0, 1, alone=True))
        model = make_mlp()
        _train(model, X, y, batches[:untimed])
        seconds[0] = statistics.mean(_train(model, X, y, batches[untimed:]))
    dist.broadcast(seconds, src=0)
    return seconds.item()


def knob_worker(
    rank: int, world: int, data: str | None, knobs: Sequence[Knob], rounds: int,
    untimed: int = KNOB_UNTIMED, timed: int = KNOB_TIMED,
) -> dict:  # fmt: skip
    """Worker: ``rounds`` rounds, each one worker alone then every knob in turn; then default DDP
    and the silent step profiled. Returns rank 0's view (every rank's affinities)."""
    har = load_har(data, download=False)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    steps = untimed + timed
    seconds: dict[str, list[float]] = {k.name: [] for k in knobs}
    alone, facts, weights, digests, affinity = [], {}, {}, {}, {}
    for _ in range(rounds):
        alone.append(_alone(rank, X, y, steps, untimed))
        for knob in knobs:
            s, facts[knob.name], affinity[knob.name], weights[knob.name], digest, _ = _run(
                knob, rank, world, X, y, steps, untimed)
            seconds[knob.name].append(s)
            every = [""] * world
            dist.all_gather_object(every, digest)
            digests[knob.name] = every
    profiles = {k.name: _run(k, rank, world, X, y, untimed + PROFILED_STEPS, untimed, True)[5]
                for k in (SILENT, DEFAULT)}  # fmt: skip
    every_affinity = [None] * world
    dist.all_gather_object(every_affinity, affinity)
    gaps = {name: float(np.abs(w - weights[DEFAULT.name]).max()) for name, w in weights.items()}
    return {"seconds": seconds, "alone": alone, "facts": facts, "digests": digests,
            "gaps": gaps, "affinity": every_affinity, "profiles": profiles}  # fmt: skip


def time_knobs(
    data: str | None = None, knobs: Sequence[Knob] = KNOBS, rounds: int = KNOB_ROUNDS,
    world: int = 2,
) -> dict:  # fmt: skip
    """The study in one launch of ``world`` workers (``knob_worker``)."""
    found = launch(knob_worker, world, load_har(data).source, tuple(knobs), rounds)
    return {**found[0], "knobs": [asdict(k) for k in knobs]}


def knob_table(found: dict) -> pd.DataFrame:
    """One row per knob: the median step over the rounds (the fastest, the slowest, and every
    round's in ``round_ms``, in the order of the rounds), the speed-up over one worker alone,
    the share of the communication-free ceiling (the median over the rounds of the silent step
    over the same round's step, ``paired_shares``), and what was checked."""
    alone = statistics.median(found["alone"])
    silent = found["seconds"][SILENT.name]
    rows = []
    for k in found["knobs"]:
        times = found["seconds"][k["name"]]
        step = statistics.median(times)
        rows.append({
            "variant": k["name"], "step_ms": 1e3 * step, "min_ms": 1e3 * min(times),
            "max_ms": 1e3 * max(times), "round_ms": tuple(1e3 * t for t in times),
            "speedup": alone / step,
            "share_of_ceiling": statistics.median(paired_shares(silent, times)),
            "replicas_identical": len(set(found["digests"][k["name"]])) == 1,
            "gap_to_default": found["gaps"][k["name"]], **found["facts"][k["name"]],
        })  # fmt: skip
    return pd.DataFrame(rows)


# the profile's column for what the threads beside the training's recorded
GLOO_THREADS = "Gloo's threads"
# counts per step, kept out of the table of milliseconds: the all-reduces the training's thread
# issued (``c10d::allreduce_``) and those Gloo's threads ran (``gloo:all_reduce``), by the profiler
ALLREDUCES_ISSUED = "all-reduces issued per step"
ALLREDUCES_RUN = "all-reduces run by Gloo per step"
# what each profiled operator is, by name; everything else on the main thread is "other ops"
_COMPUTE = ("aten::mm", "aten::addmm", "aten::clamp_min", "aten::threshold_backward",
            "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
            "aten::nll_loss_backward", "aten::sum", "aten::add_", "aten::index")  # fmt: skip
_COPIES = ("aten::copy_", "aten::mul", "aten::mul_", "aten::div_", "aten::div", "aten::zero_",
           "aten::fill_")  # fmt: skip


def profile_steps(model: nn.Module, X, y, batches) -> dict[str, float]:
    """Milliseconds per step, from ``torch.profiler``'s record of the training's thread: the
    step's wall time; the compute (matrix products, activations, loss, the optimizer's update);
    copies and scalings (DDP copies every gradient into its bucket, scaled by 1/N, and back);
    the all-reduce calls issued here; other operators; and the time in no operator at all, which
    under DDP is mostly the wait for the all-reduces to complete at the end of backward. Beside
    them, "Gloo's threads": what every other thread recorded (``profile_all_threads``), the spans
    in which Gloo's threads run the all-reduces, waiting for the other worker included; and the
    all-reduces per step the profiler saw issued and run (``ALLREDUCES_ISSUED``, ``_RUN``)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # no timestamped start/stop lines on stderr
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    every_thread = _ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], experimental_config=every_thread) as prof:
        wall = sum(_train_with(optimizer, model, X, y, idx) for idx in batches)
    events = list(prof.events())
    thread = Counter(e.thread for e in events).most_common(1)[0][0]  # the training's: busiest
    parts = {"compute": 0.0, "copies": 0.0, "all-reduce calls": 0.0, "other ops": 0.0}
    others = 0.0
    counts = Counter()  # the profiler's record of the all-reduces: issued, and run by Gloo
    for event in events:
        if event.name in ("c10d::allreduce_", "gloo:all_reduce"):
            counts[(event.name, event.thread == thread)] += 1
        if event.thread != thread:
            if event.cpu_parent is None:  # a top-level span, its children inside it
                others += event.cpu_time_total / 1e3
            continue
        if event.name in _COMPUTE or event.name.startswith("Optimizer.step"):
            key = "compute"
        elif event.name in _COPIES:
            key = "copies"
        elif event.name.startswith(("c10d::", "gloo:")):
            key = "all-reduce calls"
        else:
            key = "other ops"
        parts[key] += event.self_cpu_time_total / 1e3
    n = len(batches)
    out = {k: v / n for k, v in parts.items()}
    out["step_ms"] = 1e3 * wall / n
    out["no operator (waiting)"] = max(out["step_ms"] - sum(parts.values()) / n, 0.0)
    out[GLOO_THREADS] = others / n
    out[ALLREDUCES_ISSUED] = counts[("c10d::allreduce_", True)] / n
    out[ALLREDUCES_RUN] = counts[("gloo:all_reduce", False)] / n
    return out


def _train_with(optimizer, model: nn.Module, X, y, idx) -> float:  # noqa: ANN001
    start = time.perf_counter()
    optimizer.zero_grad()
    F.cross_entropy(model(X[idx]), y[idx]).backward()
    optimizer.step()
    return time.perf_counter() - start


def profile_table(found: dict) -> pd.DataFrame:
    """The profiled steps side by side: milliseconds per step by what the training's thread did,
    its step, then Gloo's threads (beside the step, not part of it)."""
    table = pd.DataFrame(found["profiles"]).T.drop(columns=[ALLREDUCES_ISSUED, ALLREDUCES_RUN])
    table["step_ms"] = table.pop("step_ms")
    table[GLOO_THREADS] = table.pop(GLOO_THREADS)
    return table
