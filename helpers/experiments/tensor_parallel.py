"""Tensor parallelism (notebook 09, section 1): every ``Linear`` of the MLP split across the
workers by columns or by rows, with DTensor's ``parallelize_module``, trained as one worker trains.

Megatron-LM's pattern (Shoeybi et al. 2019): a column-parallel layer keeps ``1/N`` of the output
features on each worker, the next, row-parallel, layer ``1/N`` of its input features, so that
the pair needs one all-reduce of activations in the forward (the row-parallel layer's partial
sums) and one in the backward (the gradient of the pair's input, where it needs one). Every
worker sees the whole batch.

``tp_worker`` trains a plan and reports the record ``split_training.gaps`` compares with one
worker, the collectives of one step counted through the dispatcher, and the bytes held;
``held_worker`` measures what DDP, FSDP2 and tensor parallelism hold with Adam, and what each
sends in one step."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist.counting import CollectiveCounter
from helpers.experiments.memory import state_bytes
from helpers.experiments.split_training import Steps, record
from helpers.training.order import local_slice

Plan = dict[str, ParallelStyle]


def quiet_hooks() -> None:
    """DTensor's module hooks make autograd warn, once per process, that a full backward hook
    fires though no input needs a gradient (the data): true, and harmless here."""
    warnings.filterwarnings("ignore", message="Full backward hook is firing")


def megatron_plan(model: nn.Sequential) -> Plan:
    """Column-parallel, then row-parallel, for each pair of hidden ``Linear`` layers in turn (the
    last, a 6-class output, stays whole on every worker)."""
    linears = [name for name, layer in model.named_children() if isinstance(layer, nn.Linear)]
    hidden = linears[:-1]
    return {name: ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
            for i, name in enumerate(hidden[: len(hidden) // 2 * 2])}  # fmt: skip


def describe(plan: Plan) -> list[str]:
    """One line per planned layer: its name, its style, and the layouts the style takes its input
    in and hands its output on in (``R``, ``S(dim)``): two styles of one class can differ there."""

    def placements(style: ParallelStyle, which: str) -> str:
        return " ".join(str(p) for p in getattr(style, which, ())) or "-"

    return [f"{name}: {type(style).__name__}, input {placements(style, 'input_layouts')}, "
            f"output {placements(style, 'output_layouts')}"
            f"{'' if getattr(style, 'use_local_output', True) else ' (a DTensor)'}"
            for name, style in plan.items()]  # fmt: skip


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor's shards gathered (every rank must call it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def layouts(model: nn.Module) -> dict[str, str]:
    """Every parameter's placement on the mesh, and its local shape: what the plan did."""
    found = {}
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            found[name] = f"{p.placements[0]} {tuple(p.to_local().shape)} of {tuple(p.shape)}"
        else:
            found[name] = f"whole {tuple(p.shape)}"
    return found


def tp_worker(rank: int, world_size: int, spec: Steps, plan: Plan | None = None,
              count_step: int = 1) -> dict:  # fmt: skip
    """Train ``spec`` with every worker on the whole batch and the model split by ``plan``
    (``megatron_plan`` if None). Returns the record to compare with one worker, the parameters'
    layouts, the collectives of step ``count_step`` (counted from 0) as counted and as DTensor's
    own ``CommDebugMode`` counts them, and the bytes of parameters and gradients this rank holds."""
    quiet_hooks()
    X, y = spec.data_tensors()
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    model = spec.model()
    model = parallelize_module(model, mesh, megatron_plan(model) if plan is None else plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    losses, first, calls, debug_counts = [], None, [], {}
    for step, idx in enumerate(spec.batches(len(X))):
        optimizer.zero_grad()
        counter, debug = CollectiveCounter(), CommDebugMode()
        if step == count_step:
            counter.__enter__()
            debug.__enter__()
        logits = model(X[idx])
        loss = F.cross_entropy(logits, y[idx])
        loss.backward()
        if step == count_step:
            debug.__exit__(None, None, None)
            counter.__exit__(None, None, None)
            calls = counter.calls
            debug_counts = {str(k).split(".")[-1]: v for k, v in debug.get_comm_counts().items()}
        if first is None:
            first = (whole(logits), [whole(p.grad) for p in model.parameters()])
        losses.append(loss.item())
        optimizer.step()
    held = state_bytes(model, optimizer)
    weights = np.concatenate([whole(p).detach().double().numpy().ravel()
                              for p in model.parameters()])  # fmt: skip
    return {
        **record(*first, losses, weights),
        "layouts": layouts(model),
        "calls": calls,
        "debug_counts": debug_counts,
        "held": held,
        "grad_is_dtensor": [isinstance(p.grad, DTensor) for p in model.parameters()],
    }


# --------------------------------------------------------------------------- held and sent


def _one_adam_step(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> tuple[dict, list]:
    """One Adam step, its collectives counted; then the bytes held (Adam's state exists)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with CollectiveCounter() as counter:
        F.cross_entropy(model(X), y).backward()
    optimizer.step()
    return state_bytes(model, optimizer), counter.calls


def held_worker(rank: int, world_size: int, spec: Steps, batches: tuple[int, ...] = (256,)) -> dict:
    """Per wrapping (DDP, FSDP2, tensor parallel), the bytes of parameters, gradients and Adam's
    state this rank holds after one step, and that step's collectives, at each global batch in
    ``batches`` (DDP and FSDP2 take this rank's slice of it, tensor parallelism all of it)."""
    from torch.distributed.fsdp import fully_shard  # a second to import: only where needed

    quiet_hooks()
    X, y = spec.data_tensors()
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    report: dict[str, dict] = {}
    for batch in batches:
        idx = torch.arange(batch)
        mine = local_slice(idx, rank, world_size)
        ddp = DDP(spec.model())
        fsdp = spec.model()
        for layer in fsdp:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(fsdp)
        tp = spec.model()
        tp = parallelize_module(tp, mesh, megatron_plan(tp))
        for name, model, rows in (("DDP", ddp, mine), ("FSDP2", fsdp, mine), ("TP", tp, idx)):
            _one_adam_step(model, X[rows], y[rows])  # DDP builds its buckets at the first step
            held, calls = _one_adam_step(model, X[rows], y[rows])
            report.setdefault(name, {"held": held, "calls": {}})["calls"][batch] = calls
        dist.barrier()
    return report
