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
from typing import NamedTuple

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
BESIDE = "1 worker beside the single device"  # its partner in the same launch
TIE = 0.05  # closer speed-ups are a tie: an assumed floor under the measured noise of single
# runs (``tie_bands``, from trainings timed twice), for when two times happen to come out close


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
    (``scaling.timed_launch``). Each training is followed in that launch by the same one on one
    worker's share of the cores (``default_threads_per_worker``, the sweep's 1-worker layout),
    so that a change in the machine's load falls on both: the single device's speed-up is over
    that partner (columns ``beside_seconds``, ``beside_threads``), not over another launch's.
    With ``ceiling``, the same for the ``ceiling_plan``'s workers, never communicating
    (``scaling.sweep``'s ``silent`` interleaves those with DDP's instead). Returns one row per
    run: layout ("single device" or "no communication") and ``scaling.run_row``'s columns,
    threads_used the fewest intra-op threads a worker reported running with. With ``repeat``,
    each pair runs twice in a row (A B A B), as ``scaling.sweep``'s (``attrs["twice"]``, the
    partner's under ``BESIDE``). Speed-ups come from ``add_baselines``."""
    har = load_har(data)
    points = budget(global_batches, len(har.X_train), min_steps)
    cores = available_cores() if cores is None else cores
    beside_threads = default_threads_per_worker(cores)

    def configs(sync: str, threads: int | None = None) -> list[TrainConfig]:
        return [
            TrainConfig(global_batch=int(p.global_batch), epochs=int(p.epochs), lr=lr,
                        data=har.source, untimed_steps=UNTIMED_STEPS, sync=sync,
                        threads=threads)  # fmt: skip
            for p in points.itertuples(index=False)
        ]

    copies = 2 if repeat else 1
    rows, repeats, twice = [], [], []

    def timed(layout: str, plan: WorldPlan, launched: list[TrainConfig]) -> list:
        if progress is not None:
            progress(
                f"{layout}: {plan.world_size} worker(s) x {plan.threads_per_worker} thread(s), "
                f"global batches {', '.join(str(b) for b in points['global_batch'])}"
                + (f", each followed by the same on {beside_threads} thread(s)"
                   if layout == SINGLE_DEVICE else "")  # fmt: skip
            )
        runs, warm = timed_launch(plan, launched)
        repeats.append((warm.seconds, runs[0].seconds))  # the first training, twice
        if progress is not None:
            progress(warmup_text(warm, runs[0]))
        return runs

    # the single device: per batch its training, then the partner's, that pair again with repeat
    single, beside = configs("none"), configs("none", beside_threads)
    pairs = [c for pair in zip(single, beside, strict=True) for _ in range(copies) for c in pair]
    runs = timed(SINGLE_DEVICE, single_device_plan(cores), pairs)
    per_batch = [runs[i : i + 2 * copies] for i in range(0, len(runs), 2 * copies)]
    for group, timed_steps in zip(per_batch, points["timed_steps"], strict=True):
        first, partner = group[0], group[1]
        rows.append({"layout": SINGLE_DEVICE, **run_row(first, timed_steps),
                     "beside_seconds": partner.seconds,
                     # as the partner's worker reported it (torch.get_num_threads())
                     "beside_threads": run_row(partner, timed_steps)["threads_used"]})  # fmt: skip
        if repeat:  # the pair, then the pair again
            twice.append(twice_record(SINGLE_DEVICE, group[0], group[2]))
            twice.append(twice_record(BESIDE, group[1], group[3]))
    if ceiling and (plan := ceiling_plan(cores)) is not None:
        runs = timed(NO_COMMUNICATION, plan, [c for c in configs("none") for _ in range(copies)])
        for run, timed_steps in zip(runs[::copies], points["timed_steps"], strict=True):
            rows.append({"layout": NO_COMMUNICATION, **run_row(run, timed_steps)})
        if repeat:  # runs holds each training twice in a row
            pairs_twice = zip(runs[::2], runs[1::2], strict=True)
            twice += [twice_record(NO_COMMUNICATION, a, b) for a, b in pairs_twice]
    table = pd.DataFrame(rows)
    table.attrs["data_source"] = har.source
    table.attrs["repeats"] = repeats  # (warm-up, timed) seconds per launch
    table.attrs["twice"] = twice  # with repeat: each training's two times
    return table


def add_baselines(table: pd.DataFrame, baselines: pd.DataFrame) -> pd.DataFrame:
    """Speed-up of other layouts (``helpers.experiments.single_device``: one worker on every
    core, workers that never communicate) over one worker at the same batch: the partner timed
    beside it in its own launch where it has one (``beside_seconds``), else the sweep's 1-worker
    run (the plain model); and efficiency per core: speed-up divided by how many times that
    run's cores the layout used, as the sweep's efficiency divides by the workers."""
    base = table[table["world"] == 1].set_index("global_batch")
    beside = (baselines["beside_seconds"].notna() if "beside_seconds" in baselines
              else pd.Series(False, index=baselines.index))  # fmt: skip
    missing = set(baselines.loc[~beside, "global_batch"]) - set(base.index)
    if missing:
        raise ValueError(f"no 1-worker run in the sweep for global batch {sorted(missing)}")
    seconds = baselines["global_batch"].map(base["seconds"])
    threads = baselines["global_batch"].map(base["threads_per_worker"])
    if beside.any():
        seconds = seconds.where(~beside, baselines["beside_seconds"])
        threads = threads.where(~beside, baselines["beside_threads"])
    gained = speedup(seconds, baselines["seconds"])
    cores = baselines["world"] * baselines["threads_per_worker"]
    return baselines.assign(speedup=gained, efficiency=gained / (cores / threads))


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


def threads_slower(baselines: pd.DataFrame, tie: float | pd.Series = TIE) -> list[int]:
    """The global batches where the single device ran slower than its partner (fewer threads,
    timed beside it) beyond that batch's tie band: contention (another program holding a core
    makes every parallel region wait for its slowest thread) or more threads than the products
    can use. One run cannot tell which: ``judge`` then takes the faster of the two."""
    rows = baselines[baselines["layout"].eq(SINGLE_DEVICE)]
    if "beside_seconds" not in rows:
        return []
    return [int(r.global_batch) for r in rows.itertuples()
            if _lost_to_partner(r.seconds, r.beside_seconds, _band(tie, int(r.global_batch)))]


def _lost_to_partner(single: float, beside: float | None, band: float) -> bool:
    """Every core slower than its partner beyond the band (``threads_slower``'s test)."""
    return beside is not None and bool(single > beside * (1 + band))


class Verdict(NamedTuple):
    """``judge``'s answer: "threads", "ddp" or "tie"; whether the single device was judged at its
    partner's threads (``contended``) and whether the two 1-worker runs disagreed
    (``unsettled``); and the notes that say so."""

    key: str
    contended: bool
    unsettled: bool
    notes: list[str]


def judge(
    single: float, beside: float | None, sweep_one: float, ddp: float, band: float
) -> Verdict:
    """One batch's verdict, "threads", "ddp" or "tie", and why where it needs saying.
    ``single``: the single device's seconds; ``beside``: its partner's (None without one);
    ``sweep_one``: the sweep's 1-worker seconds; ``ddp``: DDP's speed-up over those. The single
    device counts at its best: its partner's threads where every core lost to them beyond the
    band. Its speed-up is taken over both 1-worker runs (its partner's launch, and the sweep's,
    which DDP's speed-up divides); where the two verdicts differ, the launches' load decided it,
    and the batch is a tie."""
    notes, best = [], single
    contended = _lost_to_partner(single, beside, band)
    if contended:
        notes.append(f"every core took {single / beside - 1:.0%} longer than its partner, beyond "
                     "the band (contention, or more threads than these products use: one run "
                     "cannot tell); judged at its partner's threads")  # fmt: skip
        best = beside
    verdicts = {
        "tie" if abs(s - ddp) <= band * max(s, ddp) else ("threads" if s > ddp else "ddp")
        for base in ([sweep_one] if beside is None else [beside, sweep_one])
        for s in [base / best]
    }
    if len(verdicts) > 1:
        notes.append("a tie: over its partner and over the sweep's 1-worker run the verdicts "
                     "differ")  # fmt: skip
        return Verdict("tie", contended, True, notes)
    return Verdict(verdicts.pop(), contended, False, notes)


def tally(table: pd.DataFrame, baselines: pd.DataFrame, tie: float | pd.Series = TIE) -> dict:
    """Section 5's count, batch by batch (``judge``), of the single device against the sweep's
    most DDP workers: the batches where the threads were faster beyond the tie band, where DDP
    was, the ties; and, among them, the batches judged at the partner's threads (``contended``)
    and those where the two 1-worker runs gave different verdicts (``unsettled``)."""
    single = baselines[baselines["layout"].eq(SINGLE_DEVICE)].set_index("global_batch")
    most = table["world"].max()
    ddp = table[table["world"].eq(most)].set_index("global_batch")["speedup"]
    one = table[table["world"].eq(1)].set_index("global_batch")["seconds"]
    counts = {"threads": [], "ddp": [], "tie": [], "contended": [], "unsettled": [],
              "world": int(most)}  # fmt: skip
    for batch in single.index.intersection(ddp.index):
        row = single.loc[batch]
        beside = row.get("beside_seconds", float("nan"))
        verdict = judge(row["seconds"], None if pd.isna(beside) else beside, one[batch],
                        ddp[batch], _band(tie, int(batch)))  # fmt: skip
        counts[verdict.key].append(int(batch))
        counts["contended"] += [int(batch)] * verdict.contended
        counts["unsettled"] += [int(batch)] * verdict.unsettled
    return counts


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
        paired = "beside_seconds" in table and table["beside_seconds"].notna().any()
        name = SINGLE_DEVICE + (" (over its partner; eff. per core)" if paired
                                else " (eff. per core)")  # fmt: skip
        shown["layout"] = shown["layout"].where(~per_core, name)
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
        one = rows[(rows["layout"] == PLAIN) & (rows["world"] == 1)]["seconds"].iloc[0]
        beside = s.get("beside_seconds", float("nan"))
        beside = None if pd.isna(beside) else float(beside)
        over = ("" if beside is None
                else f" over its partner ({one / s['seconds']:.2f}x over the sweep's)")  # fmt: skip
        head = (f"global batch {batch:>4}: 1 worker x {s['threads_per_worker']} threads "
                f"{s['speedup']:.2f}x{over}; {d['world']} DDP workers x "
                f"{d['threads_per_worker']} thread(s) {d['speedup']:.2f}x")  # fmt: skip
        judged = judge(float(s["seconds"]), beside, float(one), float(d["speedup"]), band)
        contended = judged.contended
        winner = "one worker at its partner's threads" if contended else "one worker on every core"
        verdict = {"tie": f"a tie (within {band:.0%}, inside run-to-run noise)",
                   "ddp": "DDP faster", "threads": f"{winner} faster"}[judged.key]  # fmt: skip
        if judged.unsettled:
            verdict = "a tie"
        verdict += "".join(f"\n    {note}" for note in judged.notes)
        free = rows[(rows["layout"] == NO_COMMUNICATION) & (rows["world"] == d["world"])]
        f = free["speedup"].iloc[0] if len(free) else None
        best = beside if contended else float(s["seconds"])  # the single device at its best
        singles = [one / best] + ([] if beside is None else [beside / best])
        lines.append(f"{head}: {verdict}" + _beside_silent(singles, d["speedup"], f, band))
    return "\n".join(lines)


def _beside_silent(
    singles: Sequence[float], ddp: float, free: float | None, tie: float = TIE
) -> str:
    """The same workers never communicating, measured beside both (nothing without them), set
    against the single device's speed-up over each 1-worker run it has (``judge``'s rule: where
    the orders differ, the 1-worker runs decided it, and it is a tie)."""
    if free is None:
        return ""
    orders = {
        f"tied with the threads (within {tie:.0%})" if abs(free - single) <= tie * max(free, single)
        else "faster than the threads" if free > single else "slower than the threads"
        for single in singles
    }  # fmt: skip
    disagree = "tied with the threads (the 1-worker runs disagree)"
    against = orders.pop() if len(orders) == 1 else disagree
    return (f"\n    never communicating {free:.2f}x, {against}; DDP at {ddp / free:.0%} of it "
            "(the gap: all-reduce, wait for the slower worker, DDP's copies)")
