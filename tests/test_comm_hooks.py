"""helpers.dist.comm_hooks refuses the bf16 hook exactly where DDP itself does: a property of the
PyTorch build, checked against DDP's own register_comm_hook in a real (one-process) Gloo group."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist.comm_hooks import CommHook, bf16_hook_supported, check_hook


@pytest.fixture
def one_process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_bf16_is_refused_exactly_where_ddp_refuses_it(one_process_group):
    ddp = DDP(torch.nn.Linear(4, 2))
    try:
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        accepted = True
    except TypeError as err:
        assert "BF16" in str(err)
        accepted = False
    assert bf16_hook_supported() == accepted
    if accepted:
        check_hook(CommHook.BF16, 1)
    else:
        with pytest.raises(ValueError, match="use CommHook.FP16"):
            check_hook(CommHook.BF16, 1)


def test_the_refusal_is_the_builds_not_the_backends():
    """On a build that refuses bf16, no backend name makes check_hook accept it (before, only
    "gloo" was refused, so an NCCL group on a CPU-only build would have passed the check)."""
    if bf16_hook_supported():
        pytest.skip("this build accepts the bf16 hook")
    for backend in ("gloo", "nccl", "xccl"):
        with pytest.raises(ValueError, match="this PyTorch build refuses bf16_compress_hook"):
            check_hook(CommHook.BF16, 1, backend=backend)
