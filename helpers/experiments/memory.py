"""What a worker holds: bytes of parameters, gradients and optimizer state read from its tensors
(under FSDP2, the local shards), the process's resident memory and its peak, and the ZeRO stages'
arithmetic of what sharding saves.

Peak resident memory (RSS) is read from the kernel: on Linux the high-water mark is reset just
before the model is built (``/proc/self/clear_refs``), so what the training adds is measured
exactly; elsewhere only the process's lifetime peak is available, and the growth above it is a
lower bound."""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from helpers.training.config import TrainConfig
from helpers.training.model import N_FEATURES, make_mlp
from helpers.training.wrap import wrap_fsdp2

MB = 1e6

def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this worker stores for ``tensor``: its local shard if it is a ``DTensor``."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()

def stored_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors`` (a ``DTensor``'s local shard), each storage
    counted once: what the allocator holds for them, a view's whole storage and any padding
    included, where ``local_bytes`` counts elements."""
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    storages = (t.untyped_storage() for t in local)
    return sum({s.data_ptr(): s.nbytes() for s in storages}.values())

def momentum_step_bytes(rank: int = 0, world_size: int = 1) -> dict[str, int]:
    """The reference MLP after one step of SGD with momentum, and the bytes of the storages this
    worker holds for its parameters, gradients and momentum (``stored_bytes``). Called in one
    process it stays whole, as on a DDP worker. Launched on several workers
    (``helpers.dist.launch``), FSDP2 shards it over them (every ``Linear`` a unit, then the
    model), and each reports its own shards: the stored bytes that ZeRO-3's arithmetic predicts."""
    torch.manual_seed(0)
    model = make_mlp()
    if world_size > 1:
        model = wrap_fsdp2(model, TrainConfig(sync="fsdp2"))  # the course's units
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, N_FEATURES)).sum().backward()
    optimizer.step()
    params = list(model.parameters())
    return {
        "parameters": stored_bytes(params),
        "gradients": stored_bytes(p.grad for p in params),
        "optimizer_state": stored_bytes(optimizer.state[p]["momentum_buffer"] for p in params),
    }

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
