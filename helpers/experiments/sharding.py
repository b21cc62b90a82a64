"""Sharding with FSDP2 (notebook 08): a probe that measures what a worker holds and sends while it
trains, the tables the notebook reads, and sharded checkpoints.

``helpers.training`` trains under DDP or FSDP2 (``TrainConfig(sync="fsdp2")``) with one loop;
``ShardingProbe``, handed to ``run_training``, accounts a worker's memory after every step
(``helpers.experiments.memory``), enforces a memory budget, counts and times one step's
collectives (``helpers.dist.counting``), and saves a sharded checkpoint with
``torch.distributed.checkpoint`` (DCP); ``load_worker`` loads it on any number of workers.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from itertools import pairwise

import pandas as pd
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from helpers.dist.counting import (
    COUNTED,
    CollectiveCounter,
    per_step_traffic,
    replay_call_seconds,
)
from helpers.experiments.memory import (
    MB,
    MemoryBudgetError,
    huge_pages_held,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    state_bytes,
)
from helpers.experiments.step_accounting import median_step_faults, minor_faults
from helpers.training import (
    Probe,
    RunResult,
    TrainConfig,
    final_weights,
    make_model,
    make_optimizer,
    unwrapped,
    wrap_model,
)

# --------------------------------------------------------------------------- memory


# --------------------------------------------------------------------------- communication


# --------------------------------------------------------------------------- optimizer state


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def optimizer_digest(optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the whole optimizer state, assembled from every rank's shards (all-gathers:
    every rank must call it): two runs agree on it only if every moment is the same bits."""
    h = hashlib.sha256()
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                h.update(key.encode())
                if isinstance(value, torch.Tensor):
                    h.update(_full(value).detach().contiguous().numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- checkpoints


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Save model and optimizer with DCP: each rank writes its own shards, and the metadata
    records how they fit together, so any number of workers can load it."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Load a DCP checkpoint into a model and optimizer wrapped any way, on any number of
    workers: each rank reads the pieces of the saved shards that its own shards cover."""
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"no DCP checkpoint at {path} (no .metadata): save one first")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def load_worker(rank: int, world_size: int, config: TrainConfig, path: str,
                save_to: str | None = None) -> dict:  # fmt: skip
    """Build the model wrapped as ``config.sync`` on ``world_size`` workers, load the checkpoint
    at ``path``, save it again to ``save_to`` if given (resharded for this world size), and
    report its whole weights and optimizer state (launch it with ``helpers.dist.launch``)."""
    model = wrap_model(make_model(config), config)
    optimizer = make_optimizer(model, config)
    load_sharded(model, optimizer, path)
    if save_to is not None:
        save_sharded(model, optimizer, save_to)
    return {
        "rank": rank,
        "held": state_bytes(model, optimizer),
        "weights": final_weights(unwrapped(model, config)),
        "optimizer_digest": optimizer_digest(optimizer),
    }


# --------------------------------------------------------------------------- the probe


@dataclass
class ShardingProbe(Probe):
    """What a worker measures around ``train_steps`` (pass ``probe=ShardingProbe(...)`` to
    ``run_training``): memory after every step, a budget, one step's collectives, a checkpoint.

    The RSS is read at three moments, so that its growth can be told apart: before the model is
    built, once it is built and wrapped (what setting up imports and allocates), and after the
    first step (the gradients and the optimizer's state then exist); the peak of the later steps
    is read above the last. The modules imported in each part are counted: an import raises the
    RSS as much as a tensor does. ``huge_pages_grown``: how much of the training's memory the
    kernel put in transparent huge pages, whose 2 MiB stay resident while any byte is in use.

    ``budget_bytes``: the most bytes of parameters, gradients and optimizer state the worker
    may hold, read from its tensors after every step; over it, the worker stops with a
    ``MemoryBudgetError``. (The peak RSS is reported, not budgeted: it also counts what the
    allocator keeps after freeing, which differs between allocators and platforms.)
    ``count_step``: the step whose collectives are recorded, counted from 1 as checkpoints
    count (None: none; the first cannot be, since nothing runs before it).
    ``replay_repeats``: time those collectives alone, each call's median of this many repeats.
    ``save_to``: a folder for a DCP checkpoint after the last step."""

    budget_bytes: int | None = None
    count_step: int | None = 2
    replay_repeats: int = 0
    save_to: str | None = None
    digest: bool = False  # a digest of the whole optimizer state (gathers it: after the budget)
    # filled in inside the worker
    rank: int = 0
    world_size: int = 1
    baseline_rss: int = 0
    huge_pages: int = 0  # AnonHugePages at the start, bytes
    setup_rss: int | None = None
    first_step_rss: int | None = None
    later_peak: int | None = None
    peak_rss: int = 0
    modules: list[int] = field(default_factory=list)  # len(sys.modules) at each moment
    exact_peak: bool = False
    held: dict[str, int] = field(default_factory=dict)
    peak_growth: int = 0
    step_times: list[float] = field(default_factory=list)
    step_faults: list[int] = field(default_factory=list)  # minor page faults, at the same marks
    calls: list[tuple[str, int]] = field(default_factory=list)
    _counter: CollectiveCounter | None = None

    def start(self, rank: int, world_size: int) -> None:
        """Just before the model is built: take the memory baseline, and forget the previous
        training's measurements (one probe serves every training of a launch, ``run_trainings``)."""
        self.rank, self.world_size = rank, world_size
        self.held, self.peak_growth, self.calls, self._counter = {}, 0, [], None
        self.setup_rss = self.first_step_rss = self.later_peak = None
        self.exact_peak, self.huge_pages = reset_peak_rss(), huge_pages_held()
        self.baseline_rss = rss_bytes() if self.exact_peak else peak_rss_bytes()
        self.peak_rss, self.modules = self.baseline_rss, [len(sys.modules)]
        self.step_times, self.step_faults = [time.perf_counter()], [minor_faults()]

    def ready(self, model: nn.Module) -> None:
        """The model is built and wrapped, nothing trained yet: what the setup added."""
        self.setup_rss = rss_bytes()
        self.modules.append(len(sys.modules))
        self.step_times, self.step_faults = [time.perf_counter()], [minor_faults()]

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After step ``step`` (counted from 1): memory, the budget, the collectives' counter."""
        self.step_times.append(time.perf_counter())
        self.step_faults.append(minor_faults())
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.calls, self._counter = self._counter.calls, None
        held = state_bytes(model, optimizer)
        self.held = {k: max(v, self.held.get(k, 0)) for k, v in held.items()}
        peak = peak_rss_bytes()
        self.peak_rss = max(self.peak_rss, peak)
        self.peak_growth = max(0, self.peak_rss - self.baseline_rss)
        if step == 1:  # from here on, the peak of the later steps alone (exact on Linux)
            self.first_step_rss = rss_bytes()
            self.modules.append(len(sys.modules))
            if self.exact_peak:
                reset_peak_rss()
        else:
            self.later_peak = max(peak, self.later_peak or 0)
        needed = sum(held.values())
        if self.budget_bytes is not None and needed > self.budget_bytes:
            raise MemoryBudgetError(
                f"rank {self.rank} of {self.world_size} holds {needed / MB:.1f} MB of "
                f"parameters, gradients and optimizer state after step {step}, over its budget "
                f"of {self.budget_bytes / MB:.0f} MB (peak RSS growth so far "
                f"{self.peak_growth / MB:.0f} MB): shard the model over more workers "
                "(sync='fsdp2')"
            )
        if self.count_step is not None and step + 1 == self.count_step:  # the next step's
            self._counter = CollectiveCounter()
            self._counter.__enter__()
        self.step_times[-1] = time.perf_counter()  # the accounting is not the step's
        self.step_faults[-1] = minor_faults()

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """After the last step: what was measured, the replay timing, the checkpoint."""
        if self._counter is not None:  # count_step was past the last step
            self._counter.__exit__(None, None, None)
            self._counter = None
        self.modules.append(len(sys.modules))
        report = {
            "held": dict(self.held),
            "peak_rss": self.peak_rss,
            "baseline_rss": self.baseline_rss,
            "peak_growth": self.peak_growth,
            "growth_by_part": _growth_by_part(self),
            "modules_imported": dict(zip(("setup", "first_step", "later_steps"),
                                         (b - a for a, b in pairwise(self.modules)),
                                         strict=False)),  # fmt: skip
            "exact_peak": self.exact_peak,
            "huge_pages_grown": max(0, huge_pages_held() - self.huge_pages),
            **_step_quartiles(self.step_times),
            "step_minor_faults": median_step_faults(self.step_faults),
            "calls": list(self.calls),
            "replay_seconds": None,
            "replay_call_seconds": None,
            "optimizer_digest": optimizer_digest(optimizer) if self.digest else None,
        }
        if self.calls and self.replay_repeats:
            per_call = replay_call_seconds(self.calls, self.replay_repeats)
            report["replay_call_seconds"] = per_call
            report["replay_seconds"] = sum(per_call)
        if self.save_to is not None:
            save_sharded(model, optimizer, self.save_to)
        return report


def _growth_by_part(probe: ShardingProbe) -> dict[str, int | None]:
    """Bytes the RSS grew in each part of a training: the setup (imports, the model, its
    wrapper), the first step (from the setup's end), the later steps (their peak, above the
    first step's end); None where the part was not reached."""
    marks = [probe.baseline_rss, probe.setup_rss, probe.first_step_rss, probe.later_peak]
    parts = ["setup", "first_step", "later_steps"]
    return {
        part: None if a is None or b is None else b - a
        for part, (a, b) in zip(parts, pairwise(marks), strict=True)
    }


def _step_quartiles(times: list[float]) -> dict[str, float | None]:
    """The median seconds per step and its spread, the quartiles (the middle half of the steps),
    leaving out the first (allocations, DDP's bucket rebuild). Quartiles, not the extremes: one
    step of every run is the counted one, slowed by the counter, and a loaded machine stalls a
    step now and then; a median alone would hide how much the steps move."""
    durations = [b - a for a, b in zip(times, times[1:], strict=False)][1:]
    if not durations:
        return {"step_seconds": None, "step_q1_seconds": None, "step_q3_seconds": None}
    q1, _, q3 = (statistics.quantiles(durations, n=4, method="inclusive")
                 if len(durations) > 1 else durations * 3)  # fmt: skip
    return {"step_seconds": statistics.median(durations), "step_q1_seconds": q1,
            "step_q3_seconds": q3}  # fmt: skip


def label(run: RunResult) -> str:
    """A run's wrapping and world size, for tables and figures: "FSDP2, 2 workers"."""
    name = {"ddp": "DDP", "fsdp2": "FSDP2", "none": "no communication"}.get(run.sync, run.sync)
    keep = run.sync == "fsdp2" and not run.reshard_after_forward
    return f"{name}{' (kept)' if keep else ''}, {run.world} worker{'s' if run.world > 1 else ''}"


def memory_table(runs: list[RunResult]) -> pd.DataFrame:
    """Per run, rank 0's MB of parameters, gradients and optimizer state read from its tensors,
    their total, and its process's peak RSS, with the growth over the RSS just before the model
    was built, and that growth by part (``_growth_by_part``: setup, first step, later steps)."""
    rows = []
    for run in runs:
        probe = run.probes[0]
        held = {k: v / MB for k, v in probe["held"].items()}
        parts = {
            f"{part}_growth": float("nan") if value is None else value / MB
            for part, value in probe["growth_by_part"].items()
        }
        rows.append(
            {
                "run": label(run),
                **held,
                "state_total": sum(held.values()),
                "peak_rss": probe["peak_rss"] / MB,
                "peak_rss_growth": probe["peak_growth"] / MB,
                **parts,
            }
        )
    return pd.DataFrame(rows).set_index("run")


def traffic_table(runs: list[RunResult]) -> pd.DataFrame:
    """Per run, one step's collectives as counted: calls of each kind, the MB each worker sends
    on a ring, its ratio to the first run's, and the milliseconds a step and its collectives alone
    took (rank 0, medians), with the step's quartiles, its spread across steps."""
    rows = []
    for run in runs:
        probe = run.probes[0]
        traffic = per_step_traffic(probe["calls"], run.world)
        rows.append(
            {
                "run": label(run),
                **{f"{kind} calls": traffic.get(kind, {}).get("calls", 0) for kind in COUNTED},
                "sent per worker MB": sum(t["wire_bytes"] for t in traffic.values()) / MB,
                "step ms": 1e3 * probe["step_seconds"],
                "step q1 ms": 1e3 * probe["step_q1_seconds"],
                "step q3 ms": 1e3 * probe["step_q3_seconds"],
                "collectives alone ms": 1e3 * (probe["replay_seconds"] or 0.0),
            }
        )
    table = pd.DataFrame(rows).set_index("run")
    sent = table["sent per worker MB"]
    table.insert(len(COUNTED) + 1, "x first", sent / sent.iloc[0])
    return table


def step_ranking(table: pd.DataFrame) -> list[str]:
    """Every pair of ``traffic_table``'s runs, ranked by their step times only where the middle
    halves of their steps (the quartiles) do not overlap; where they overlap, a tie: a gap inside
    the steps' own spread says nothing about which wrapping is faster."""
    rows = list(table.iterrows())
    lines = []
    for i, (a, ra) in enumerate(rows):
        for b, rb in rows[i + 1 :]:
            if ra["step q3 ms"] < rb["step q1 ms"] or rb["step q3 ms"] < ra["step q1 ms"]:
                (fast, fr), (slow, sr) = sorted([(a, ra), (b, rb)], key=lambda r: r[1]["step ms"])
                lines.append(f"{fast} faster than {slow}: {fr['step ms']:.1f} ms against "
                             f"{sr['step ms']:.1f}, middle halves apart")  # fmt: skip
            else:
                lines.append(f"{a} and {b} tie: their middle halves overlap "
                             f"({ra['step q1 ms']:.1f}-{ra['step q3 ms']:.1f} and "
                             f"{rb['step q1 ms']:.1f}-{rb['step q3 ms']:.1f} ms)")  # fmt: skip
    return lines


def replay_by_kind(runs: list[RunResult]) -> pd.DataFrame:
    """Per run and kind of collective (every kind its counted step issued, a broadcast too),
    rank 0's replay of that step: the calls, their messages' MB, the sum of the calls' median
    ms, ms per call, and ms per MB of message (from 1 MB of messages). Where a step's
    collectives alone take longer than its bytes say, this shows which kind costs more."""
    rows = []
    for run in runs:
        probe = run.probes[0]
        if probe["replay_call_seconds"] is None:
            raise ValueError(f"{label(run)} was not replayed: pass ShardingProbe(replay_repeats=5)")
        timed = list(zip(probe["calls"], probe["replay_call_seconds"], strict=True))
        for kind in dict.fromkeys(k for k, _ in probe["calls"]):  # every kind, in call order
            mine = [(message, seconds) for (k, message), seconds in timed if k == kind]
            message_mb = sum(m for m, _ in mine) / MB
            ms = 1e3 * sum(s for _, s in mine)
            rows.append({"run": label(run), "kind": kind, "calls": len(mine),
                         "message MB": message_mb, "alone ms": ms, "ms per call": ms / len(mine),
                         # under 1 MB a call's time is its fixed cost: per MB it says nothing
                         "ms per MB": ms / message_mb if message_mb >= 1 else float("nan")})
    return pd.DataFrame(rows).set_index(["run", "kind"])


def traffic_by_kind(runs: list[RunResult]) -> pd.DataFrame:
    """Per run, the MB each worker sends on a ring in one step, by collective (rank 0's counted
    step): the split behind ``traffic_table``'s total."""
    rows = {}
    for run in runs:
        traffic = per_step_traffic(run.probes[0]["calls"], run.world)
        rows[label(run)] = {kind: traffic.get(kind, {}).get("wire_bytes", 0.0) / MB
                            for kind in COUNTED}  # fmt: skip
    return pd.DataFrame.from_dict(rows, orient="index")
