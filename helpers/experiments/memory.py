"""What a worker holds: bytes of parameters, gradients and optimizer state read from its tensors
(under FSDP2, the local shards), the process's resident memory and its peak, and the ZeRO stages'
arithmetic of what sharding saves.

Peak resident memory (RSS) is read from the kernel: on Linux the high-water mark is reset just
before the model is built (``/proc/self/clear_refs``), so what the training adds is measured
exactly; elsewhere only the process's lifetime peak is available, and the growth above it is a
lower bound."""

from __future__ import annotations

import platform
import re
import resource
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from helpers.training.config import TrainConfig
from helpers.training.model import N_FEATURES, make_mlp
from helpers.training.wrap import make_optimizer, wrap_fsdp2

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

def step_bytes(
    rank: int = 0, world_size: int = 1, optimizer: str = "momentum", hidden: int = 1024,
    hidden_layers: int = 2,
) -> dict[str, int]:  # fmt: skip
    """An MLP (the reference one by default) after one step of ``optimizer``, and the bytes of
    the storages this worker holds for its parameters, gradients and optimizer state
    (``stored_bytes``). Called in one process it stays whole, as on a DDP worker. Launched on
    several workers (``helpers.dist.launch``), FSDP2 shards it over them (every ``Linear`` a
    unit, then the model), and each reports its own shards: PyTorch's record of what a ZeRO-3
    worker stores, padding included, to hold the arithmetic against."""
    config = _step_config(optimizer, hidden, hidden_layers)
    torch.manual_seed(0)
    model = make_mlp(hidden=hidden, hidden_layers=hidden_layers)
    if world_size > 1:
        model = wrap_fsdp2(model, config)  # the course's units
    return _after_one_step(model, config)

def unlaunched_step_bytes(world_size: int, optimizer: str = "momentum", hidden: int = 1024,
                          hidden_layers: int = 2) -> dict[str, int]:  # fmt: skip
    """``step_bytes`` of rank 0, which holds the largest shards, on ``world_size`` workers that
    are not launched: this process joins a fake process group as rank 0 (PyTorch's test
    backend, ``torch.testing._internal``: collectives send nothing, shapes are real), so FSDP2
    shards and pads as on real workers, in a second and without the cores they would need. The
    model is built on the meta device: its values are garbage, its bytes are right."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    if dist.is_initialized():
        raise RuntimeError("this process already is in a process group: call it outside one")
    config = _step_config(optimizer, hidden, hidden_layers)
    hook = sys.excepthook  # init_process_group wraps it for good: put back after
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        with torch.device("meta"):
            model = make_mlp(hidden=hidden, hidden_layers=hidden_layers)
        model = wrap_fsdp2(model, config)
        model.to_empty(device="cpu")  # this rank's shards, uninitialised
        return _after_one_step(model, config)
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook

def _step_config(optimizer: str, hidden: int, hidden_layers: int) -> TrainConfig:
    return TrainConfig(sync="fsdp2", optimizer=optimizer, lr=0.1, hidden=hidden,
                       hidden_layers=hidden_layers)  # fmt: skip

def _after_one_step(model: nn.Module, config: TrainConfig) -> dict[str, int]:
    optim = make_optimizer(model, config)
    model(torch.randn(8, N_FEATURES)).sum().backward()
    optim.step()
    params = list(model.parameters())
    return {
        "parameters": stored_bytes(params),
        "gradients": stored_bytes(p.grad for p in params),
        "optimizer_state": stored_bytes(
            v for p in params for v in optim.state[p].values() if isinstance(v, torch.Tensor)
        ),
    }

def momentum_step_bytes(rank: int = 0, world_size: int = 1) -> dict[str, int]:
    """``step_bytes`` of the reference MLP with SGD and momentum (notebook 08's exercise 1)."""
    return step_bytes(rank, world_size)

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

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

def huge_pages_mode(path: Path = THP) -> str | None:
    """The kernel's transparent huge pages setting, ``always``, ``madvise`` or ``never`` (the
    bracketed word of ``path``); None where there is none to read (not Linux)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen else None

def huge_pages_held(smaps: Path = Path("/proc/self/smaps_rollup")) -> int:
    """Bytes of this process's anonymous memory the kernel maps in transparent huge pages
    (``AnonHugePages``), 0 where it cannot be read."""
    try:
        for line in smaps.read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

def why_rss_not_comparable(workers: int, huge_pages_grown: int = 0,
                           thp: Path = THP) -> str | None:  # fmt: skip
    """None where the peak RSS can show what FSDP2 saves (notebook 08), else why not. It needs
    glibc (``MALLOC_MMAP_THRESHOLD_`` returns freed blocks at once), 2 workers, and memory in
    base pages: a transparent huge page (2 MiB) stays resident while any byte of it is in use,
    so the RSS need not fall when a buffer is freed. Hence THP ``always``, or a training that
    grew its workers' ``AnonHugePages`` (``huge_pages_grown``, bytes), rule it out."""
    if platform.libc_ver()[0] != "glibc":
        return "MALLOC_MMAP_THRESHOLD_ is glibc's setting, and this C library is not glibc"
    if workers < 2:
        return f"it needs 2 workers, and {workers} run here"
    if huge_pages_mode(thp) == "always":
        return (f"transparent huge pages are always on ({thp}): a freed buffer's 2 MiB pages "
                "can stay resident, so the RSS need not fall")  # fmt: skip
    if huge_pages_grown > 0:
        return (f"the training put {huge_pages_grown / MB:.0f} MB of its workers' memory in "
                "transparent huge pages (AnonHugePages): the RSS moves by 2 MiB pages, not by "
                "the buffers freed")  # fmt: skip
    return None

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
