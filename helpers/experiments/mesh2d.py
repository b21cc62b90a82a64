"""Two kinds of parallelism at once (notebook 09, section 4): a 2-D mesh of workers, data-parallel
FSDP2 along one dimension and tensor parallelism along the other, as large trainings combine
them (tensor parallelism within a node, sharded data parallelism across nodes).

``mesh2d_worker`` builds the mesh with ``init_device_mesh(..., mesh_dim_names=("dp", "tp"))``,
splits every layer by the tensor-parallel plan within each row and shards the result with
``fully_shard`` along each column, and trains the few steps of ``split_training.Steps``; its
record is compared with one worker's."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from helpers.experiments.memory import state_bytes
from helpers.experiments.split_training import Steps
from helpers.experiments.tensor_parallel import megatron_plan, quiet_hooks, whole
from helpers.training.order import local_slice


def mesh2d_worker(rank: int, world_size: int, spec: Steps, dp: int = 2) -> dict:
    """``spec``'s steps on a ``dp`` x ``world_size / dp`` mesh: each row of ``tp`` workers holds
    one data-parallel replica split by ``megatron_plan``, sees its ``1/dp`` of every global batch,
    and FSDP2 shards each tensor-parallel shard again across the ``dp`` rows. Returns the record
    (gradients of the first step, losses, final weights), the placements of the first layer's
    weight and the bytes this rank holds."""
    from torch.distributed.fsdp import fully_shard

    if world_size % dp:
        raise ValueError(f"{world_size} workers do not make a mesh with {dp} rows")
    quiet_hooks()
    # FSDP2 warns that a tensor-parallel layer's output is a view, which an in-place op would
    # detach from its hooks: none follows here (the ReLUs are not in place)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    # DTensor warns that gathering a 2-D sharded tensor whole takes two all-gathers: done only
    # to compare the weights with one worker's
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    X, y = spec.data_tensors()
    mesh = init_device_mesh("cpu", (dp, world_size // dp), mesh_dim_names=("dp", "tp"))
    model = spec.model()
    model = parallelize_module(model, mesh["tp"], megatron_plan(model))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    row, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
    losses, grads = [], None
    for idx in spec.batches(len(X)):
        mine = local_slice(idx, row, dp)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[mine]), y[mine])
        loss.backward()
        if grads is None:
            grads = np.concatenate([whole(p.grad).double().numpy().ravel()
                                    for p in model.parameters()])  # fmt: skip
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp_group)  # equal slices: the mean of the rows' losses
        losses.append(total.item() / dp)
        optimizer.step()
    first = next(model.parameters())
    return {
        "grads": grads,
        "losses": np.asarray(losses),
        "weights": np.concatenate([whole(p).detach().double().numpy().ravel()
                                   for p in model.parameters()]),  # fmt: skip
        "mesh": f"{mesh.mesh.tolist()} {mesh.mesh_dim_names}",
        "first_weight": f"{tuple(first.placements)} local {tuple(first.to_local().shape)} "
                        f"of {tuple(first.shape)}",
        "held": state_bytes(model, optimizer),
    }
