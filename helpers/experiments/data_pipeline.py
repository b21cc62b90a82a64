"""Before adding workers, profile one: does its step wait for its data?

``WindowFeatures`` computes each window's 561 features from the raw recordings when the training
asks for it, with the course's own code (``helpers.data.features``, which builds the cache for
every window at once), as a pipeline that decodes, augments or tokenises each sample does.
``profiled_steps`` trains on any iterable of batches with every step's regions recorded by
``torch.profiler`` (data wait, forward, backward, optimizer). A ``PipelineRun`` names one way to
feed the same training: features on the fly or cached, DataLoader worker processes or none;
``run_here`` runs it in this process, ``run_workers`` on N DDP workers, each computing its own
slice's features. Every run counts the cores it keeps busy (``busy_processes``): one that asks
for more than the cores is refused, or, when asked for, run and flagged as oversubscribed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset, Sampler

from helpers.data import features
from helpers.data.hapt_pickle import find_pickle
from helpers.data.har import resolve_root, where
from helpers.data.recordings import RECORDINGS_BANNER, load_arrays
from helpers.data.windows import read_experiments
from helpers.dist.cores import available_cores
from helpers.dist.launch import launch
from helpers.training import (
    TrainConfig,
    build_model,
    local_slice,
    make_optimizer,
    steps_per_epoch,
    torch_threads,
    unwrapped,
    weights_checksum,
    weights_digest,
    worker_order,
)

REGIONS = ("data wait", "forward", "backward", "optimizer")  # one step, in order
ON_THE_FLY, CACHED = "on the fly", "cached"


# --------------------------------------------------------------------------- the data


class WindowFeatures(Dataset):
    """The recordings' windows of one split, each item's 561 features computed when asked.

    The cache (``helpers.data.recordings``) says which windows the split holds (recording and
    start) and each feature's range for the scaling. The filters run over each whole recording
    once per process, the first time an item needs them: a causal filter needs the recording's
    past, and the cached features were filtered so. Each item then cuts its 128-sample window
    and computes its 561 features, equal to the cache's (``X_cached``) for the same window.
    """

    def __init__(self, split: str = "train", root: str | Path | None = None) -> None:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        root = resolve_root(root)
        arrays = load_arrays(root)
        self.split, self.banner = split, RECORDINGS_BANNER.format(where=where(root))
        self.experiment, self.start = arrays[f"experiment_{split}"], arrays[f"start_{split}"]
        self.y, self.X_cached = arrays[f"y_{split}"], arrays[f"X_{split}"]
        self.lo, self.hi = arrays["lo"], arrays["hi"]
        self._signals: dict[int, dict[str, np.ndarray]] | None = None

    def __len__(self) -> int:
        return len(self.y)

    def signals(self) -> dict[int, dict[str, np.ndarray]]:
        """The filtered signals of every recording the split uses, made once in this process
        (about 3 s: reading the recordings, then filtering them)."""
        if self._signals is None:
            recordings = read_experiments(find_pickle())
            self._signals = {
                int(i): features.body_signals(recordings[i].acc, recordings[i].gyro)
                for i in np.unique(self.experiment)
            }
        return self._signals

    def window(self, i: int) -> np.ndarray:
        """Window ``i``'s 561 scaled features (float32), computed now."""
        signals = self.signals()[int(self.experiment[i])]
        cut = {name: features.cut_windows(x, self.start[i : i + 1]) for name, x in signals.items()}
        raw = np.column_stack([values for _, values in features.window_columns(cut)])
        return features.minmax_scale(raw, self.lo, self.hi).astype(np.float32)[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.window(i)), torch.tensor(self.y[i])

    def __getstate__(self) -> dict:
        # a spawned loader process filters its own copy rather than receive 200 MB of signals
        return {**self.__dict__, "_signals": None}


class SliceSampler(Sampler[list[int]]):
    """This rank's slice of each global batch in the course's order (``helpers.training.order``),
    for a DataLoader's ``batch_sampler``: the samples ``train_steps`` takes at every step."""

    def __init__(self, n: int, global_batch: int, steps: int, rank: int = 0, world: int = 1):
        if global_batch % world or not 0 < global_batch <= n or steps < 1:
            raise ValueError(
                f"global batch {global_batch} must divide among {world} workers and fit in the "
                f"{n} samples, and steps ({steps}) must be at least 1"
            )
        self.n, self.global_batch, self.steps, self.rank, self.world = (
            n, global_batch, steps, rank, world
        )  # fmt: skip

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        per_epoch, b, order = steps_per_epoch(self.n, self.global_batch), self.global_batch, None
        for step in range(self.steps):
            epoch, i = divmod(step, per_epoch)
            if order is None or i == 0:
                order = worker_order(self.n, epoch, self.rank)
            yield local_slice(order[i * b : (i + 1) * b], self.rank, self.world).tolist()


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class PipelineRun:
    """One way to feed the same training (SGD from ``torch.manual_seed(0)``, the course's order)."""

    features: str = ON_THE_FLY  # or CACHED: read from the cache's array
    loader_workers: int = 0  # DataLoader processes computing batches (0: the training process)
    global_batch: int = 32
    steps: int = 5
    lr: float = 0.05
    threads: int = 1  # intra-op threads of each training process
    prefetch_factor: int = 2  # batches each loader process keeps ready ahead of the training

    def label(self, world: int) -> str:
        who, each = (f"{world} DDP workers", " each") if world > 1 else ("1 worker", "")
        n = self.loader_workers
        loaders = f" + {n} loader process{'es' if n > 1 else ''}{each}" if n else ""
        return f"{who}, {self.features}{loaders}"


def busy_processes(run: PipelineRun, world: int) -> int:
    """Cores the run keeps busy: every worker's threads, and every loader process, which
    computes features whenever the training is data-bound (cores spent on data count)."""
    return world * (run.threads + run.loader_workers)


def check_cores(
    run: PipelineRun, world: int, cores: int | None = None, oversubscribe: bool = False
) -> bool:
    """Whether the run oversubscribes the cores; refused with a one-line error unless
    ``oversubscribe``, since its timings would then measure contention."""
    cores = available_cores() if cores is None else cores
    busy = busy_processes(run, world)
    if busy > cores and not oversubscribe:
        raise ValueError(
            f"{run.label(world)} keeps {busy} processes busy on {cores} cores: pass "
            "oversubscribe=True to measure the contention anyway (the run is then flagged)"
        )
    return busy > cores


def batches(
    run: PipelineRun, data: WindowFeatures, rank: int = 0, world: int = 1
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches for the run: a DataLoader over the on-the-fly features (its
    processes, if any, start when it is first iterated), or the cached array indexed."""
    sampler = SliceSampler(len(data), run.global_batch, run.steps, rank, world)
    if run.features == CACHED:
        X, y = torch.from_numpy(data.X_cached), torch.from_numpy(data.y)
        return ((X[idx], y[idx]) for idx in map(torch.tensor, sampler))
    if run.features != ON_THE_FLY:
        raise ValueError(f"features must be {ON_THE_FLY!r} or {CACHED!r}, got {run.features!r}")
    extra = {"prefetch_factor": run.prefetch_factor} if run.loader_workers else {}
    if run.loader_workers and sys.platform == "linux":
        # fork: a loader process shares the filtered signals. A launched worker would otherwise
        # spawn it (its start method), and it would read and filter the recordings again.
        extra["multiprocessing_context"] = "fork"
    return DataLoader(data, batch_sampler=sampler, num_workers=run.loader_workers, **extra)


def profiled_steps(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, feed: Iterable, steps: int
) -> dict:
    """Train ``steps`` steps on ``feed``'s batches, each step's regions recorded by
    ``torch.profiler``. The clock starts before the first batch is asked for, so a
    DataLoader's start-up is counted (in the first data wait), as every epoch pays it. Returns
    seconds (wall), steps and ``regions``: each region's seconds summed over the steps, with how
    many times it was seen."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # no timestamped start/stop lines on stderr
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started, it = time.perf_counter(), None
        for _ in range(steps):
            with record_function("data wait"):  # the first: a DataLoader's processes start too
                it = iter(feed) if it is None else it
                x, y = next(it)
            with record_function("forward"):
                loss = F.cross_entropy(model(x), y)
            with record_function("backward"):  # under DDP, the all-reduce too
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
        seconds = time.perf_counter() - started
    del it  # a DataLoader's processes stop here, off the clock
    events = [e for e in prof.events() if e.name in REGIONS]
    regions = {
        name: {
            "seconds": sum(e.time_range.elapsed_us() for e in events if e.name == name) / 1e6,
            "count": sum(e.name == name for e in events),
        }
        for name in REGIONS
    }
    return {"seconds": seconds, "steps": steps, "regions": regions}


@contextmanager
def may_start_processes() -> Iterator[None]:
    """Let a launcher's worker start DataLoader processes. Its workers are daemonic, so that
    they die with the notebook, and a daemonic process may not start children; a DataLoader's
    processes watch their parent and exit with it, so the flag is lifted while they start."""
    me = mp.current_process()
    daemonic = me._config.get("daemon", False)
    me._config["daemon"] = False  # no public setter once a process runs
    try:
        yield
    finally:
        me._config["daemon"] = daemonic


def train_run(run: PipelineRun, data: WindowFeatures, rank: int = 0, world: int = 1) -> dict:
    """One rank's share of the run: the course's model and SGD (wrapped in DDP for more than one
    worker), trained on ``batches`` under ``profiled_steps``; returns its timings and weights'
    checksum and digest."""
    sync = "ddp" if world > 1 else "none"
    config = TrainConfig(global_batch=run.global_batch, lr=run.lr, sync=sync)
    model = build_model(config, rank)
    optimizer = make_optimizer(model, config)
    if world > 1:
        dist.barrier()  # every worker built and ready: start the clocks together
    with may_start_processes():
        timed = profiled_steps(model, optimizer, batches(run, data, rank, world), run.steps)
    net = unwrapped(model, config)
    return {**timed, "checksum": weights_checksum(net), "digest": weights_digest(net)}


# --------------------------------------------------------------------------- runs


def _record(run: PipelineRun, world: int, per_rank: list[dict], oversubscribed: bool) -> dict:
    first = per_rank[0]
    return {
        "label": run.label(world),
        "world": world,
        "features": run.features,
        "loader_workers": run.loader_workers,
        "threads": run.threads,
        "global_batch": run.global_batch,
        "steps": run.steps,
        "busy_processes": busy_processes(run, world),
        "oversubscribed": oversubscribed,
        "seconds": max(r["seconds"] for r in per_rank),  # the slowest worker's
        "regions": first["regions"],  # rank 0's
        "checksums": [r["checksum"] for r in per_rank],
        "digest": first["digest"],
        "replicas_identical": len({r["digest"] for r in per_rank}) == 1,
    }


def run_here(
    runs: Sequence[PipelineRun],
    data: WindowFeatures | None = None,
    oversubscribe: bool = False,
) -> list[dict]:
    """Each run on one worker: this process, with the run's threads."""
    flags = [check_cores(run, 1, oversubscribe=oversubscribe) for run in runs]
    data = WindowFeatures() if data is None else data
    records = []
    for run, over in zip(runs, flags, strict=True):
        with torch_threads(run.threads):
            records.append(_record(run, 1, [train_run(run, data)], over))
    return records


def pipeline_worker(rank: int, world: int, runs: Sequence[PipelineRun]) -> list[dict]:
    """Inside a launched worker: the dataset (its recordings read and filtered once), then every
    run in turn, this rank computing its own slice's features."""
    data = WindowFeatures()
    if any(run.features == ON_THE_FLY for run in runs):
        data.signals()  # before the clock: start-up, as loading the data is for every run
    return [train_run(run, data, rank, world) for run in runs]


def run_workers(runs: Sequence[PipelineRun], world: int, oversubscribe: bool = False) -> list[dict]:
    """Every run on ``world`` DDP workers, one launch (the start-up paid once)."""
    if len({run.threads for run in runs}) != 1:
        raise ValueError("the runs of one launch must use the same threads per worker")
    flags = [check_cores(run, world, oversubscribe=oversubscribe) for run in runs]
    per_rank = launch(pipeline_worker, world, list(runs), threads_per_worker=runs[0].threads)
    return [
        _record(run, world, [reports[i] for reports in per_rank], over)
        for i, (run, over) in enumerate(zip(runs, flags, strict=True))
    ]


# --------------------------------------------------------------------------- tables


def pipeline_table(records: Sequence[dict], cores: int | None = None) -> pd.DataFrame:
    """One row per run: its cores, time per step, samples per second, speed-up over the first
    run, and milliseconds per step in each region (``other``: the rest of the step, Python and
    the profiler's own bookkeeping), with the data wait's share of the step."""
    cores = available_cores() if cores is None else cores
    rows = []
    for r in records:
        per_step = {name: 1e3 * r["regions"][name]["seconds"] / r["steps"] for name in REGIONS}
        step_ms = 1e3 * r["seconds"] / r["steps"]
        rows.append(
            {
                "run": r["label"],
                "world": r["world"],
                "features": r["features"],
                "loader_workers": r["loader_workers"],
                "global_batch": r["global_batch"],
                "busy": f"{r['busy_processes']} on {cores}",
                "oversubscribed": r["oversubscribed"],
                "step_ms": step_ms,
                "samples_per_s": r["global_batch"] * r["steps"] / r["seconds"],
                **{f"{name} ms": ms for name, ms in per_step.items()},
                "other ms": max(0.0, step_ms - sum(per_step.values())),
                "data wait share": per_step["data wait"] / step_ms,
            }
        )
    table = pd.DataFrame(rows)
    return table.assign(speedup=table["samples_per_s"] / table["samples_per_s"].iloc[0])


def pipeline_text(table: pd.DataFrame) -> str:
    """The runs for reading: time per step, rate, speed-up, data wait's share, and a flag on
    every run that kept more processes busy than there are cores."""
    shown = table.assign(flag=np.where(table["oversubscribed"], "OVERSUBSCRIBED", ""))[
        ["run", "busy", "step_ms", "samples_per_s", "speedup", "data wait share", "flag"]
    ]
    return shown.to_string(
        index=False,
        formatters={
            "step_ms": "{:,.1f}".format,
            "samples_per_s": "{:,.0f}".format,
            "speedup": "{:.2f}x".format,
            "data wait share": "{:.0%}".format,
        },
    )


def data_bound_text(table: pd.DataFrame) -> str:
    """What N DDP workers computing features on the fly bought, set beside one worker whose N
    loader processes compute them (as many cores on features, no second replica) and beside the
    cache. Speed-ups are over the table's first run; a run missing from the table is left out."""

    def pick(world: int, features: str, loaders: int) -> pd.Series | None:
        rows = table[(table["world"] == world) & (table["features"] == features)
                     & (table["loader_workers"] == loaders)]  # fmt: skip
        return rows.iloc[0] if len(rows) else None

    lines = []
    for world in sorted(w for w in table["world"].unique() if w > 1):
        ddp = pick(world, ON_THE_FLY, 0)
        if ddp is None:
            continue
        lines.append(
            f"{ddp['run']}: {ddp['speedup']:.2f}x, the data wait still "
            f"{ddp['data wait share']:.0%} of the step"
        )
        for other in (pick(1, ON_THE_FLY, world), pick(1, CACHED, 0)):
            if other is not None:
                lines.append(f"  against {other['run']} ({other['busy']} busy): "
                             f"{other['speedup']:.2f}x")  # fmt: skip
    return "\n".join(lines)
