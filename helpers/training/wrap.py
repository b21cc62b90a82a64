"""The model each worker trains: built from the seed, wrapped as the config's sync asks (DDP or
FSDP2), its optimizer made after wrapping, and the plain model recovered afterwards."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist import comm_hooks
from helpers.training.config import MOMENTUM, TrainConfig, make_model


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The configured optimizer over the model's parameters, whole or sharded: create it after
    wrapping, since FSDP2 replaces every parameter by its shard."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.lr)
    if config.optimizer == "momentum":
        return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=MOMENTUM)
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    raise ValueError(f"optimizer must be 'sgd', 'momentum' or 'adam', got {config.optimizer!r}")

def wrap_model(model: nn.Module, config: TrainConfig, comm_log: list | None = None) -> nn.Module:
    """Wrap a freshly built model as ``config.sync`` asks (``wrap_ddp``, ``wrap_fsdp2``), or
    leave it as it is ("none", "allreduce"). Inside a process group. Under DDP, bucket timings
    are appended to ``comm_log`` if given (notebook 07)."""
    if config.sync == "ddp":
        return wrap_ddp(model, config, comm_log)
    if config.sync == "fsdp2":
        return wrap_fsdp2(model, config)
    return model

def wrap_ddp(model: nn.Module, config: TrainConfig, comm_log: list | None = None) -> DDP:
    """DDP broadcasts rank 0's weights, then all-reduces the gradients in ``backward()``, in
    buckets of ``bucket_cap_mb`` (None: DDP's default), with the configured communication hook
    (none by default: DDP's own all-reduce; notebook 07)."""
    device = next(model.parameters()).device
    device_ids = None if device.type == "cpu" else [device]  # a GPU: the one it trains on
    ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)
    comm_hooks.register(
        ddp, config.comm_hook, config.powersgd_rank, comm_log, config.powersgd_start_iter
    )
    return ddp

def wrap_fsdp2(model: nn.Module, config: TrainConfig) -> nn.Module:
    """FSDP2 keeps a ``1/N`` shard of every parameter on each worker: every ``Linear`` becomes
    one unit whose parameters are all-gathered just before its forward (and again before its
    backward, unless ``reshard_after_forward=False`` keeps them), and whose gradients are
    reduce-scattered, so that each worker ends with the averaged gradient of its own shard only.
    Every rank must build the same initial weights (the same seed): FSDP2 shards them where they
    are, it broadcasts nothing."""
    # imported here: every worker would otherwise pay about a second to import FSDP
    from torch.distributed.fsdp import fully_shard

    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, reshard_after_forward=config.reshard_after_forward)
    return model

def build_model(
    config: TrainConfig, rank: int = 0, comm_log: list | None = None, device: str = "cpu"
) -> nn.Module:
    """This rank's model from the configured seed, on ``device``, wrapped as ``config.sync`` asks
    (``wrap_model``; under DDP with its bucket timings appended to ``comm_log`` if given)."""
    torch.manual_seed(config.seed + (rank if config.seed_per_rank else 0))
    if config.sync == "fsdp2":
        return build_sharded(config, device)
    return wrap_model(make_model(config).to(device), config, comm_log)

def build_sharded(config: TrainConfig, device: str = "cpu") -> nn.Module:
    """FSDP2's model without ever holding it whole: built on the meta device (shapes, no
    memory), sharded, given memory for this rank's shards only (``to_empty``), then filled one
    layer at a time with the weights ``make_model`` draws under the current seed, each rank
    keeping its own rows. Drawn whole a layer at a time, not by ``reset_parameters`` on the
    shards: on a CPU mesh DTensor's random operators do not keep the ranks' generators in step
    (``is_rng_supported_mesh``), and every shard would come out alike."""
    from torch.distributed.tensor import distribute_tensor

    with torch.device("meta"):
        model = make_model(config)
    if any(not isinstance(m, nn.Linear) and any(m.parameters(recurse=False))
           for m in model.modules()):  # fmt: skip
        raise ValueError("build_sharded draws the weights of Linear layers only")
    model = wrap_fsdp2(model, config)
    model.to_empty(device=device)
    with torch.no_grad():
        for layer in (m for m in model.modules() if isinstance(m, nn.Linear)):
            whole = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
            for shard, full in zip(layer.parameters(), whole.parameters(), strict=True):
                shard.copy_(distribute_tensor(full.to(shard.device), shard.device_mesh,
                                              shard.placements, src_data_rank=None))  # fmt: skip
    return model

def unwrapped(model: nn.Module, config: TrainConfig) -> nn.Module:
    """The plain model with whole weights: DDP's module, or, under FSDP2, a copy assembled from
    every rank's shards (all-gathers: every rank must call it)."""
    if isinstance(model, DDP):
        return model.module
    if config.sync == "fsdp2":
        from torch.distributed.tensor import DTensor

        whole = {
            name: value.full_tensor() if isinstance(value, DTensor) else value
            for name, value in model.state_dict().items()
        }
        with torch.random.fork_rng(devices=[]):  # its initial weights are overwritten anyway
            plain = make_model(config)
        plain.load_state_dict(whole)
        return plain
    return model
