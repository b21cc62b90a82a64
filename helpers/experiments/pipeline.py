"""Pipeline parallelism (notebook 09, section 2): the MLP's layers split into stages, one per
worker, each global batch cut into ``m`` micro-batches that flow through the stages, with
``torch.distributed.pipelining`` (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``).

``TimedStage`` is a ``PipelineStage`` that records when each micro-batch's forward and backward
ran (its compute only: the schedule's sends and receives happen between them) and which
activations its autograd graph keeps (``saved_activations.SavedActivations``).
``pipeline_worker`` trains a split as one worker trains it and times the schedules; ``assemble``
joins the stages' records; ``idle_fractions``, ``replay`` and ``textbook_bubble`` measure,
replay and predict the bubble."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from helpers.dist.counting import CollectiveCounter
from helpers.experiments.saved_activations import SavedActivations
from helpers.experiments.split_training import Steps

SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that records ``(kind, micro-batch, start, end, cpu)`` for every
    forward ("F") and backward ("B") it computes: start and end on the machine-wide monotonic
    clock (the same in every process), ``cpu`` the seconds this thread computed in between (with
    one thread per worker, the compute's own time, which a busy machine stretches less than the
    wall clock's). It meters the activations its forwards save."""

    def __init__(self, submodule: nn.Module, stage_index: int, num_stages: int) -> None:
        super().__init__(submodule, stage_index, num_stages, torch.device("cpu"))
        self.events: list[tuple[str, int, float, float]] = []
        self.saved = SavedActivations(list(submodule.parameters()))

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        start, cpu = time.perf_counter(), time.thread_time()
        with self.saved.hooks(fwd_chunk_id):
            output = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.events.append(("F", fwd_chunk_id, start, time.perf_counter(),
                            time.thread_time() - cpu))  # fmt: skip
        return output

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True,
                           last_backward=False):  # fmt: skip
        start, cpu = time.perf_counter(), time.thread_time()
        super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
        self.events.append(("B", bwd_chunk_id, start, time.perf_counter(),
                            time.thread_time() - cpu))  # fmt: skip


def stage_module(model: nn.Sequential, split: int, stage: int) -> nn.Sequential:
    """Stage 0 is ``model[:split]``, stage 1 ``model[split:]``."""
    if not 0 < split < len(model):
        raise ValueError(f"split must cut the model's {len(model)} modules in two: 1 to "
                         f"{len(model) - 1}, got {split}")  # fmt: skip
    return model[:split] if stage == 0 else model[split:]


def make_schedule(stage: TimedStage, name: str, micro_batches: int, scale_grads: bool = True):
    """The schedule ``name`` over ``micro_batches``, each micro-batch's loss its mean cross-entropy:
    with ``scale_grads`` the schedule divides the summed gradients by ``micro_batches``."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name](stage, micro_batches, loss_fn=F.cross_entropy, scale_grads=scale_grads)


def order_of(schedule, stage_index: int) -> list[str]:
    """The schedule's own plan for a stage, as "F0", "B0", ...: forwards and backwards only."""
    actions = (schedule.pipeline_order or {}).get(stage_index, [])
    return [f"{a.computation_type.value}{a.microbatch_index}" for a in actions
            if a is not None and a.computation_type.value in ("F", "B")]  # fmt: skip


def pipeline_step(schedule, stage: TimedStage, X: torch.Tensor, y: torch.Tensor) -> tuple:
    """One pipelined forward and backward of a global batch; the last stage gets the merged
    logits and the micro-batches' losses."""
    losses: list[torch.Tensor] = []
    if stage.is_first:
        return schedule.step(X), losses
    return schedule.step(target=y, losses=losses), losses


def train_pipelined(
    rank: int,
    spec: Steps,
    split: int,
    schedule_name: str,
    micro_batches: int,
    X: torch.Tensor,
    y: torch.Tensor,
    scale_grads: bool = True,
) -> dict:
    """Train ``spec`` pipelined over 2 stages; this stage's part of the record, with the
    collectives of its second step, counted."""
    module = stage_module(spec.model(), split, rank)
    stage = TimedStage(module, rank, dist.get_world_size())
    schedule = make_schedule(stage, schedule_name, micro_batches, scale_grads)
    optimizer = torch.optim.SGD(module.parameters(), lr=spec.lr)
    losses, logits, grads, calls = [], None, None, []
    for step, idx in enumerate(spec.batches(len(X))):
        optimizer.zero_grad()
        with CollectiveCounter() as counter:  # the first step also sends the shapes
            output, mb_losses = pipeline_step(schedule, stage, X[idx], y[idx])
        calls = counter.calls if step == 1 else calls
        if grads is None:
            logits, grads = output, [p.grad.clone() for p in module.parameters()]
        losses.append(float(torch.stack(mb_losses).detach().mean()) if mb_losses else np.nan)
        optimizer.step()
    return {
        "stage": rank,
        "logits": None if logits is None else logits.detach().double().numpy(),
        "grads": [g.double().numpy().ravel() for g in grads],
        "weights": [p.detach().double().numpy().ravel() for p in module.parameters()],
        "losses": losses,
        "order": [f"{e[0]}{e[1]}" for e in stage.events[-2 * micro_batches:]],
        "planned_order": order_of(schedule, rank),
        "peak_micro_batches": stage.saved.peak_micro_batches,
        "peak_bytes": stage.saved.peak_bytes,
        "parameters": sum(p.numel() for p in module.parameters()),
        "calls": calls,
    }


def assemble(stages: list[dict]) -> dict:
    """One record from the stages' (in stage order): what ``split_training.gaps`` compares."""
    last = stages[-1]
    return {
        "logits": last["logits"],
        "grads": np.concatenate([g for s in stages for g in s["grads"]]),
        "losses": np.asarray(last["losses"]),
        "weights": np.concatenate([w for s in stages for w in s["weights"]]),
    }


def time_schedules(rank: int, spec: Steps, split: int, micro_batches: list[int],
                   schedules: tuple[str, ...], repeats: int,
                   X: torch.Tensor, y: torch.Tensor) -> list[dict]:  # fmt: skip
    """Every schedule at every ``m``: a warm-up step, then ``repeats`` timed steps (forward and
    backward; the weights are left alone), each started together after a barrier. This stage's
    events of each timed step, and its activations' peak."""
    module = stage_module(spec.model(), split, rank)
    idx = spec.batches(len(X))[0]
    rows = []
    for name in schedules:
        for m in micro_batches:
            if name == "1F1B" and m < dist.get_world_size():
                continue  # 1F1B needs a micro-batch per stage in flight: PyTorch refuses fewer
            stage = TimedStage(module, rank, dist.get_world_size())
            schedule = make_schedule(stage, name, m)
            for repeat in range(repeats + 1):
                module.zero_grad()
                dist.barrier()
                stage.events.clear()
                pipeline_step(schedule, stage, X[idx], y[idx])
                if repeat:  # the first step infers the shapes and allocates
                    rows.append({"schedule": name, "m": m, "repeat": repeat, "stage": rank,
                                 "events": list(stage.events)})  # fmt: skip
            rows.append({"schedule": name, "m": m, "repeat": 0, "stage": rank, "events": [],
                         "peak_micro_batches": stage.saved.peak_micro_batches,
                         "peak_bytes": stage.saved.peak_bytes})  # fmt: skip
    return rows


def pipeline_worker(rank: int, world_size: int, spec: Steps, split: int,
                    trainings: list[tuple[str, int, bool]], micro_batches: list[int] | None = None,
                    repeats: int = 5) -> dict:  # fmt: skip
    """Each ``(schedule, m, scale_grads)`` of ``trainings`` trained as one worker trains, then,
    if ``micro_batches`` is given, both schedules timed at each ``m``."""
    if world_size != 2:
        raise ValueError(f"this pipeline has 2 stages: launch it on 2 workers, not {world_size}")
    X, y = spec.data_tensors()
    report = {"trained": {(name, m, scale): train_pipelined(rank, spec, split, name, m, X, y, scale)
                          for name, m, scale in trainings}}  # fmt: skip
    if micro_batches:
        report["timed"] = time_schedules(rank, spec, split, micro_batches, tuple(SCHEDULES),
                                         repeats, X, y)  # fmt: skip
    return report


# --------------------------------------------------------------------------- the bubble

Events = dict[int, list[tuple]]  # stage: its (kind, micro-batch, start, end, cpu) in order


def textbook_order(schedule: str, stage: int, stages: int, m: int) -> list[str]:
    """A stage's forwards and backwards as the papers define them. GPipe (Huang et al. 2019):
    every forward, then every backward. 1F1B (Narayanan et al. 2019): ``stages - stage``
    forwards to fill the pipeline, then one backward and one forward in turn, then the
    remaining backwards."""
    if schedule == "GPipe":
        return [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)]
    warmup = min(m, stages - stage)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(m - warmup):
        order += [f"B{i}", f"F{warmup + i}"]
    return order + [f"B{i}" for i in range(m - warmup, m)]


def idle_fractions(events: Events, cpu: bool = False) -> dict[str, float]:
    """One step's bubble from every stage's events: each stage's idle fraction of the step (the
    time from the first start to the last end, over all stages, not spent computing) and the
    pipeline's, ``1 - sum(busy) / (p * span)``. With ``cpu``, the step is replayed instead
    (``replay``) from the recorded order and the compute's CPU seconds, with free
    communication: what the schedule costs where nothing else runs."""
    if cpu:
        return replay({s: [(f"{e[0]}{e[1]}", e[4]) for e in evs] for s, evs in events.items()})
    start = min(e[2] for evs in events.values() for e in evs)
    span = max(e[3] for evs in events.values() for e in evs) - start
    return _fractions({s: sum(e[3] - e[2] for e in evs) for s, evs in events.items()}, span)


def _fractions(busy: dict[int, float], span: float) -> dict[str, float]:
    out = {f"stage {s} idle": 1 - b / span for s, b in sorted(busy.items())}
    out["pipeline idle"] = 1 - sum(busy.values()) / (len(busy) * span)
    out["span_s"] = span
    return out


def replay(ops: dict[int, list[tuple[str, float]]]) -> dict[str, float]:
    """Run each stage's ``(op, seconds)`` in its order, every op as soon as its stage is free
    and its input is there: a forward ``F i`` after the previous stage's ``F i``, a backward
    ``B i`` after the next stage's ``B i``. The idle fractions of the result."""
    ready: dict[tuple[int, str], float] = {}
    clock, position = dict.fromkeys(ops, 0.0), dict.fromkeys(ops, 0)
    moved = True
    while moved:
        moved = False
        for s, todo in ops.items():
            while position[s] < len(todo):
                op, seconds = todo[position[s]]
                source = s - 1 if op[0] == "F" else s + 1
                if source in ops and (source, op) not in ready:
                    break  # its input has not been computed yet
                clock[s] = max(clock[s], ready.get((source, op), 0.0)) + seconds
                ready[s, op] = clock[s]
                position[s] += 1
                moved = True
    if any(position[s] < len(todo) for s, todo in ops.items()):
        raise ValueError("the stages' orders wait on each other: not a pipeline schedule")
    busy = {s: sum(seconds for _, seconds in todo) for s, todo in ops.items()}
    return _fractions(busy, max(clock.values()))


def bubble_table(rows: list[dict]) -> list[dict]:
    """Per schedule and ``m``: the medians over the repeats of the idle fractions measured on
    the wall clock and replayed from the CPU seconds, and of the seconds each stage computes
    per micro-batch (forward and backward, CPU)."""
    steps: dict[tuple[str, int, int], Events] = {}
    for row in rows:
        if row["repeat"]:
            key = (row["schedule"], row["m"], row["repeat"])
            steps.setdefault(key, {})[row["stage"]] = row["events"]
    by_config: dict[tuple[str, int], list[dict]] = {}
    for (name, m, _), events in steps.items():
        measured = idle_fractions(events)
        replayed = idle_fractions(events, cpu=True)
        row = {f"{k} (wall)": v for k, v in measured.items()}
        row.update({f"{k} (replayed)": v for k, v in replayed.items()})
        for s, evs in events.items():
            row[f"stage {s} cpu s per micro-batch"] = sum(e[4] for e in evs) / m
        by_config.setdefault((name, m), []).append(row)
    table = []
    for (name, m), repeats in sorted(by_config.items()):
        medians = {k: statistics.median(r[k] for r in repeats) for k in repeats[0]}
        per_op = [v for k, v in medians.items() if k.endswith("cpu s per micro-batch")]
        medians["imbalance floor"] = imbalance_floor(per_op)
        table.append({"schedule": name, "m": m, "repeats": len(repeats), **medians})
    return table


def imbalance_floor(seconds_per_micro_batch: list[float]) -> float:
    """The idle fraction that unequal stages leave however many micro-batches there are: as
    ``m`` grows the step lasts ``m`` times the slowest stage's time per micro-batch, while the
    stages compute ``m`` times their sum, so ``1 - sum / (p * max)`` of their time is idle
    (``(c1 - c0) / (2 c1)`` for 2 stages of which stage 1 is the slower)."""
    return 1 - sum(seconds_per_micro_batch) / (len(seconds_per_micro_batch)
                                               * max(seconds_per_micro_batch))  # fmt: skip


def textbook_bubble(stages: int, m: int) -> float:
    """The bubble of equal stages and free communication: ``(p - 1) / (m + p - 1)`` of every
    stage's time is idle (Huang et al. 2019), for GPipe and 1F1B alike."""
    return (stages - 1) / (m + stages - 1)
