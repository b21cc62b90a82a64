"""The biggest single device first: one worker using every core, against N workers.

The reference article's second piece of advice before going distributed is to use the biggest
single device you can. On one machine that is one worker process whose intra-op threads
(``torch.set_num_threads``) use every core, training the plain model (no DDP), timed against
notebook 05's sweep (N workers of ``default_threads_per_worker`` threads each) at the same global
batches and the same steps.
Threads split each matrix product of a step between the cores and never all-reduce; workers
split the batch and all-reduce the whole gradient at every step. The ceiling runs, N workers
that never communicate (``sync="none"``, each training alone on its slice), give what workers
reach with the all-reduce free, which tells the two reasons apart: the all-reduce, and how well
a step's products split over threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from helpers.data import load_har
from helpers.dist.cores import (
    WorldPlan,
    available_cores,
    default_threads_per_worker,
    plan_world_sizes,
)
from helpers.experiments.scaling import (
    DEFAULT_BATCHES,
    NO_COMMUNICATION,
    PLAIN,
    UNTIMED_STEPS,
    budget,
    run_row,
    timed_launch,
    twice_record,
    warmup_text,
)
from helpers.training import TrainConfig
from helpers.training.measure import speedup

SINGLE_DEVICE = "single device"


def single_device_plan(cores: int | None = None) -> WorldPlan:
    """One worker, one intra-op thread per core: every core the course may use."""
    cores = available_cores() if cores is None else cores
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    return WorldPlan(1, cores, cores, True, False, f"1 worker x {cores} threads: every core")


def ceiling_plan(cores: int | None = None, threads: int | None = None) -> WorldPlan | None:
    """The most workers of ``threads`` threads (default: the sweep's) that fit the cores, at
    least 2; None where not even 2 fit."""
    cores = available_cores() if cores is None else cores
    threads = default_threads_per_worker(cores) if threads is None else threads
    fitting = [p for p in plan_world_sizes([2, 4], threads, cores) if p.runs]
    return fitting[-1] if fitting else None


def baseline_runs(
    global_batches: Sequence[int] = DEFAULT_BATCHES,
    min_steps: int = 10,
    data: str | None = None,
    lr: float = 0.05,
    cores: int | None = None,
    ceiling: bool = True,
    progress: Callable[[str], None] | None = None,
    repeat: bool = False,
) -> pd.DataFrame:
    """Time the single device (one worker, every core, the plain model: no DDP) at every global
    batch, with the sweep's ``budget`` (the same steps, ``UNTIMED_STEPS`` off the clock), all
    batches in one launch so that its start-up is paid once, after a warm-up
    (``scaling.timed_launch``); with ``ceiling``,
    the same for the ``ceiling_plan``'s workers, never communicating (``scaling.sweep``'s
    ``silent`` interleaves those with DDP's instead). Returns one row per run: layout ("single
    device" or "no communication") and ``scaling.run_row``'s columns, threads_used the fewest
    intra-op threads a worker reported running with. With ``repeat``, each training runs twice
    in a row, as ``scaling.sweep``'s (``attrs["twice"]``). Speed-ups come from ``add_baselines``,
    against the sweep's."""
    har = load_har(data)
    points = budget(global_batches, len(har.X_train), min_steps)

    def configs(sync: str) -> list[TrainConfig]:
        return [
            TrainConfig(global_batch=int(p.global_batch), epochs=int(p.epochs), lr=lr,
                        data=har.source, untimed_steps=UNTIMED_STEPS, sync=sync)  # fmt: skip
            for p in points.itertuples(index=False)
        ]

    plans = [(SINGLE_DEVICE, single_device_plan(cores), "none")]  # the plain model
    if ceiling and (plan := ceiling_plan(cores)) is not None:
        plans.append((NO_COMMUNICATION, plan, "none"))
    rows, repeats, twice = [], [], []
    copies = 2 if repeat else 1
    for layout, plan, sync in plans:
        if progress is not None:
            progress(
                f"{layout}: {plan.world_size} worker(s) x {plan.threads_per_worker} thread(s), "
                f"global batches {', '.join(str(b) for b in points['global_batch'])}"
            )
        runs, warm = timed_launch(plan, [c for c in configs(sync) for _ in range(copies)])
        repeats.append((warm.seconds, runs[0].seconds))  # one training, twice
        if progress is not None:
            progress(warmup_text(warm, runs[0]))
        for run, timed_steps in zip(runs[::copies], points["timed_steps"], strict=True):
            rows.append({"layout": layout, **run_row(run, timed_steps)})
        if repeat:  # runs holds each training twice in a row
            pairs = zip(runs[::2], runs[1::2], strict=True)
            twice += [twice_record(layout, first, second) for first, second in pairs]
    table = pd.DataFrame(rows)
    table.attrs["data_source"] = har.source
    table.attrs["repeats"] = repeats  # (warm-up, timed) seconds per launch
    table.attrs["twice"] = twice  # with repeat: each training's two times
    return table


def add_baselines(table: pd.DataFrame, baselines: pd.DataFrame) -> pd.DataFrame:
    """Speed-up of other layouts (``helpers.experiments.single_device``: one worker on every
    core, workers that never communicate) over the sweep's 1-worker run (the plain model) at the
    same batch, and
    efficiency per core: speed-up divided by how many times that run's cores the layout used,
    as the sweep's efficiency divides by the workers."""
    base = table[table["world"] == 1].set_index("global_batch")
    missing = set(baselines["global_batch"]) - set(base.index)
    if missing:
        raise ValueError(f"no 1-worker run in the sweep for global batch {sorted(missing)}")
    gained = speedup(baselines["global_batch"].map(base["seconds"]), baselines["seconds"])
    cores = baselines["world"] * baselines["threads_per_worker"]
    times = cores / baselines["global_batch"].map(base["threads_per_worker"])
    return baselines.assign(speedup=gained, efficiency=gained / times)


TIE = 0.05  # closer speed-ups are a tie: an assumed floor under the measured noise of single
# runs (``tie_bands``, from trainings timed twice), for when two times happen to come out close


def tie_bands(twice: Sequence[dict] | pd.DataFrame, floor: float = TIE) -> pd.Series:
    """Per global batch, the tie band: the most that one training timed twice in a row moved
    there (over every layout; a share of the slower time), and at least ``floor``. A gap inside it
    cannot tell two layouts apart from one run each."""
    both = pd.DataFrame(twice)  # records (``attrs["twice"]``) or a frame of them
    if both.empty:
        raise ValueError("no training timed twice: run the sweep and baselines with repeat=True")
    moved = (both["first"] - both["second"]).abs() / both[["first", "second"]].max(axis=1)
    return moved.groupby(both["global_batch"]).max().clip(lower=floor).rename("tie")


def _band(tie: float | pd.Series, batch: int) -> float:
    """The tie band at ``batch``: one for every batch, or the batch's own (``tie_bands``)."""
    return float(tie[batch]) if isinstance(tie, pd.Series) else tie


def speedup_text(
    table: pd.DataFrame, baselines: pd.DataFrame | None = None, tie: float | pd.Series = TIE
) -> str:
    """The sweep's timings for reading: one row per run, rates and ratios formatted; with
    ``baselines``, their rows beside the sweep's (a layout and a threads column added), and a
    line per batch saying whether one worker on every core beat the sweep's most workers
    (speed-ups within ``tie`` of each other called a tie: one share, or one per batch)."""
    columns = ["world", "global_batch", "seconds", "samples_per_s", "speedup", "efficiency"]
    verdict = ""
    if baselines is not None:
        other = add_baselines(table, baselines)
        layout = table["world"].map(lambda world: PLAIN if world == 1 else "DDP")  # sweep's
        table = pd.concat([table.assign(layout=layout), other], ignore_index=True)
        table = table.sort_values("global_batch", kind="stable")
        columns = ["layout", "world", "threads_per_worker"] + columns[1:]
        verdict = "\n" + _single_device_verdict(table, tie)
    shown = table[columns].rename(columns={"threads_per_worker": "threads"})
    if "layout" in shown:  # its efficiency divides by its cores, not by workers
        per_core = shown["layout"].eq(SINGLE_DEVICE)
        shown["layout"] = shown["layout"].where(~per_core, SINGLE_DEVICE + " (eff. per core)")
    formats = {"seconds": "{:.2f}", "samples_per_s": "{:,.0f}", "speedup": "{:.2f}x",
               "efficiency": "{:.0%}"}  # fmt: skip
    text = shown.to_string(index=False, formatters={k: f.format for k, f in formats.items()})
    return text + verdict


def _single_device_verdict(both: pd.DataFrame, tie: float | pd.Series = TIE) -> str:
    """Per batch, what was measured: the single device's speed-up against the most workers'
    DDP's and, where they ran, the same workers never communicating beside both (``tie``). No
    cause: one run per point says which was faster, not why."""
    lines = []
    for batch, rows in both.groupby("global_batch"):
        band = _band(tie, int(batch))
        single = rows[rows["layout"] == SINGLE_DEVICE]
        ddp = rows[(rows["layout"] == "DDP") & (rows["world"] == rows["world"].max())]
        if single.empty or ddp.empty or ddp["world"].iloc[0] < 2:
            continue
        s, d = single.iloc[0], ddp.iloc[0]
        head = (f"global batch {batch:>4}: 1 worker x {s['threads_per_worker']} threads "
                f"{s['speedup']:.2f}x; {d['world']} DDP workers x {d['threads_per_worker']} "
                f"thread(s) {d['speedup']:.2f}x")  # fmt: skip
        if abs(s["speedup"] - d["speedup"]) <= band * max(s["speedup"], d["speedup"]):
            verdict = f"a tie (within {band:.0%}, inside run-to-run noise)"
        else:
            verdict = ("one worker on every core" if s["speedup"] > d["speedup"] else "DDP")
            verdict += " faster"
        free = rows[(rows["layout"] == NO_COMMUNICATION) & (rows["world"] == d["world"])]
        f = free["speedup"].iloc[0] if len(free) else None
        lines.append(f"{head}: {verdict}" + _beside_silent(s["speedup"], d["speedup"], f, band))
    return "\n".join(lines)


def _beside_silent(single: float, ddp: float, free: float | None, tie: float = TIE) -> str:
    """The same workers never communicating, measured beside both (nothing without them)."""
    if free is None:
        return ""
    if abs(free - single) <= tie * max(free, single):
        against = f"tied with the threads (within {tie:.0%})"
    else:
        against = "faster than the threads" if free > single else "slower than the threads"
    return (f"\n    never communicating {free:.2f}x, {against}; DDP at {ddp / free:.0%} of it "
            "(the gap: all-reduce, wait for the slower worker, DDP's copies)")
