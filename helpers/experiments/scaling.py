"""Speed-up and efficiency of data parallelism against the global batch, measured and predicted.

``sweep`` times the real training (``helpers.training.run_trainings``, each world size's batches
in one launch) for every global batch and every world size that fits the cores, and adds speed-up
and efficiency over one worker. The model explains the table with two fits:

* compute: one worker's time per step grows linearly with its batch, ``t(B) = c0 + c1 * B``
  (``fit_compute``, from the 1-worker runs): ``c0`` is what a step costs whatever the batch (the
  optimizer's update of every weight, Python), ``c1`` the cost of each sample;
* communication: all-reducing the gradients costs ``alpha + beta * bytes`` every step
  (``helpers.dist.comm_model``, notebook 02), however small the batch. DDP makes one call per
  bucket, each paying the latency, so a step's ``alpha`` is ``k`` times a call's for ``k``
  buckets (``AlphaBeta(k * alpha, beta)``; ``run_row`` counts them from DDP's own log).

N workers each compute on ``B / N`` samples, then all-reduce the whole gradient, so::

    t_N(B) = c0 + c1 * B / N + alpha + beta * bytes       speed-up = t_1(B) / t_N(B)

Only the per-sample part is divided by N; ``c0`` and the all-reduce are paid in full by every
worker at every step. Speed-up therefore grows with the global batch: the per-sample work has to
outweigh the fixed costs of a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pandas as pd
import torch
from torch import nn

from helpers.data import load_har
from helpers.dist.buckets import logged_buckets
from helpers.dist.cores import WorldPlan, default_threads_per_worker, plan_world_sizes
from helpers.experiments.scaling_model import (  # noqa: F401 (the model, its own module; importable from here too)
    ComputeModel,
    batch_for_speedup,
    compute_fit_text,
    fit_compute,
    fit_compute_physical,
    measured_and_model,
    measured_and_model_text,
    predict_speedup,
    predict_step_seconds,
    prediction_table,
)
from helpers.training import (
    Probe,
    RunResult,
    TrainConfig,
    epochs_for_min_steps,
    run_trainings,
    steps_per_epoch,
)
from helpers.training.measure import efficiency, speedup
from helpers.training.model import GRADIENT_BYTES  # noqa: F401 (notebook 05 imports it from here)

DEFAULT_BATCHES: tuple[int, ...] = tuple(64 * 2**k for k in range(7))  # 64, 128, ..., 4096
# Steps of every sweep point run before the clock starts: DDP builds its buckets and allocates
# at the first iteration, a cost a real training pays once, not at every step.
UNTIMED_STEPS = 2
NO_COMMUNICATION = "no communication"  # workers that never all-reduce (sync="none")
PLAIN = "plain model"  # one worker training the model itself: no DDP (sync="none", world size 1)
DDP_ONE = "DDP, 1 worker"  # the same one worker under DDP with a world size of 1


# --------------------------------------------------------------------------- the reference points


@dataclass(frozen=True)
class PublishedPoint:
    """A speed-up published by the reference article. Not measured here: drawn for comparison."""

    world: int
    global_batch: int
    speedup: float

    @property
    def efficiency(self) -> float:
        return efficiency(self.speedup, self.world)


PUBLISHED_LABEL = "published (Scaling Model Training with Distributed Computing), laptop"
PUBLISHED: tuple[PublishedPoint, ...] = (
    PublishedPoint(2, 256, 0.39),
    PublishedPoint(4, 256, 0.54),
    PublishedPoint(2, 2048, 1.01),
    PublishedPoint(4, 2048, 1.49),
)


def published_table() -> pd.DataFrame:
    """The article's points as a table: world, global_batch, speedup, efficiency."""
    return pd.DataFrame(
        [
            {
                "world": p.world,
                "global_batch": p.global_batch,
                "speedup": p.speedup,
                "efficiency": p.efficiency,
            }
            for p in PUBLISHED
        ]
    )


# --------------------------------------------------------------------------- the measurements


def budget(global_batches: Sequence[int], n_samples: int, min_steps: int = 10) -> pd.DataFrame:
    """How long each point of a sweep trains: whole epochs, at least one, holding the
    ``UNTIMED_STEPS`` off the clock and then at least ``min_steps`` timed steps, so that a large
    batch (1 step per epoch at 4096) is not timed on a step or two. Returns global_batch,
    epochs, steps, timed_steps, samples (all world sizes alike)."""
    rows = []
    for batch in global_batches:
        epochs = epochs_for_min_steps(batch, n_samples, min_steps + UNTIMED_STEPS)
        steps = epochs * steps_per_epoch(n_samples, batch)
        rows.append(
            {
                "global_batch": batch,
                "epochs": epochs,
                "steps": steps,
                "timed_steps": steps - UNTIMED_STEPS,
                "samples": steps * batch,
            }
        )
    return pd.DataFrame(rows)


def add_speedup(table: pd.DataFrame) -> pd.DataFrame:
    """Add speed-up and efficiency over the 1-worker run with the same global batch."""
    base = table[table["world"] == 1].set_index("global_batch")["seconds"]
    missing = set(table["global_batch"]) - set(base.index)
    if missing:
        raise ValueError(f"no 1-worker run to compare with for global batch {sorted(missing)}")
    baseline = table["global_batch"].map(base)
    gained = speedup(baseline, table["seconds"])  # element by element, on whole columns
    return table.assign(speedup=gained, efficiency=efficiency(gained, table["world"]))


class StepFacts(Probe):
    """Read inside each worker when its training ends (a ``helpers.training.Probe``): the
    intra-op threads PyTorch ran with, and the buckets DDP logged (``logged_buckets``), so that
    neither is taken from a plan's word."""

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return {"threads": torch.get_num_threads(), "buckets": logged_buckets(model)}


def timed_launch(
    plan: WorldPlan, configs: Sequence[TrainConfig]
) -> tuple[list[RunResult], RunResult]:
    """``configs`` trained in one launch, after a warm-up: the first of them trained once more
    before the others and left out of every table, since the first training of a launch pays
    what later ones find done (memory allocated, kernels chosen). Returns the configs' results
    and the warm-up's, which the caller shows."""
    runs = run_trainings(plan, [configs[0], *configs], probe=StepFacts())
    return runs[1:], runs[0]


def run_row(run: RunResult, timed_steps: int) -> dict:
    """One training as a table row: its timings, what its workers reported, its replicas."""
    return {
        "world": run.world,
        "global_batch": run.global_batch,
        "epochs": run.epochs,
        "steps": run.steps,
        "timed_steps": int(timed_steps),
        "threads_per_worker": run.threads_per_worker,
        "threads_used": min(probe["threads"] for probe in run.probes),  # every worker's
        "sync": run.sync,  # "ddp", or "none": the plain model, nothing all-reduced
        "buckets": len(run.probes[0]["buckets"]),  # as DDP logged them; 0 without DDP
        "bucket_bytes": tuple(run.probes[0]["buckets"]),  # each bucket's bytes, as logged
        "seconds": run.seconds,
        "step_seconds": run.seconds / timed_steps,
        "samples_per_s": timed_steps * run.global_batch / run.seconds,
        "accuracy": run.accuracy,
        "checksum": run.checksums[0],
        "digest": run.digests[0] if run.digests else "",  # rank 0's weights, bit for bit
        "replicas_identical": run.replicas_identical,
        "oversubscribed": run.oversubscribed,
    }


def twice_record(layout: str, first: RunResult, second: RunResult) -> dict:
    """One training timed twice in a row: its layout, world size, batch and both times."""
    return {"layout": layout, "world": first.world, "global_batch": first.global_batch,
            "first": first.seconds, "second": second.seconds}  # fmt: skip


def warmup_text(warm: RunResult, timed: RunResult) -> str:
    """The discarded warm-up beside the same training timed after it."""
    return (f"  warm-up (discarded): global batch {warm.global_batch} took {warm.seconds:.2f} s, "
            f"the same training after it {timed.seconds:.2f} s")  # fmt: skip


def sweep(
    global_batches: Sequence[int] = DEFAULT_BATCHES,
    world_sizes: Sequence[int] = (1, 2, 4),
    min_steps: int = 10,
    threads: int | None = None,
    oversubscribe: bool = False,
    data: str | None = None,
    lr: float = 0.05,
    silent: bool = False,
    progress: Callable[[str], None] | None = None,
    repeat: bool = False,
) -> pd.DataFrame:
    """Time the training for every global batch and every world size that fits the cores.

    Each point is a training for the ``budget`` of its global batch: the baseline, one worker
    training the plain model (sync="none": no DDP, its process group unused while it trains), and
    real DDP workers for every larger world size. Each world size trains all its batches one
    after the other in one launch, after a warm-up (``timed_launch``), so that its start-up
    (processes, imports, data: seconds each) is paid once; the clock leaves start-up out either
    way. With ``silent``, every training is followed in the same launch by its partner,
    alternating, so that drift in the machine's load falls on both alike: a DDP training of more
    than one worker by the same never communicating (sync="none"), rows laid out as
    ``single_device.baseline_runs``'s in ``result.attrs["silent"]``; the plain 1-worker training
    by the same under DDP with a world size of 1 (DDP's own cost: ``ddp_cost_text``), rows in
    ``result.attrs["ddp_one"]``. With ``repeat``, each training runs twice in a row (A B A B
    with ``silent``; DDP at world size 1 only once): the rows are the first's, and
    ``result.attrs["twice"]`` holds both times of each, the noise of a single run at every batch
    (``twice_record``).
    World size 1 (the baseline) is required. World sizes that would oversubscribe the cores are
    skipped, their reasons in ``result.attrs["skipped"]``. ``progress``, if given, is called
    with a few lines per launch.

    Returns one row per run of the plain baseline and of DDP (``run_row``), by global batch then
    world size, with speedup and efficiency over the plain model on one worker.
    """
    if 1 not in world_sizes:
        raise ValueError("the sweep needs world size 1: speed-up is measured against it")
    har = load_har(data)
    threads = default_threads_per_worker() if threads is None else threads
    plans = plan_world_sizes(sorted(set(world_sizes)), threads, oversubscribe=oversubscribe)
    points = budget(global_batches, len(har.X_train), min_steps)
    configs = [
        TrainConfig(global_batch=int(p.global_batch), epochs=int(p.epochs), lr=lr,
                    data=har.source, untimed_steps=UNTIMED_STEPS)  # fmt: skip
        for p in points.itertuples(index=False)
    ]
    rows, quiet, ddp_one, repeats, twice = [], [], [], [], []
    for plan in (p for p in plans if p.runs):
        one = plan.world_size == 1
        main = "none" if one else "ddp"  # the plain model on 1 worker, DDP on more
        launched, roles = _launch_order(configs, one, silent, repeat)
        if progress is not None:
            progress(
                f"{plan.world_size} worker(s) x {plan.threads_per_worker} thread(s), global "
                f"batches {', '.join(str(b) for b in points['global_batch'])}: one launch"
                + ("" if not silent else ", each plain training followed by the same under DDP"
                   if one else ", each DDP training followed by the same never communicating")
            )
        runs, warm = timed_launch(plan, launched)
        repeats.append((warm.seconds, runs[0].seconds))  # one training, twice
        if progress is not None:
            progress(warmup_text(warm, runs[0]))
        firsts = {}
        for (point, copy, sync), run in zip(roles, runs, strict=True):
            if copy:  # the second time: only its spread is kept
                twice.append(twice_record(_layout(run), firsts[point, sync], run))
                continue
            firsts[point, sync] = run
            row = run_row(run, points["timed_steps"].iloc[point])
            if sync == main:
                rows.append(row)
            else:
                (ddp_one if one else quiet).append({"layout": _layout(run), **row})
    rows.sort(key=lambda r: (r["global_batch"], r["world"]))
    table = add_speedup(pd.DataFrame(rows))
    table.attrs["skipped"] = [f"{p.world_size} workers: {p.reason}" for p in plans if not p.runs]
    table.attrs["silent"] = quiet
    table.attrs["ddp_one"] = ddp_one  # with silent: DDP at world size 1, beside the plain model
    table.attrs["repeats"] = repeats  # (warm-up, timed) seconds per launch
    table.attrs["twice"] = twice  # with repeat: each training's two times, batch by batch
    table.attrs["data_source"] = har.source
    return table


def _launch_order(
    configs: Sequence[TrainConfig], one: bool, silent: bool, repeat: bool
) -> tuple[list[TrainConfig], list[tuple[int, int, str]]]:
    """One launch's trainings in order, and each one's role (point, copy, sync): per point the
    main training (the plain model on 1 worker, DDP on more), with ``silent`` its partner after
    it (DDP on 1 worker, never communicating on more), with ``repeat`` all of it again, except
    DDP on 1 worker, timed once for its cost only."""
    main, partner = ("none", "ddp") if one else ("ddp", "none")
    launched, roles = [], []
    for point, config in enumerate(configs):
        for copy in range(2 if repeat else 1):
            for sync in (main, partner) if silent else (main,):
                if not (copy and one and sync == partner):
                    launched.append(replace(config, sync=sync))
                    roles.append((point, copy, sync))
    return launched, roles


def _layout(run: RunResult) -> str:
    """A training's layout: DDP's, or the plain model on one worker or on many (silent)."""
    if run.sync == "ddp":
        return DDP_ONE if run.world == 1 else "DDP"
    return PLAIN if run.world == 1 else NO_COMMUNICATION


def ddp_cost(table: pd.DataFrame) -> pd.Series:
    """Per global batch, what DDP with a world size of 1 cost over the plain model in the same
    launch (``sweep(silent=True)``'s ``attrs["ddp_one"]``): its hooks, its copies into buckets and
    a one-rank all-reduce, as a share of the plain model's time."""
    if not table.attrs.get("ddp_one"):
        raise ValueError("no DDP run at world size 1: run the sweep with silent=True")
    ddp = pd.DataFrame(table.attrs["ddp_one"]).set_index("global_batch")["seconds"]
    plain = table[table["world"] == 1].set_index("global_batch")["seconds"]
    return (ddp / plain - 1).rename("ddp_cost")


def ddp_cost_text(table: pd.DataFrame) -> str:
    """``ddp_cost`` in one line, batch by batch."""
    cost = ddp_cost(table)
    return "DDP at world size 1, over the plain model on 1 worker: " + ", ".join(
        f"{batch} {share:+.0%}" for batch, share in cost.items()
    )
