"""PowerSGD on Gloo: 2 processes, an MLP in DDP with powerSGD_hook, fail with several buckets and
train with one. Run: python -m helpers.experiments.comm_engineering.powersgd_buckets
(--no-detail leaves out the first launch, under TORCH_DISTRIBUTED_DEBUG=DETAIL)"""

import multiprocessing
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 20
# A launch is stopped as a hang when no step has completed on both ranks for STALL_S seconds, or,
# before the first step, START_S seconds after the launch (spawning, importing torch, joining the
# group: over 10 s at a load of 7 on 2 cores). A healthy step takes tens of milliseconds, the
# first three (DDP's first step, its bucket rebuild, PowerSGD's first compression) up to about a
# second at that load: STALL_S is ten times that. The healthy launch prints its slowest step.
# After the last step, the replicas' check and the teardown have START_S again (a CI machine under
# load once took over 10 s there, and a finished run was reported as a hang).
START_S, STALL_S = 60.0, 10.0
LONGEST_S = 3 * (2 * START_S + STEPS * STALL_S)  # the script's three launches, at the very most


def worker(rank: int, port: int, bucket_cap_mb: float | None, done) -> None:  # noqa: ANN001
    """Train STEPS steps, counting each completed one in ``done[rank]``; rank 0 prints whether
    the replicas ended identical, and its slowest step."""
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
    seconds = []
    for step in range(STEPS):
        start = time.perf_counter()
        optimizer.zero_grad()  # each rank its own random batches
        x, y = torch.randn(128, 561, generator=data), torch.randint(6, (128,), generator=data)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
        done[rank] = step + 1
    both = [torch.cat([p.detach().flatten() for p in mlp.parameters()]) for _ in range(2)]
    dist.all_gather(both, both[rank].clone())  # rank 0 checks that the replicas are identical
    if rank == 0:
        print(f"  trained {STEPS} steps; replicas identical: {torch.equal(*both)}", flush=True)
        print(f"  slowest step: {max(seconds) * 1e3:.0f} ms, median "
              f"{sorted(seconds)[STEPS // 2] * 1e3:.0f} ms", flush=True)
    dist.barrier()  # both done with Gloo before either tears it down
    dist.destroy_process_group()


def run(label: str, bucket_cap_mb: float | None, debug: str) -> None:
    """One launch of 2 workers; prints how it ended, a hang stopped as START_S and STALL_S say."""
    print(f"{label}, TORCH_DISTRIBUTED_DEBUG={debug}:", flush=True)
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug  # the workers inherit it
    with socket.socket() as s:  # a free port for this pair of processes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = multiprocessing.get_context("spawn").Array("i", 2)  # steps completed, per rank
    ctx = mp.start_processes(worker, args=(port, bucket_cap_mb, done), nprocs=2, join=False)
    steps, since, limit = 0, time.monotonic(), START_S
    try:
        while not ctx.join(timeout=0.2):
            if min(done[:]) > steps:  # a step completed on both ranks: the clock starts again
                steps, since = min(done[:]), time.monotonic()
                # after the last step, the check and the teardown get as long as the start
                limit = STALL_S if steps < STEPS else START_S
            elif time.monotonic() - since > limit:
                for p in ctx.processes:
                    p.kill()
                    p.join()
                what = (f"no step completed within {START_S:.0f} s of the launch" if steps == 0
                        else f"no step completed for {STALL_S:.0f} s after step {steps} of "
                        f"{STEPS}")  # fmt: skip
                print(f"  failed: {what}, a hang", flush=True)
                return
    except mp.ProcessExitedException as err:  # a crash: no Python traceback to show
        print(f"  failed: {err}", flush=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="PowerSGD on Gloo: 2 processes, several buckets "
                                     "and one")  # fmt: skip
    parser.add_argument("--no-detail", action="store_true",
                        help="leave out the launch under TORCH_DISTRIBUTED_DEBUG=DETAIL, which "
                        "crashes in torch 2.13's CPU build (notebook 11 shows it)")  # fmt: skip
    if not parser.parse_args().no_detail:
        run("one bucket (cap 25 MiB)", 25.0, "DETAIL")
    run("DDP's default buckets (2)", None, "OFF")
    run("one bucket (cap 25 MiB)", 25.0, "OFF")
