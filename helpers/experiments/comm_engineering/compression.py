"""What compression costs and what it keeps: PyTorch's own hooks timed in this process (each
hook's call, to its future's completion, against ``allreduce_hook``'s), the same training under
each hook, and the fastest variant whose accuracy stays within a tolerance of the reference."""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.data import load_har
from helpers.dist.comm_hooks import (
    POWERSGD_START_ITER,
    CommHook,
    check_hook,
    hook_and_state,
    powersgd_start_iter,
)
from helpers.experiments.comm_engineering.variants import ONE_BUCKET_MB, UNTIMED_STEPS, Variant
from helpers.training import (
    RunResult,
    TrainConfig,
    run_trainings,
    torch_threads,
)
from helpers.training.config import total_steps
from helpers.training.model import make_mlp

# --------------------------------------------------------------------------- compression's compute


def time_hooks(
    hooks: Sequence[CommHook], matrix_rank: int = 1, repeats: int = 5,
    model: nn.Module | None = None,
) -> tuple[dict[CommHook, list[float]], dict[CommHook, object]]:
    """Seconds of each of PyTorch's hooks per call, from the call to its future's completion
    (PowerSGD's products run in the callbacks it chains), on ``repeats`` steps after
    ``UNTIMED_STEPS`` (DDP's rebuild; PowerSGD compresses from step 2), and each hook's state.
    DDP on one bucket, in this process alone in a Gloo group of one, so that each all-reduce
    is trivial; one thread; the hooks' steps interleaved, so that a burst of load hits all."""
    if dist.is_initialized():
        raise RuntimeError("time_hooks makes a process group of its own: call it outside one "
                           "(dist.destroy_process_group() first)")  # fmt: skip
    for hook in hooks:
        check_hook(hook, n_buckets=1)
    calls: dict[CommHook, list[float]] = {hook: [] for hook in hooks}
    states: dict[CommHook, object] = {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    models = []
    collecting = gc.isenabled()
    gc.disable()  # no collection on Gloo's threads while they run the hooks' callbacks
    try:
        for hook in hooks:
            torch.manual_seed(0)
            module = make_mlp() if model is None else copy.deepcopy(model)  # one per hook
            ddp = DDP(module, bucket_cap_mb=ONE_BUCKET_MB)
            fn, states[hook] = hook_and_state(hook, matrix_rank, POWERSGD_START_ITER)

            def timed(state, bucket, fn=fn, log=calls[hook]):  # noqa: ANN001, ANN202
                start = time.perf_counter()
                future = fn(state, bucket)  # PyTorch's hook, as DDP would call it
                future.wait()
                log.append(time.perf_counter() - start)
                return future

            ddp.register_comm_hook(states[hook], timed)
            models.append(ddp)
        x = torch.randn(32, next(models[0].parameters()).shape[1])
        with torch_threads(1):
            for _ in range(UNTIMED_STEPS + repeats):
                for ddp in models:
                    ddp(x).sum().backward()
    finally:
        dist.destroy_process_group()
        models.clear()  # DDP's reducers hold the group too
        ddp = None
        _keep(group)
        if collecting:
            gc.enable()
    return {hook: log[UNTIMED_STEPS:] for hook, log in calls.items()}, states


_KEPT: list[object] = []


def _keep(group: object) -> None:
    """Keep a destroyed Gloo group's last reference for the life of the process. PowerSGD's
    callbacks hold the group and finish on Gloo's own threads, after the future they complete is
    seen done; if one of them dropped the last reference, the group's destructor would join the
    thread it runs on, and the process would abort ("Resource deadlock avoided"; 1 run in 12 of
    the timing test did, before this). Kept, it costs a world-of-one group's two idle threads."""
    gc.collect()  # the DDP modules sit in reference cycles: free them here, not on a Gloo thread
    _KEPT.append(group)


def compression_seconds(
    hook: CommHook, matrix_rank: int = 1, repeats: int = 5, model: nn.Module | None = None
) -> float:
    """One worker's compute per step for a hook's compression: PyTorch's hook timed by
    ``time_hooks`` less ``allreduce_hook`` timed alike (the fastest of ``repeats`` each: the
    compute itself, without what other programs took from it). What is left is the hook's own
    work: fp16's casts, or PowerSGD's products, orthogonalisation, error feedback and copies,
    with its extra calls' dispatch. At least 0 (noise can reverse a tiny gap); 0 for
    ``ALLREDUCE``."""
    if hook is CommHook.ALLREDUCE:
        return 0.0
    calls, _ = time_hooks([CommHook.ALLREDUCE, hook], matrix_rank, repeats, model)
    return max(0.0, min(calls[hook]) - min(calls[CommHook.ALLREDUCE]))


# --------------------------------------------------------------------------- accuracy


def train_hooks(
    variants: Sequence[Variant], base: TrainConfig, world: int = 2, threads_per_worker: int = 1
) -> list[RunResult]:
    """The same training under each variant, in one launch, final weights returned; PowerSGD
    compresses after 10% of the training's steps, where PyTorch's docs suggest to start tuning
    (``comm_hooks.powersgd_start_iter``)."""
    n_samples = len(load_har(base.data, download=False).X_train)
    start = powersgd_start_iter(total_steps(base, n_samples))
    configs = [replace(v.config(base), return_weights=True, powersgd_start_iter=start)
               for v in variants]  # fmt: skip
    return run_trainings(world, configs, threads_per_worker)


def best_within_tolerance(
    table: pd.DataFrame,
    accuracy: dict[str, float],
    reference_accuracy: float,
    tolerance: float,
    global_batch: int = 256,
) -> pd.DataFrame:
    """The rows of ``speedup_table``'s table at ``global_batch`` whose variant's test accuracy
    (``accuracy``, by variant name; variants without one are left out) lies within
    ``tolerance`` of ``reference_accuracy``, fastest first, with their accuracy and its gap."""
    rows = table[(table["global_batch"] == global_batch) & table["variant"].isin(list(accuracy))]
    rows = rows.assign(accuracy=rows["variant"].map(accuracy))
    rows = rows.assign(accuracy_gap=(rows["accuracy"] - reference_accuracy).abs())
    kept = rows[rows["accuracy_gap"] <= tolerance + 1e-12]
    return kept.sort_values("speedup", ascending=False).reset_index(drop=True)
