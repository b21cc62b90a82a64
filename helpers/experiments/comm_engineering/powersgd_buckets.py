"""PowerSGD on Gloo: 2 processes, an MLP in DDP with powerSGD_hook, fail with several buckets and
train with one. Run: python -m helpers.experiments.comm_engineering.powersgd_buckets"""

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, DEADLINE_S = 20, 60.0  # a run not done by the deadline is stopped: a hang


def worker(rank: int, port: int, bucket_cap_mb: float | None) -> None:
    """Train STEPS steps; rank 0 prints whether the replicas ended identical."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(561, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 6))  # fmt: skip
    model = DDP(mlp, bucket_cap_mb=bucket_cap_mb)  # None: DDP's default, 2 buckets here
    state = powersgd.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    model.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        optimizer.zero_grad()  # each rank its own random batches
        x, y = torch.randn(128, 561, generator=data), torch.randint(6, (128,), generator=data)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    both = [torch.cat([p.detach().flatten() for p in mlp.parameters()]) for _ in range(2)]
    dist.all_gather(both, both[rank].clone())  # rank 0 checks that the replicas are identical
    if rank == 0:
        print(f"  trained {STEPS} steps; replicas identical: {torch.equal(*both)}", flush=True)
    dist.barrier()  # both done with Gloo before either tears it down
    dist.destroy_process_group()


def run(label: str, bucket_cap_mb: float | None, debug: str) -> None:
    """One launch of 2 workers; prints how it ended, a hang stopped at the deadline."""
    print(f"{label}, TORCH_DISTRIBUTED_DEBUG={debug}:", flush=True)
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug  # the workers inherit it
    with socket.socket() as s:  # a free port for this pair of processes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(worker, args=(port, bucket_cap_mb), nprocs=2, join=False)
    start = time.monotonic()
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() - start > DEADLINE_S:
                for p in ctx.processes:
                    p.kill()
                print(f"  failed: no step completed for {DEADLINE_S:.0f} s, a hang", flush=True)
                return
    except mp.ProcessExitedException as err:  # a crash: no Python traceback to show
        print(f"  failed: {err}", flush=True)


if __name__ == "__main__":
    run("one bucket (cap 25 MiB)", 25.0, "DETAIL")
    run("DDP's default buckets (2)", None, "OFF")
    run("one bucket (cap 25 MiB)", 25.0, "OFF")
