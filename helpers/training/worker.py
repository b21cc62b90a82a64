"""One worker's share of the training, inside a process group: its data, its model, the loop,
and the report it sends back (``helpers.dist.launch`` or torchrun started it)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

from helpers.data import HARData, load_har
from helpers.dist.checkpoint import Checkpointer, CheckpointSpec
from helpers.dist.collectives import mean_over_ranks
from helpers.training.config import TrainConfig, run_identity, total_steps, validate
from helpers.training.loop import train_steps
from helpers.training.metrics import (
    accuracy_on_test,
    final_weights,
    weights_checksum,
    weights_digest,
)
from helpers.training.wrap import build_model, unwrapped


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run a block with ``threads`` intra-op threads in this process, then restore the count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Probe:
    """Measurements taken inside a worker around the training (``helpers.experiments.sharding``'s
    ``ShardingProbe``): ``start`` before the model is built, ``ready`` once it is built and
    wrapped, ``after_step`` after every step, ``finish`` after the last, whose dict comes back in
    ``RunResult.probes``. Each does nothing here, so that a probe defines only the moments it
    measures."""

    def start(self, rank: int, world_size: int) -> None:
        pass

    def ready(self, model: nn.Module) -> None:
        pass

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return {}


def train_worker(
    rank: int,
    world_size: int,
    config: TrainConfig,
    probe: Probe | None = None,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> dict:
    """One worker's share of the training. Runs inside a process group (``helpers.dist.launch``, or
    torchrun through ``helpers.train``). With ``checkpoint``, resumes from its latest checkpoint
    and saves every ``checkpoint.every`` steps. ``device``: "cpu", or "cuda:N" under NCCL."""
    return train_worker_many(rank, world_size, [config], probe, checkpoint, device)[0]

def launch_data_source(configs: Sequence[TrainConfig]) -> str | None:
    """The one data source of trainings launched together: a mix is refused."""
    if len({c.data for c in configs}) > 1:
        raise ValueError("the trainings of one launch must use the same data source")
    return configs[0].data

def worker_data(
    configs: Sequence[TrainConfig], world_size: int, device: str = "cpu"
) -> tuple[HARData, torch.Tensor, torch.Tensor]:
    """Inside a worker: the training data the configs name, its split as tensors on ``device``,
    every config checked against it (``validate``) before anything trains."""
    data = load_har(launch_data_source(configs), download=False)
    X, y = torch.from_numpy(data.X_train).to(device), torch.from_numpy(data.y_train).to(device)
    for config in configs:
        validate(config, world_size, len(X))
    return data, X, y

def train_worker_many(
    rank: int,
    world_size: int,
    configs: Sequence[TrainConfig],
    probe: Probe | None = None,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> list[dict]:
    """One worker's share of several trainings, one after the other, in one process group: the
    start-up (processes, imports, data) is paid once. Every config must name the same data."""
    if checkpoint is not None and len(configs) > 1:
        raise ValueError("a checkpoint folder holds one training: launch the others without it")
    data, X, y = worker_data(configs, world_size, device)
    for config in configs:
        if config.record_accuracy and device != "cpu":
            raise ValueError("record_accuracy evaluates on the CPU: train on the CPU to record it")
    reports = []
    for config in configs:  # each with its own threads where it asks for them
        with torch_threads(config.threads) if config.threads else nullcontext():
            reports.append(_train_one(rank, world_size, config, data, X, y, probe, checkpoint,
                                      device))  # fmt: skip
    return reports

def _train_one(
    rank: int,
    world_size: int,
    config: TrainConfig,
    data: HARData,
    X: torch.Tensor,
    y: torch.Tensor,
    probe: Probe | None = None,
    checkpoint: CheckpointSpec | None = None,
    device: str = "cpu",
) -> dict:
    if probe is not None:
        probe.start(rank, world_size)
    model = build_model(config, rank, device=device)
    if probe is not None:
        probe.ready(model)
    saver = Checkpointer(checkpoint, run_identity(config), rank) if checkpoint else None
    dist.barrier()  # start the clock when every worker is ready
    ready_at = time.time()
    evaluate = accuracy_on_test(data) if config.record_accuracy else None
    after_step = probe.after_step if probe is not None else None
    loop = train_steps(model, X, y, config, rank, world_size, evaluate, after_step, saver)
    seconds = time.perf_counter() - loop.clock_start - loop.eval_seconds
    losses, epoch_accuracies = loop.losses, loop.epoch_accuracies
    probed = probe.finish(model, loop.optimizer) if probe is not None else None

    if config.record_loss and config.sync != "none":
        losses = mean_over_ranks(losses)  # equal slices: the global batch's loss
    net = unwrapped(model, config).cpu()
    return _report(
        net,
        data,
        config,
        rank=rank,
        seconds=seconds,
        ready_at=ready_at,
        steps=total_steps(config, len(X)),
        losses=losses.tolist(),
        epoch_accuracies=epoch_accuracies,
        probe=probed,
        resumed_from=saver.resumed_from if saver else 0,
        checkpoints_saved=saver.saved if saver else [],
    )

def _report(net: nn.Module, data: HARData, config: TrainConfig, **fields) -> dict:
    return {
        **fields,
        "checksum": weights_checksum(net),
        "digest": weights_digest(net),
        "accuracy": accuracy_on_test(data)(net),
        "data_source": data.source,
        "weights": final_weights(net) if config.return_weights else None,
    }
