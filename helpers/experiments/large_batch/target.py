"""Training to a loss target: how many steps, and how many samples, each global batch needs at
a given learning rate to bring the training loss down to a target (the measurement of Shallue et
al. 2019, *Measuring the Effects of Data Parallelism on Neural Network Training*, JMLR 20(112)).

The training loss is evaluated on a fixed subset of the training set (the same samples for every
run) at checkpoints that grow by about 10% each: the step count is known to that resolution at
every batch, and the evaluations cost little. A loss that swings can dip below the target once and
come back up. With ``hold > 1`` a run is counted as reaching the target only where the loss
*stays* below it (``stays_below``): the count is the first checkpoint from which every later loss
is at or below the target, and the run goes on until that has held for ``hold`` times the steps
(``HOLD``: 25% more). With ``evals = k`` the count is the first of k evaluations in a row at or
below the target: what notebook 06 counts (k = 3), since its loss swings back above the target
after many first crossings. The defaults, ``hold = 1`` and ``evals = 1``, count the first
checkpoint at or below the target, however briefly: what Shallue et al. count (the first
periodic evaluation past the goal).
One process trains: N workers at global batch B take the same steps (notebooks 03 and 04).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from helpers.data import HARData
from helpers.training import TrainConfig, lr_at, sgd_step, steps_per_epoch, torch_threads
from helpers.training.model import make_mlp
from helpers.training.order import worker_order
from helpers.training.schedules import Constant, Schedule, WarmupSteps

# the fixed subset the training loss is evaluated on: 512 samples, every 14th. An evaluation is a
# forward pass over them at every checkpoint of every run: at 1,024, about a third of the
# arithmetic of notebook 06's grid. A count is known to the checkpoints' 10% either way
EVAL_SAMPLES = 512
HOLD = 1.25  # hold: a count stands once the loss has stayed below the target for 25% more steps


def reordered(data: HARData, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set, its rows permuted by ``seed`` (seed 0: as stored). The loop's epoch
    order is seeded by the epoch alone, so permuting the rows gives every seed its own data
    order as well as its own initial weights."""
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    if seed == 0:
        return X, y
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(10_000 + seed))
    return X[perm], y[perm]


def checkpoints(max_steps: int, growth: float = 1.1) -> list[int]:
    """The steps after which the loss is evaluated: 1, 2, 3, ... then about ``growth`` times
    the previous one, up to and including ``max_steps``."""
    if max_steps < 1 or growth <= 1:
        raise ValueError(f"need max_steps >= 1 and growth > 1, got {max_steps}, {growth}")
    steps = [1]
    while steps[-1] < max_steps:
        steps.append(min(max_steps, max(steps[-1] + 1, round(steps[-1] * growth))))
    return steps


def diverged(first_loss: float, losses: Sequence[float]) -> bool:
    """Whether a run failed: a loss that is not finite, or a run that ends above where it
    started. A spike it recovers from (the catapult of Lewkowycz et al. 2020) does not count."""
    return not all(math.isfinite(v) for v in losses) or losses[-1] > first_loss


def stays_below(
    steps: Sequence[int],
    losses: Sequence[float],
    target: float,
    hold: float = HOLD,
    evals: int = 1,
) -> int | None:
    """The first checkpoint from which the loss stays at or below ``target`` up to the last one,
    if the last is at least ``hold`` times it and that makes at least ``evals`` checkpoints (the
    loss held there long enough to trust); else None. ``hold = 1`` and ``evals = 1``: the first
    checkpoint at or below the target, however briefly."""
    if hold < 1 or evals < 1 or len(steps) != len(losses):
        raise ValueError(
            f"need hold >= 1, evals >= 1 and one loss per checkpoint, got hold {hold}, "
            f"evals {evals}"
        )
    start, below = None, 0
    for step, loss in zip(steps, losses, strict=True):
        start, below = ((start or step), below + 1) if loss <= target else (None, 0)
    held = start is not None and below >= evals and steps[-1] >= hold * start
    return start if held else None


@dataclass(frozen=True)
class TargetRun:
    """One run to the target: ``steps`` (and ``samples = steps x batch``) to where the loss
    stayed below the target, or, if it never did, the steps taken when the budget ran out;
    ``steps_run``: the steps trained in all (the count's confirmation included)."""

    global_batch: int
    lr: float
    seed: int
    warmup_steps: int
    target: float
    reached: bool
    steps: int
    samples: int
    steps_run: int
    first_loss: float  # at initialisation, on the evaluation subset
    final_loss: float  # when the run stopped
    diverged: bool
    seconds: float  # training time in this process, evaluations excluded
    checkpoints: list[int] = field(repr=False)
    losses: list[float] = field(repr=False)


def eval_subset(data: HARData, samples: int = EVAL_SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed training samples the loss is evaluated on: every ``n // samples``-th one."""
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    idx = torch.arange(0, len(X), max(1, len(X) // samples))[:samples]
    return X[idx], y[idx]


def eval_loss(model: torch.nn.Module, X_eval: torch.Tensor, y_eval: torch.Tensor) -> float:
    """The training loss on the evaluation subset, the number a run is stopped on."""
    with torch.no_grad():
        return F.cross_entropy(model(X_eval), y_eval).item()


@dataclass(frozen=True)
class Counted:
    """What ``train_counting`` saw: the measure at initialisation (``first``), at every mark it
    reached (``marks``, ``values``), the count (None if none held) and the training seconds."""

    first: float
    marks: list[int]
    values: list[float]
    count: int | None
    seconds: float


def train_counting(
    data: HARData,
    config: TrainConfig,
    marks: Sequence[int],
    measure: Callable[[torch.nn.Module], float],
    count: Callable[[list[int], list[float]], int | None],
    threads: int = 2,
    after_step: Callable[[int, torch.nn.Module], None] | None = None,
) -> Counted:
    """The one loop behind every count to a target (notebooks 06 and 11): plain SGD on
    ``config.global_batch`` samples a step at ``config``'s rate and schedule, seed
    ``config.seed`` for the initial weights and the data order (``reordered``).
    ``measure(model)`` runs before the first step and after each step in ``marks``; the run
    stops once ``count(marks so far, values so far)`` gives a count, at a value that is not
    finite, or at the last mark. ``after_step(steps_done, model)`` runs before the first step
    (0) and after every step, off the clock (notebook 06 measures the noise scale there)."""
    X, y = reordered(data, config.seed)
    per_epoch = steps_per_epoch(len(X), config.global_batch)
    if per_epoch < 1:
        raise ValueError(
            f"batch {config.global_batch} is larger than the {len(X)} training samples"
        )
    if not marks:
        raise ValueError("no step to measure at: give at least one mark")
    with torch_threads(threads):
        torch.manual_seed(config.seed)
        model = make_mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
        first, values, done, counted = measure(model), [], [], None
        seconds, order = 0.0, None
        if after_step is not None:
            after_step(0, model)
        for step in range(marks[-1]):
            epoch, i = divmod(step, per_epoch)
            if order is None or i == 0:
                order = worker_order(len(X), epoch, 0)
            started = time.perf_counter()
            batch = order[i * config.global_batch : (i + 1) * config.global_batch]
            sgd_step(model, optimizer, X, y, batch, config, lr_at(config, step, per_epoch))
            seconds += time.perf_counter() - started
            if after_step is not None:
                after_step(step + 1, model)
            if step + 1 == marks[len(done)]:
                done.append(step + 1)
                values.append(measure(model))
                counted = count(done, values)
                if counted is not None or not math.isfinite(values[-1]):
                    break  # the count held, or the value is not finite
    return Counted(first, done, values, counted, seconds)


def train_to_target(
    data: HARData,
    global_batch: int,
    lr: float,
    seed: int,
    target: float,
    max_steps: int,
    warmup_steps: int = 0,
    threads: int = 2,
    after_step: Callable[[int, torch.nn.Module], None] | None = None,
    hold: float = 1.0,
    evals: int = 1,
) -> TargetRun:
    """Plain SGD on ``global_batch`` samples a step at rate ``lr`` (ramped linearly from 0 over
    ``warmup_steps``), seed ``seed`` for the initial weights and the data order, until the
    training loss on the evaluation subset has stayed at most ``target`` for ``hold`` times the
    steps to where it went below for good, and for ``evals`` evaluations (``stays_below``), or
    ``max_steps``, or a loss that is not finite (``train_counting``, at ``checkpoints``)."""
    X_eval, y_eval = eval_subset(data)
    schedule: Schedule = WarmupSteps(warmup_steps) if warmup_steps > 0 else Constant()
    config = TrainConfig(global_batch=global_batch, lr=lr, seed=seed, schedule=schedule)
    run = train_counting(
        data,
        config,
        checkpoints(max_steps),
        lambda model: eval_loss(model, X_eval, y_eval),
        lambda done, losses: stays_below(done, losses, target, hold, evals),
        threads,
        after_step,
    )
    steps = run.marks[-1] if run.count is None else run.count
    return TargetRun(
        global_batch=global_batch,
        lr=lr,
        seed=seed,
        warmup_steps=warmup_steps,
        target=target,
        reached=run.count is not None,
        steps=steps,
        samples=steps * global_batch,
        steps_run=run.marks[-1],
        first_loss=run.first,
        final_loss=run.values[-1],
        diverged=diverged(run.first, run.values),
        seconds=run.seconds,
        checkpoints=run.marks,
        losses=run.values,
    )


def confirmed_by(count: int, max_steps: int, hold: float = 1.0, evals: int = 1) -> int:
    """The step by which a run stopped at ``max_steps`` would have confirmed a count of at most
    ``count`` steps: ``evals - 1`` checkpoints after the last one at or below ``count``, and
    at least ``hold`` times that one (``stays_below``). A run capped there has the same
    evaluations up to it as one capped at ``max_steps``."""
    marks = checkpoints(max_steps)
    last = max(0, bisect.bisect_right(marks, count) - 1)
    return min(max_steps, max(marks[min(len(marks) - 1, last + evals - 1)],
                              math.ceil(hold * marks[last])))  # fmt: skip


def _limit(
    cap: int, best: float, counts: Sequence[int], slack: float, hold: float, evals: int
) -> int:
    """A seed's step limit: the cap, or, once a rate has brought every seed to the target, the
    step that confirms a count of ``slack`` times the best median less ``counts``, the counts
    of its rate's seeds so far (``confirmed_by``; at least 1 step)."""
    if not math.isfinite(best):
        return cap
    return confirmed_by(max(1, math.floor(slack * best - sum(counts))), cap, hold, evals)


def _seeds_at_rate(
    run: Callable[[int, int], dict],
    seeds: Sequence[int],
    limit: Callable[[list[int]], int],
    own: Mapping[int, int],
    top: bool,
    confirm: Callable[[int], int],
) -> tuple[list[dict], dict[int, int]]:
    """One rate's runs (``run(seed, limit)``) and the counts of the seeds that reached the
    target, by ``runs_to_target``'s rules: ``limit(counts so far)``; ``own``, at a top rate,
    each seed's count at the best rate, a run's limit (``confirm``) until one reaches it."""
    rows: list[dict] = []
    counts: dict[int, int] = {}
    for seed in seeds:
        steps = limit(list(counts.values()))
        if own and not counts:  # the top rate, until a seed of it reaches the target
            steps = min(steps, confirm(own[seed]))
        rows.append(run(seed, steps))
        if rows[-1]["reached"]:
            counts[seed] = rows[-1]["steps"]
        elif not top:
            break  # this rate cannot be the best: its other seeds would be wasted
    if own and counts:  # a top-rate seed reached the target: the rate may be the best
        for i, row in enumerate(rows):
            steps = limit(list(counts.values()))
            if row["cut"] and not row["diverged"] and steps > row["steps_run"]:
                rows[i] = run(row["seed"], steps)
                if rows[i]["reached"]:
                    counts[row["seed"]] = rows[i]["steps"]
    return rows, counts


def runs_to_target(
    data: HARData,
    batches: Sequence[int],
    lrs: Sequence[float] | Mapping[int, Sequence[float]],
    seeds: Sequence[int],
    target: float,
    max_samples: int,
    slack: float = 2.0,
    threads: int = 2,
    hold: float = 1.0,
    evals: int = 1,
    every_seed_at_top: bool = False,
) -> pd.DataFrame:
    """Every (batch, rate, seed), each run stopped at the target or at ``max_samples`` samples.
    ``lrs``: the rates, in the order run, the same at every batch or a batch's own grid
    (``{batch: rates}``). Three rules spare runs that cannot give a batch's best rate:

    * once a rate has brought every seed to the target, a rate's seeds share a budget of
      ``slack`` times the fewest median steps so far: a run stops once its count could no longer
      be under that budget less the counts of its rate's seeds before it (``confirmed_by``).
      With 2 seeds the median is their mean, so a rate over that budget cannot be the best
      (``slack = 2``; with more seeds, slack is a judgement);
    * a rate's other seeds are not run once one seed missed the target: the best rate needs
      every seed there (``best_per_batch``). With ``every_seed_at_top``, a grid's top rate runs
      every seed even so, each until it has taken more steps than the same seed at the best
      rate so far: that the top rate loses then rests on every seed, not the first. (Should one
      of them reach the target, the rate may be the best: its seeds stopped that way are run
      again, to the budget);
    * a rate is skipped below a lower rate than the best that lost to it (plain SGD at a rate
      smaller still only takes more steps), or above a rate where a seed diverged.

    ``hold``, ``evals``: as in ``train_to_target``. One row per run (``TargetRun``), and
    ``cut``: whether a rule stopped it short of the target and of the budget."""
    if slack <= 1:
        raise ValueError(f"slack must be above 1 (a run must be allowed to be slower), got {slack}")
    rows = []
    for batch in batches:
        grid = lrs[batch] if isinstance(lrs, Mapping) else lrs
        cap, medians, diverging = max(1, max_samples // batch), {}, []
        counted: dict[float, dict[int, int]] = {}  # per rate, each seed's count at the target
        for lr in grid:
            best = min(medians.values(), default=math.inf)
            best_lr = min((r for r in medians if medians[r] == best), default=math.inf)
            if any(lr < r < best_lr and medians[r] > best for r in medians) or any(
                r < lr for r in diverging
            ):
                continue

            def run(seed: int, limit: int, batch: int = batch, lr: float = lr, cap: int = cap):
                done = train_to_target(
                    data, batch, lr, seed, target, limit, threads=threads, hold=hold, evals=evals
                )
                # cut: stopped at a rule's limit, short of the budget, without the target
                return {**done.__dict__, "cut": not done.reached and limit < cap}

            top = every_seed_at_top and lr == max(grid)
            at_rate, counts = _seeds_at_rate(
                run,
                seeds,
                lambda counts, cap=cap, best=best: _limit(cap, best, counts, slack, hold, evals),
                counted.get(best_lr, {}) if top else {},
                top,
                lambda count, cap=cap: confirmed_by(count, cap, hold, evals),
            )
            rows += at_rate
            diverging += [lr] if any(row["diverged"] for row in at_rate) else []
            counted[lr] = counts
            reached = len(counts) == len(seeds)
            medians[lr] = float(pd.Series(list(counts.values())).median()) if reached else math.inf
    return pd.DataFrame(rows)
