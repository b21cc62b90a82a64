"""Small worker functions for the launcher tests (spawned workers import them from here)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import torch
import torch.distributed as dist


def rank_and_sum(rank: int, world: int, scale: float = 1.0) -> tuple[int, int, float, int]:
    """Return rank, world, the all-reduced sum of (rank + 1) * scale, and the thread count."""
    t = torch.tensor([(rank + 1) * scale])
    dist.all_reduce(t)
    return rank, world, float(t.item()), torch.get_num_threads()


def fail_on_rank(rank: int, world: int, bad_rank: int) -> int:
    """Every rank waits in a collective except ``bad_rank``, which raises first."""
    if rank == bad_rank:
        raise ValueError(f"bad input on rank {rank}")
    dist.all_reduce(torch.ones(1))
    return rank


def skip_collective(rank: int, world: int, marker: str) -> int:
    """Rank 0 waits for a collective that rank 1 never joins: a hang without a timeout. Rank 1
    writes its pid to ``marker``, sleeps 60 s, then writes "finished" there."""
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        with open(marker, "w") as f:
            f.write("finished")
    return rank


def die_hard(rank: int, world: int) -> int:
    """Rank 1 exits without reporting anything, as a crash would."""
    if rank == 1:
        os._exit(3)
    dist.barrier()
    return rank


def sleep_and_report_pid(rank: int, world: int, pid_dir: str, seconds: float) -> int:
    """Write this worker's pid to a file, then sleep: lets a test interrupt a running launch."""
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return rank


def return_tensor(rank: int, world: int) -> torch.Tensor:
    """Return a tensor: it must survive the worker's exit."""
    return torch.full((1000,), float(rank))


def listening_during_run(rank: int, world: int) -> list[str]:
    """Rank 0 lists, while the group is up, what every worker listens on and what listens on
    every port a worker is connected to (the caller's store among them): only this run's
    sockets, not the rest of the caller's."""
    from helpers.dist.loopback import listening_addresses, socket_inodes, tcp_sockets

    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    found = []
    if rank == 0:
        ours = socket_inodes(pids)
        table = tcp_sockets()
        ports = {remote.rsplit(":", 1)[1] for state, _, remote, inode in table
                 if state == "01" and inode in ours}  # fmt: skip
        found = listening_addresses(pids) + [
            local for state, local, _, _ in table
            if state == "0A" and local.rsplit(":", 1)[1] in ports
        ]  # fmt: skip
    dist.barrier()  # every worker's sockets stay open until rank 0 has looked
    return sorted(set(found))


def fail_everywhere(rank: int, world: int) -> int:
    """Every rank fails with its own error, once all have started."""
    dist.barrier()
    raise ValueError(f"bad input on rank {rank}")


def return_unpicklable(rank: int, world: int) -> object:
    """Return something pickle refuses: a lock."""
    return threading.Lock()


def _refuse_to_load() -> None:
    raise RuntimeError("this value cannot be rebuilt here")


class Unloadable:
    """Pickles fine, fails when the caller unpickles it."""

    def __reduce__(self):  # noqa: ANN204
        return (_refuse_to_load, ())


def return_unloadable(rank: int, world: int) -> object:
    return Unloadable()


def stubborn_sleeper(rank: int, world: int, pid_dir: str, seconds: float) -> int:
    """Like sleep_and_report_pid, but shrugs off SIGTERM (noting that it came), so that stopping
    it takes the launcher's whole grace period, then a kill."""

    def noted(signum: int, frame: object) -> None:
        with open(os.path.join(pid_dir, f"{rank}.term"), "w") as f:
            f.write("term")

    signal.signal(signal.SIGTERM, noted)
    return sleep_and_report_pid(rank, world, pid_dir, seconds)


def ddp_communication(rank: int, world: int, caps: list, steps: int, rank_r: int) -> dict:
    """For notebook 07's tests: DDP's own record of its buckets for each bucket cap; the bucket
    all-reduces per run with and without no_sync(); what PowerSGD says it compressed (both read
    by ``pytorch_records``, as the notebook's timings read them)."""
    from helpers.dist.comm_hooks import CommHook, register
    from helpers.experiments.comm_engineering.timing import pytorch_records
    from helpers.training import TrainConfig, build_model, forward_backward
    from helpers.training.model import make_mlp

    X = torch.randn(64, 561, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 6, (64,), generator=torch.Generator().manual_seed(rank))
    idx = torch.arange(64)

    def train(model, config, n=steps):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(n):
            opt.zero_grad()
            forward_backward(model, X, y, idx, config)
            opt.step()

    rebuilt = {}
    for cap in caps:
        config = TrainConfig(bucket_cap_mb=cap)
        model = build_model(config, rank)
        train(model, config)  # DDP rebuilds its buckets after the first step, records later
        rebuilt[str(cap)] = pytorch_records(model)["rebuilt_bucket_sizes"]
    calls = {}
    for every in (False, True):
        config = TrainConfig(accumulation_steps=4, sync_every_micro_batch=every)
        log: list = []
        model = build_model(config, rank, comm_log=log)
        train(model, config)
        calls[every] = len(log)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(make_mlp(), bucket_cap_mb=7)
    state = register(model, CommHook.POWER_SGD, rank_r)
    train(model, TrainConfig())
    records = pytorch_records(model)  # read from the model: the state registered on it
    assert records["comm_hook"] == "powerSGD_hook"
    powersgd = [state.compression_stats()[0], records["numel_before"], records["numel_after"]]
    return {"rebuilt": rebuilt, "calls": calls, "powersgd": powersgd}


def fp16_and_plain_gradients(rank: int, world: int) -> dict:
    """For notebook 07's tests: one backward of the same model on this rank's own data, three
    ways: alone (this rank's gradient), under DDP's plain all-reduce, under DDP with the fp16
    hook. Returns each as one flat float64 tensor."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from helpers.dist.comm_hooks import CommHook, register
    from helpers.training.model import make_mlp

    X = torch.randn(64, 561, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 6, (64,), generator=torch.Generator().manual_seed(100 + rank))

    def gradient(hook: CommHook | None) -> torch.Tensor:
        torch.manual_seed(0)  # the same weights on every rank and for every variant
        model = make_mlp()
        if hook is not None:
            model = DDP(model)
            register(model, hook)
        F.cross_entropy(model(X), y).backward()
        return torch.cat([p.grad.ravel() for p in model.parameters()]).double()

    return {
        "local": gradient(None),
        "plain": gradient(CommHook.ALLREDUCE),
        "fp16": gradient(CommHook.FP16),
    }


def resume_from_own_folder(rank: int, world: int, base: str) -> int:
    """Each rank resumes from a folder of its own (``base/rank<N>``), as nodes without a shared
    file system would: returns the step it resumed from."""
    from helpers.data import load_har
    from helpers.dist.checkpoint import Checkpointer, CheckpointSpec
    from helpers.training import TrainConfig, run_identity
    from helpers.training.loop import train_steps
    from helpers.training.model import make_mlp

    # test_checkpoint's training (its CONFIG), so that rank 0 finds that run's checkpoint
    config = TrainConfig(global_batch=2048, epochs=2, data="recordings", record_loss=True,
                         hidden=256)  # fmt: skip
    har = load_har("recordings")
    torch.manual_seed(config.seed)
    saver = Checkpointer(CheckpointSpec(f"{base}/rank{rank}", 2), run_identity(config), rank)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    train_steps(make_mlp(hidden=config.hidden), X, y, config, rank, world, checkpoint=saver)
    return saver.resumed_from


WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}.get(os.uname().machine)  # write(2)'s number


def _exit_during_a_write_of(nbytes: int) -> None:
    """Exit this process (code 3) once another of its threads is inside a write(2) of at least
    ``nbytes`` (read from /proc/self/task/*/syscall, Linux): a crash half-way through a large
    write, whichever thread makes it."""
    me = str(threading.get_native_id())
    while True:
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/syscall") as f:
                    fields = f.read().split()
            except OSError:  # the thread has ended
                continue
            if task != me and fields[:1] == [str(WRITE_SYSCALL)] and int(fields[3], 16) >= nbytes:
                time.sleep(0.05)  # let some of it through
                os._exit(3)
        time.sleep(0.001)


def exit_mid_send(rank: int, world: int, nbytes: int) -> object:
    """Rank 1 returns ``nbytes`` of zeros and dies while it writes them to the caller; rank 0
    returns its rank."""
    if rank == 1:
        threading.Thread(target=_exit_during_a_write_of, args=(nbytes,), daemon=True).start()
        return np.zeros(nbytes // 8)
    return rank


def fail_with_a_broken_teardown(rank: int, world: int, how: str) -> int:
    """Rank 1 raises its own error, in a process where tearing the group down would abort
    (``how="abort"``, as Gloo's std::terminate does) or raise (``how="raise"``)."""

    def broken_teardown(*args, **kwargs) -> None:
        if how == "abort":
            os.abort()
        raise RuntimeError("the teardown failed")

    dist.destroy_process_group = broken_teardown
    if rank == 1:
        raise ValueError("rank 1's own error")
    dist.barrier()
    return rank


def try_to_download(rank: int, world: int) -> str:
    """Ask for UCI HAR where it is not there: a download. Returns the error it ends in."""
    from helpers.data import HARDataError, load_har

    try:
        load_har("uci")
    except HARDataError as err:
        return str(err)
    return "UCI HAR was there"


def save_and_restore_losses(rank: int, world: int, root: str) -> list[float]:
    """Save a checkpoint after step 1 with losses that differ by rank, restore it into zeros and
    return what came back."""
    from helpers.dist.checkpoint import Checkpointer, CheckpointSpec
    from helpers.training.model import make_mlp

    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    saver = Checkpointer(CheckpointSpec(root, every=1), {"run": 1}, rank)
    assert saver.restore(model, optimizer, torch.zeros(3), steps_per_epoch=1) == 0  # a first start
    saver.after_step(model, optimizer, torch.full((3,), rank + 1.0), 1, 1, total_steps=1)
    losses = torch.zeros(3)
    assert saver.restore(model, optimizer, losses, steps_per_epoch=1) == 1
    return losses.tolist()


def build_sharded_weights(rank: int, world: int) -> dict:
    """build_model under FSDP2 (the meta device, then each rank's shards): what each rank
    holds, and the whole weights gathered back."""
    from helpers.training import TrainConfig
    from helpers.training.wrap import build_model

    model = build_model(TrainConfig(sync="fsdp2"), rank)
    held = sum(p.to_local().numel() for p in model.parameters())
    whole = [p.detach().full_tensor() for p in model.parameters()]
    return {"held": held, "whole": whole}
