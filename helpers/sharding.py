"""Sharding with FSDP2: what each worker holds, what it sends, and sharded checkpoints.

``helpers.training`` trains under DDP or FSDP2 (``TrainConfig(sync="fsdp2")``) with one loop;
this module measures what the wrapping changes (notebook 07):

* ``state_bytes``: the bytes of parameters, gradients and optimizer state a worker holds, read
  from its tensors (under FSDP2, the local shards of the ``DTensor``s);
* ``CollectiveCounter``: every collective a block of code issues, with its message size, as
  PyTorch's dispatcher sees it (DDP's all-reduces, FSDP2's all-gathers and reduce-scatters);
* ``ShardingProbe``: handed to ``run_training``, it accounts a worker's memory after every step,
  enforces a memory budget, counts and times one step's collectives, and saves a sharded
  checkpoint with ``torch.distributed.checkpoint`` (DCP);
* ``load_worker``: loads such a checkpoint on any number of workers, sharded or not.

Peak resident memory (RSS) is read from the kernel: on Linux the high-water mark is reset just
before the model is built (``/proc/self/clear_refs``), so what the training adds is measured
exactly; elsewhere only the process's lifetime peak is available, and the growth above it is a
lower bound.
"""

from __future__ import annotations

import hashlib
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.comm_model import ring_factor
from helpers.training import (
    RunResult,
    TrainConfig,
    final_weights,
    make_model,
    make_optimizer,
    unwrapped,
    wrap_model,
)

MB = 1e6

# --------------------------------------------------------------------------- memory


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this worker stores for ``tensor``: its local shard if it is a ``DTensor``."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this worker holds, from its tensors."""
    params = list(model.parameters())
    state = [] if optimizer is None else list(optimizer.state.values())
    return {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_state": sum(
            local_bytes(v) for s in state for v in s.values() if isinstance(v, torch.Tensor)
        ),
    }


def _proc_status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak so far."""
    kb = _proc_status_kb("VmRSS")
    return kb * 1024 if kb is not None else peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident memory: since the last ``reset_peak_rss`` on Linux, since
    it started elsewhere."""
    kb = _proc_status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB elsewhere


def reset_peak_rss() -> bool:
    """Reset the peak to the current RSS (Linux 4.0 and later); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class MemoryBudgetError(RuntimeError):
    """A worker needed more memory than its budget."""


# What each ZeRO stage shards (Rajbhandari et al. 2020): 0 is DDP, 3 is FSDP's full sharding.
STAGES = {
    0: "DDP: nothing sharded",
    1: "ZeRO-1: optimizer state",
    2: "ZeRO-2: + gradients",
    3: "ZeRO-3 / FSDP: + parameters",
}
STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}  # optimizer state, in copies of the weights


def expected_bytes(param_bytes: int, optimizer: str, world_size: int, stage: int) -> dict:
    """Bytes per worker of parameters, gradients and optimizer state at a ZeRO stage, from the
    parameters' bytes alone (float32 everywhere, shards of exactly 1/N)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {sorted(STAGES)}, got {stage}")
    if optimizer not in STATE_COPIES:
        raise ValueError(f"optimizer must be one of {sorted(STATE_COPIES)}, got {optimizer!r}")
    n = world_size
    return {
        "parameters": param_bytes / (n if stage >= 3 else 1),
        "gradients": param_bytes / (n if stage >= 2 else 1),
        "optimizer_state": STATE_COPIES[optimizer] * param_bytes / (n if stage >= 1 else 1),
    }


def stages_table(param_bytes: int, optimizer: str, world_sizes: list[int]) -> pd.DataFrame:
    """MB per worker at every ZeRO stage and world size: the arithmetic the measurements test."""
    rows = []
    for stage, name in STAGES.items():
        row: dict[str, Any] = {"stage": name}
        for n in world_sizes:
            row[f"{n} workers MB"] = sum(expected_bytes(param_bytes, optimizer, n, stage).values())
            row[f"{n} workers MB"] /= MB
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage").round(1)


# --------------------------------------------------------------------------- communication

KINDS = {
    "allreduce_": "all-reduce",
    "allreduce_coalesced_": "all-reduce",
    "_allgather_base_": "all-gather",
    "allgather_": "all-gather",
    "allgather_into_tensor_coalesced_": "all-gather",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "broadcast_": "broadcast",
}


def _bytes_in(arg: Any) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, list | tuple):
        return sum(_bytes_in(a) for a in arg)
    return 0


def wire_bytes(kind: str, message: int, world_size: int) -> float:
    """Bytes each worker sends for one collective on a ring: ``2(N-1)/N`` times the message for
    an all-reduce, ``(N-1)/N`` for an all-gather or a reduce-scatter (each is one half of a
    ring all-reduce), ``message`` for a broadcast's root."""
    if kind == "all-reduce":
        return ring_factor(world_size) * message
    if kind in ("all-gather", "reduce-scatter"):
        return ring_factor(world_size) / 2 * message
    return float(message) if world_size > 1 else 0.0


class CollectiveCounter(TorchDispatchMode):
    """Record every collective issued inside ``with CollectiveCounter() as c:``: its kind and its
    message, the larger of its input and output (the whole tensor an all-gather assembles, the
    whole tensor a reduce-scatter reduces). DDP's reducer and FSDP2's hooks both go through
    PyTorch's dispatcher, where this mode sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            name = func.__name__.split(".")[0]
            kind = KINDS.get(name, name)
            message = max((_bytes_in(a) for a in (*args, *kwargs.values())), default=0)
            self.calls.append((kind, message))
        return func(*args, **kwargs)


def replay_seconds(calls: list[tuple[str, int]], repeats: int) -> float:
    """Median seconds to issue ``calls`` again, alone, one after another (every rank must call
    it): the communication of one step without the computation around it."""
    world = dist.get_world_size()
    buffers = []
    for kind, message in calls:
        n = max(1, message // 4)
        n -= n % world
        buffers.append((kind, torch.zeros(n), torch.zeros(max(1, n // world))))
    times = []
    for _ in range(repeats + 1):  # the first round is a warm-up
        dist.barrier()
        started = time.perf_counter()
        for kind, whole, shard in buffers:
            if kind == "all-reduce":
                dist.all_reduce(whole)
            elif kind == "all-gather":
                dist.all_gather_single(whole, shard)
            elif kind == "reduce-scatter":
                dist.reduce_scatter_single(shard, whole)
            elif kind == "broadcast":
                dist.broadcast(whole, 0)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


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


def load_worker(rank: int, world_size: int, config: TrainConfig, path: str) -> dict:
    """Build the model wrapped as ``config.sync`` on ``world_size`` workers, load the checkpoint
    at ``path``, and report its whole weights and optimizer state (launch it with
    ``helpers.launch.launch``)."""
    model = wrap_model(make_model(config), config)
    optimizer = make_optimizer(model, config)
    load_sharded(model, optimizer, path)
    return {
        "rank": rank,
        "held": state_bytes(model, optimizer),
        "weights": final_weights(unwrapped(model, config)),
        "optimizer_digest": optimizer_digest(optimizer),
    }


# --------------------------------------------------------------------------- the probe


@dataclass
class ShardingProbe:
    """What a worker measures around ``train_steps`` (pass ``probe=ShardingProbe(...)`` to
    ``run_training``): memory after every step, a budget, one step's collectives, a checkpoint.

    ``budget_bytes``: the most bytes of parameters, gradients and optimizer state the worker
    may hold, read from its tensors after every step; over it, the worker stops with a
    ``MemoryBudgetError``. (The peak RSS is reported, not budgeted: it also counts what the
    allocator keeps after freeing, which differs between allocators and platforms.)
    ``count_step``: the step whose collectives are recorded (0 counts none).
    ``replay_repeats``: time those collectives alone, median of this many repeats.
    ``save_to``: a folder for a DCP checkpoint after the last step."""

    budget_bytes: int | None = None
    count_step: int = 1
    replay_repeats: int = 0
    save_to: str | None = None
    digest: bool = False  # a digest of the whole optimizer state (gathers it: after the budget)
    # filled in inside the worker
    rank: int = 0
    world_size: int = 1
    baseline_rss: int = 0
    exact_peak: bool = False
    held: dict[str, int] = field(default_factory=dict)
    peak_growth: int = 0
    step_times: list[float] = field(default_factory=list)
    calls: list[tuple[str, int]] = field(default_factory=list)
    _counter: CollectiveCounter | None = None

    def start(self, rank: int, world_size: int) -> None:
        """Just before the model is built: take the memory baseline."""
        self.rank, self.world_size = rank, world_size
        self.exact_peak = reset_peak_rss()
        self.baseline_rss = rss_bytes() if self.exact_peak else peak_rss_bytes()
        self.step_times = [time.perf_counter()]

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.step_times.append(time.perf_counter())
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.calls, self._counter = self._counter.calls, None
        held = state_bytes(model, optimizer)
        self.held = {k: max(v, self.held.get(k, 0)) for k, v in held.items()}
        self.peak_growth = max(0, peak_rss_bytes() - self.baseline_rss)
        needed = sum(held.values())
        if self.budget_bytes is not None and needed > self.budget_bytes:
            raise MemoryBudgetError(
                f"rank {self.rank} of {self.world_size} holds {needed / MB:.1f} MB of "
                f"parameters, gradients and optimizer state after step {step}, over its budget "
                f"of {self.budget_bytes / MB:.0f} MB (peak RSS growth so far "
                f"{self.peak_growth / MB:.0f} MB): shard the model over more workers "
                "(sync='fsdp2')"
            )
        if step + 1 == self.count_step:  # record the next step's collectives
            self._counter = CollectiveCounter()
            self._counter.__enter__()
        self.step_times[-1] = time.perf_counter()  # the accounting is not the step's

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """After the last step: what was measured, the replay timing, the checkpoint."""
        if self._counter is not None:  # count_step was past the last step
            self._counter.__exit__(None, None, None)
            self._counter = None
        report = {
            "held": dict(self.held),
            "peak_rss": peak_rss_bytes(),
            "baseline_rss": self.baseline_rss,
            "peak_growth": self.peak_growth,
            "exact_peak": self.exact_peak,
            "step_seconds": _step_seconds(self.step_times),
            "calls": list(self.calls),
            "replay_seconds": None,
            "optimizer_digest": optimizer_digest(optimizer) if self.digest else None,
        }
        if self.calls and self.replay_repeats:
            report["replay_seconds"] = replay_seconds(self.calls, self.replay_repeats)
        if self.save_to is not None:
            save_sharded(model, optimizer, self.save_to)
        return report


def _step_seconds(times: list[float]) -> float | None:
    """Median seconds per step, leaving out the first (allocations, DDP's bucket rebuild)."""
    durations = [b - a for a, b in zip(times, times[1:], strict=False)][1:]
    return statistics.median(durations) if durations else None


def per_step_traffic(calls: list[tuple[str, int]], world_size: int) -> dict[str, dict]:
    """One step's collectives summed by kind: calls, message bytes, and the bytes each worker
    sends on a ring (``wire_bytes``)."""
    table: dict[str, dict] = {}
    for kind, message in calls:
        row = table.setdefault(kind, {"calls": 0, "message_bytes": 0, "wire_bytes": 0.0})
        row["calls"] += 1
        row["message_bytes"] += message
        row["wire_bytes"] += wire_bytes(kind, message, world_size)
    return table


def label(run: RunResult) -> str:
    """A run's wrapping and world size, for tables and figures: "FSDP2, 2 workers"."""
    name = {"ddp": "DDP", "fsdp2": "FSDP2"}.get(run.sync, run.sync)
    keep = run.sync == "fsdp2" and not run.reshard_after_forward
    return f"{name}{' (kept)' if keep else ''}, {run.world} worker{'s' if run.world > 1 else ''}"


def memory_table(runs: list[RunResult]) -> pd.DataFrame:
    """Per run, rank 0's MB of parameters, gradients and optimizer state read from its tensors,
    their total, and its process's peak RSS, with the growth over the RSS just before the model
    was built."""
    rows = []
    for run in runs:
        probe = run.probes[0]
        held = {k: v / MB for k, v in probe["held"].items()}
        rows.append(
            {
                "run": label(run),
                **held,
                "state_total": sum(held.values()),
                "peak_rss": probe["peak_rss"] / MB,
                "peak_rss_growth": probe["peak_growth"] / MB,
            }
        )
    return pd.DataFrame(rows).set_index("run")


def traffic_table(runs: list[RunResult]) -> pd.DataFrame:
    """Per run, one step's collectives as counted: calls of each kind, the MB each worker sends
    on a ring, its ratio to the first run's, and the seconds a step and its collectives alone
    took (rank 0, medians)."""
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
                "collectives alone ms": 1e3 * (probe["replay_seconds"] or 0.0),
            }
        )
    table = pd.DataFrame(rows).set_index("run")
    sent = table["sent per worker MB"]
    table.insert(len(COUNTED) + 1, "x first", sent / sent.iloc[0])
    return table


COUNTED = ("all-reduce", "all-gather", "reduce-scatter")
