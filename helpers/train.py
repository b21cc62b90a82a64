"""The training as PyTorch's own launcher runs it: ``python -m helpers.train`` under torchrun.

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 \\
        -m helpers.train --global-batch 2048 --epochs 40

Every worker reads its rank and the world size from the variables torchrun sets (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), joins the process group (NCCL
on CUDA GPUs, Gloo on CPUs) and runs ``helpers.training.train_worker``, the same code the
notebooks' launcher runs; rank 0 prints the same table as ``python -m helpers.reproduce``. The
same command runs across machines (``--nnodes 2 --node-rank 0|1``), under Slurm and under
Kubernetes (``cluster/``). With ``--checkpoint-dir`` it saves every ``--checkpoint-every`` steps
and resumes from the latest checkpoint, so that ``torchrun --max-restarts 1`` survives a killed
worker. Without torchrun it runs one worker.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.data import HARDataError, load_har
from helpers.dist.checkpoint import CheckpointError, CheckpointSpec, Fault
from helpers.dist.cores import CORES_ENV, default_threads_per_worker, plan_world_sizes
from helpers.dist.launch import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    gloo_interface_notice,
    loopback_interface,
)
from helpers.reproduce import (
    EXPERIMENT_1,
    OneLineParser,
    Setting,
    add_run_options,
    check_run_options,
    check_writable,
    print_table,
    write_report,
)
from helpers.training import TrainConfig, summarise, train_worker, validate
from helpers.training.measure import machine_facts

LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
)


@dataclass(frozen=True)
class WorkerEnv:
    """Where this worker stands, as torchrun tells it through the environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int  # torchrun's GROUP_RANK: which node (agent) this worker belongs to
    master_addr: str
    master_port: int
    restart_count: int  # how often torchrun has restarted the group
    under_torchrun: bool

    @classmethod
    def from_environ(cls) -> WorkerEnv:
        """Read torchrun's variables; without them (plain ``python -m``), a world of one."""
        e = os.environ
        if "RANK" not in e:
            return cls(0, 0, 1, 1, 0, "127.0.0.1", 0, 0, False)
        try:
            return cls(
                rank=int(e["RANK"]),
                local_rank=int(e.get("LOCAL_RANK", 0)),
                world_size=int(e["WORLD_SIZE"]),
                local_world_size=int(e.get("LOCAL_WORLD_SIZE", e["WORLD_SIZE"])),
                node_rank=int(e.get("GROUP_RANK", 0)),
                master_addr=e["MASTER_ADDR"],
                master_port=int(e["MASTER_PORT"]),
                restart_count=int(e.get("TORCHELASTIC_RESTART_COUNT", 0)),
                under_torchrun=True,
            )
        except (KeyError, ValueError) as err:
            raise ValueError(
                f"RANK is set but the rest of torchrun's variables are not usable ({err}): start "
                "the workers with torchrun, or unset RANK to run one worker"
            ) from None

    @property
    def nodes(self) -> int:
        return self.world_size // self.local_world_size


def device_for(choice: str, local_rank: int) -> str:
    """The device this worker trains on: its own GPU (``LOCAL_RANK``) where CUDA is there."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no CUDA GPU: use --device cpu")
        return f"cuda:{local_rank}"
    return "cpu"


def backend_for(device: str) -> str:
    """NCCL between GPUs, Gloo between CPUs."""
    return "nccl" if device.startswith("cuda") else "gloo"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m helpers.train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(p)
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): each worker's GPU if CUDA is there, else the CPU",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help="save checkpoints here and resume from the latest one (every rank must "
        "see the same folder)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        metavar="N",
        help="steps between checkpoints (default: %(default)s; the last step is always saved)",
    )
    p.add_argument(
        "--inject-kill",
        type=_fault,
        metavar="RANK:STEP[:save]",
        help="fault drill: that rank kills itself with SIGKILL after that step (or, "
        "with :save, in the middle of saving it), on the first attempt only",
    )
    args = check_run_options(p, p.parse_args(argv))
    if not args.global_batch:
        args.global_batch, args.epochs = [[b] for b in EXPERIMENT_1[0]]
    if len(args.global_batch) > 1 or len(args.epochs) > 1:
        p.error("one run per launch: give one --global-batch and one --epochs")
    if args.checkpoint_every < 1:
        p.error(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
    fault = args.inject_kill
    if fault and not args.checkpoint_dir:
        p.error("--inject-kill needs --checkpoint-dir: without checkpoints there is no resuming")
    if fault and fault.during_save and fault.step % args.checkpoint_every:
        p.error(
            f"--inject-kill {fault}: no checkpoint is saved at step {fault.step}; choose a "
            f"multiple of --checkpoint-every {args.checkpoint_every}"
        )
    return args


def _fault(text: str) -> Fault:
    try:
        return Fault.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def rerun_command(args: argparse.Namespace, env: WorkerEnv, source: str, threads: int) -> str:
    """The command that repeats this run: torchrun's shape and every choice written out (the
    fault drill left out). Across nodes, each node runs it with its own ``--node-rank``."""
    if not env.under_torchrun:
        words = ["python", "-m", "helpers.train"]
    elif env.nodes == 1:
        # --standalone: a rendezvous on this machine, at a free port
        words = ["torchrun", "--standalone", "--nproc-per-node", str(env.local_world_size)]
        words += ["-m", "helpers.train"]
    else:
        words = [
            "torchrun",
            "--nnodes",
            str(env.nodes),
            "--nproc-per-node",
            str(env.local_world_size),
            "--node-rank",
            "NODE_RANK",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "HOST:PORT",
            "-m",
            "helpers.train",
        ]
    words += ["--global-batch", str(args.global_batch[0]), "--epochs", str(args.epochs[0])]
    words += ["--lr", repr(args.lr), "--seed", str(args.seed), "--data", source]
    words += ["--threads-per-worker", str(threads)]
    if args.device != "auto":
        words += ["--device", args.device]
    if args.oversubscribe:
        words.append("--oversubscribe")
    if args.checkpoint_dir:
        words += ["--checkpoint-dir", str(args.checkpoint_dir)]
        words += ["--checkpoint-every", str(args.checkpoint_every)]
    cores = os.environ.get(CORES_ENV)
    command = shlex.join(words)
    return command if cores is None else f"{CORES_ENV}={shlex.quote(cores)} {command}"


def _join(env: WorkerEnv, backend: str) -> None:
    """Join the process group. Under torchrun, through the agent's store, with keys of this
    attempt only: torch 2.13's agent keeps one store across restarts (TORCHELASTIC_USE_AGENT_STORE),
    and a restarted group that read the killed group's Gloo addresses from it would wait for
    peers that are gone (``Gloo connectFullMesh failed ... Connect timeout``). The attempt is
    counted in the store, by each rank: across nodes ``TORCHELASTIC_RESTART_COUNT`` differs, since
    an agent whose own workers were healthy restarts them for the new round without counting a
    restart (a node's killed worker, under Slurm: tests/test_slurm.py)."""
    timeout = timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT)
    if not env.under_torchrun:
        store = dist.HashStore()
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        agent = dist.TCPStore(
            env.master_addr, env.master_port, env.world_size, is_master=False, timeout=timeout
        )
        attempt = agent.add(f"helpers.train/starts/rank_{env.rank}", 1)  # 1, 2, ... each rank
        store = dist.PrefixStore(f"helpers.train/attempt_{attempt}", agent)
    else:
        dist.init_process_group(backend, timeout=timeout)  # env://, rank 0 hosts the store
        return
    dist.init_process_group(
        backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
    )


def recovery_text(report: dict, env: WorkerEnv, fault: Fault | None) -> str:
    """What checkpointing did in this run, in one line."""
    steps = ", ".join(map(str, report["checkpoints_saved"]))
    saved = f"saved checkpoints at steps {steps}" if steps else "saved no checkpoint"
    if env.restart_count == 0:
        line = f"this run {saved}"
        return line + (
            f"; resumed from step {report['resumed_from']}" if report["resumed_from"] else ""
        )
    line = (
        f"torchrun restarted the group {env.restart_count} time(s); it resumed from step "
        f"{report['resumed_from']} and {saved}"
    )
    if fault is not None:
        when = "while saving step" if fault.during_save else "after step"
        redone = fault.step - report["resumed_from"]
        line += f"; rank {fault.rank} was killed {when} {fault.step}: {redone} step(s) redone"
    return line


def main(argv: list[str] | None = None) -> int:
    started_at = time.time()
    args = parse_args(argv)
    try:
        env = WorkerEnv.from_environ()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    lead = env.rank == 0
    threads = args.threads_per_worker or default_threads_per_worker()
    try:
        device = device_for(args.device, env.local_rank)
        plan = plan_world_sizes([env.local_world_size], threads, oversubscribe=args.oversubscribe)
        if not plan[0].runs:
            raise ValueError(f"{plan[0].reason.replace('skipped: ', '')} on this node")
        if args.json and lead:
            check_writable(args.json)
        data = load_har(args.data)
        config = TrainConfig(
            global_batch=args.global_batch[0],
            epochs=args.epochs[0],
            lr=args.lr,
            seed=args.seed,
            data=data.source,
            show_progress=lead and sys.stderr.isatty(),
        )
        validate(config, env.world_size, len(data.y_train))
        if args.inject_kill and args.inject_kill.rank >= env.world_size:
            raise ValueError(
                f"--inject-kill {args.inject_kill}: there is no rank "
                f"{args.inject_kill.rank} among {env.world_size} workers"
            )
    except (ValueError, HARDataError) as err:
        if lead:
            print(f"error: {err}", file=sys.stderr)
        return 2
    spec = None
    if args.checkpoint_dir:
        spec = CheckpointSpec(
            str(args.checkpoint_dir), args.checkpoint_every, fault=args.inject_kill
        )
    torch.set_num_threads(threads)
    if env.master_addr in LOOPBACK_ADDRESSES:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    note = gloo_interface_notice()
    if note and lead:
        print(note, file=sys.stderr)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # NCCL's collectives, gather_object too, use this GPU
    _join(env, backend_for(device))
    try:
        report = train_worker(env.rank, env.world_size, config, checkpoint=spec, device=device)
        report["env"] = {k: os.environ.get(k) for k in TORCHRUN_VARIABLES}
        report["env"]["host"] = socket.gethostname()  # which machine (a Slurm node) it ran on
        reports = [None] * env.world_size if lead else None
        dist.gather_object(report, reports, dst=0)
        dist.barrier()  # nothing in flight on Gloo's threads when the group is torn down
    except CheckpointError as err:
        if lead:
            print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()
    if not lead:
        return 0
    return _print_results(
        args, env, data, config, threads, plan[0].oversubscribed, reports, started_at
    )


def _print_results(args, env, data, config, threads, oversubscribed, reports, started_at) -> int:
    facts = machine_facts()
    run = summarise(reports, config, threads, started_at, oversubscribed)
    rerun = rerun_command(args, env, data.source, threads)
    print(data.banner)
    print(f"machine: {facts['cores']} cores, {facts['cpu']}; torch {facts['torch']}")
    print(
        f"workers: {env.world_size} on {env.nodes} node(s), {threads} thread(s) each, "
        f"{backend_for(device_for(args.device, 0))}"
    )
    print(f"rerun: {rerun}")
    setting = Setting(
        "torchrun" if env.under_torchrun else "One worker", config.global_batch, config.epochs
    )
    print_table(setting, [run], [], data.banner, args.lr)
    if args.checkpoint_dir:
        print(recovery_text(reports[0], env, args.inject_kill))
    if args.json:
        record = {
            "experiment": setting.title,
            **run.to_record(),
            "digest": reports[0]["digest"],
            "restarts": env.restart_count,
            "resumed_from": reports[0]["resumed_from"],
            "checkpoints_saved": reports[0]["checkpoints_saved"],
            "ranks": [r["env"] for r in reports],
        }
        write_report(args.json, facts, data, threads, rerun, [record])
    return 0


if __name__ == "__main__":
    sys.exit(main())
