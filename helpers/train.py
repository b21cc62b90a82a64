"""The training as PyTorch's own launcher runs it: ``python -m helpers.train`` under torchrun
(``DESCRIPTION``, its ``--help``, says how). The same command runs across machines (``--nnodes 2
--node-rank 0|1``), under Slurm and under Kubernetes (``cluster/``); workers use NCCL on CUDA GPUs
and Gloo on CPUs, and run ``helpers.training.train_worker``, as the notebooks' launcher does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.cli import (
    REFERENCE,
    OneLineParser,
    Setting,
    add_run_options,
    check_run_options,
    check_writable,
    print_table,
    rerun_command,
    threads_for,
    write_report,
)
from helpers.data import HARData, HARDataError, load_har
from helpers.dist.checkpoint import CheckpointError, CheckpointSpec, Fault
from helpers.dist.cores import WorldPlan, plan_world_sizes
from helpers.dist.launch import DEFAULT_COLLECTIVE_TIMEOUT
from helpers.dist.loopback import (
    LOOPBACK,
    gloo_interface_notice,
    loopback_interface,
    loopback_store,
)
from helpers.training import TrainConfig, summarise, train_worker, validate
from helpers.training.measure import machine_facts

DESCRIPTION = """\
The course's training as PyTorch's own launcher runs it: python -m helpers.train, started by
torchrun on one node or several, for example

    torchrun --standalone --nproc-per-node 2 -m helpers.train --global-batch 2048 --epochs 40

Every worker reads its rank from torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and runs the notebooks' training; rank 0 prints the same table as
python -m helpers.reproduce. With --checkpoint-dir it saves every --checkpoint-every steps and
resumes from the latest checkpoint, so that torchrun --max-restarts 1 survives a killed worker.
Without torchrun it runs one worker."""

LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")  # fmt: skip


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
        description=DESCRIPTION,
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
        args.global_batch, args.epochs = [[b] for b in REFERENCE]
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


def launcher_words(env: WorkerEnv) -> list[str]:
    """How this run was started, as a reader would type it (across nodes, each node runs it with
    its own ``--node-rank`` and the rendezvous host's address)."""
    if not env.under_torchrun:
        return ["python", "-m", "helpers.train"]
    if env.nodes == 1:  # --standalone: a rendezvous on this machine, at a free port
        return f"torchrun --standalone --nproc-per-node {env.local_world_size} -m".split() + [
            "helpers.train"
        ]
    return (
        f"torchrun --nnodes {env.nodes} --nproc-per-node {env.local_world_size} --node-rank "
        "NODE_RANK --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m helpers.train"
    ).split()


def own_options(args: argparse.Namespace) -> list[str]:
    """This command line's options beyond a run's (the fault drill left out)."""
    words = ["--device", args.device] if args.device != "auto" else []
    if args.checkpoint_dir:
        words += ["--checkpoint-dir", str(args.checkpoint_dir)]
        words += ["--checkpoint-every", str(args.checkpoint_every)]
    return words


def _join(env: WorkerEnv, backend: str) -> None:
    """Join the process group. Under torchrun with the agent's store shared (torch's default),
    with keys of this attempt only (pytorch/pytorch#135712), each rank counting its own starts
    (``TORCHELASTIC_RESTART_COUNT`` differs across nodes). That breaks if a rank dies before it
    counts (in ``prepare``) or a node joins later (``--nnodes MIN:MAX``): the prefixes differ,
    and the group waits out its timeout. Hence ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in the
    course's scripts: each attempt's rank 0 hosts a fresh store (on 127.0.0.1 if MASTER_ADDR is)."""
    timeout = timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT)
    if not env.under_torchrun:
        store = dist.HashStore()
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        agent = dist.TCPStore(
            env.master_addr, env.master_port, env.world_size, is_master=False, timeout=timeout
        )
        attempt = agent.add(f"helpers.train/starts/rank_{env.rank}", 1)  # 1, 2, ... each rank
        store = dist.PrefixStore(f"helpers.train/attempt_{attempt}", agent)
    elif env.master_addr in (LOOPBACK, "localhost") and env.rank == 0:
        store = loopback_store(env.world_size, timeout.total_seconds(), port=env.master_port)
    elif env.master_addr in (LOOPBACK, "localhost"):
        store = dist.TCPStore(
            LOOPBACK, env.master_port, env.world_size, is_master=False, timeout=timeout
        )
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


@dataclass
class Prepared:
    """A run checked and ready to start: everything ``main`` decides before joining the group."""

    device: str
    plan: WorldPlan
    threads: int
    data: HARData
    config: TrainConfig
    checkpoint: CheckpointSpec | None


def prepare(args: argparse.Namespace, env: WorkerEnv) -> Prepared:
    """Check the run before any worker joins the group: every failure is a ValueError or a
    HARDataError in one line."""
    lead = env.rank == 0
    threads = threads_for(args)
    device = device_for(args.device, env.local_rank)
    plan = plan_world_sizes([env.local_world_size], threads, oversubscribe=args.oversubscribe)[0]
    if not plan.runs:
        raise ValueError(f"{plan.reason.replace('skipped: ', '')} on this node")
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
    fault = args.inject_kill
    if fault and fault.rank >= env.world_size:
        raise ValueError(
            f"--inject-kill {fault}: there is no rank {fault.rank} among {env.world_size} workers"
        )
    spec = None
    if args.checkpoint_dir:
        spec = CheckpointSpec(str(args.checkpoint_dir), args.checkpoint_every, fault=fault)
    return Prepared(device, plan, threads, data, config, spec)


def _set_up(env: WorkerEnv, run: Prepared) -> None:
    """This process's threads, Gloo's interface (loopback when the store is local) and GPU."""
    torch.set_num_threads(run.threads)
    if env.master_addr in LOOPBACK_ADDRESSES:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    note = gloo_interface_notice()
    if note and env.rank == 0:
        print(note, file=sys.stderr)
    if run.device.startswith("cuda"):
        torch.cuda.set_device(run.device)  # NCCL's collectives, gather_object too, use this GPU


def _train(env: WorkerEnv, run: Prepared) -> list[dict] | None:
    """Train, and gather every rank's report on rank 0 (None on the others)."""
    report = train_worker(
        env.rank, env.world_size, run.config, checkpoint=run.checkpoint, device=run.device
    )
    report["env"] = {k: os.environ.get(k) for k in TORCHRUN_VARIABLES}
    report["env"]["host"] = socket.gethostname()  # which machine (a Slurm node) it ran on
    reports = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    dist.barrier()  # nothing in flight on Gloo's threads when the group is torn down
    return reports


def _leave() -> None:
    """Tear the group down after everything is reported: an error here must not hide one."""
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    started_at = time.time()
    args = parse_args(argv)
    lead = os.environ.get("RANK", "0") == "0"
    try:
        env = WorkerEnv.from_environ()
        run = prepare(args, env)
    except (ValueError, HARDataError) as err:
        if lead:
            print(f"error: {err}", file=sys.stderr)
        return 2
    _set_up(env, run)
    _join(env, backend_for(run.device))
    failure = None
    try:
        reports = _train(env, run)
    except CheckpointError as err:  # every rank raises it alike, at the same step
        failure = str(err)
    # Out here the traceback, and the DDP model it holds, is freed before _leave: a reducer left
    # holding the group destroys it with the GIL held, a hang (pytorch/pytorch#56297; seen here).
    if failure is not None:
        if lead:
            print(f"error: {failure}", file=sys.stderr)
        _leave()
        return 2
    # Any other error propagates with its traceback, the group left as it is: destroying it
    # while a peer may still be in a collective can abort this process before the report.
    _leave()
    if not lead:
        return 0
    return _print_results(args, env, run, reports, started_at)


def _print_results(
    args: argparse.Namespace, env: WorkerEnv, run: Prepared, reports: list[dict], started_at: float
) -> int:
    facts = machine_facts()
    data, config, threads = run.data, run.config, run.threads
    summary = summarise(reports, config, threads, started_at, run.plan.oversubscribed)
    rerun = rerun_command(launcher_words(env), args, data.source, threads, own_options(args))
    print(data.banner)
    print(f"machine: {facts['cores']} cores, {facts['cpu']}; torch {facts['torch']}")
    print(
        f"workers: {env.world_size} on {env.nodes} node(s), {threads} thread(s) each, "
        f"{backend_for(run.device)}"
    )
    print(f"rerun: {rerun}")
    setting = Setting(
        "torchrun" if env.under_torchrun else "One worker", config.global_batch, config.epochs
    )
    print_table(setting, [summary], [], data.banner, args.lr)
    if args.checkpoint_dir:
        print(recovery_text(reports[0], env, args.inject_kill))
    if args.json:
        record = {
            "experiment": setting.title,
            **summary.to_record(),
            "digest": reports[0]["digest"],
            "restarts": env.restart_count,
            "resumed_from": reports[0]["resumed_from"],
            "checkpoints_saved": reports[0]["checkpoints_saved"],
            "ranks": [r["env"] for r in reports],
        }
        write_report(args.json, facts, data, threads, rerun, [record])
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush(), sys.stderr.flush()
    # No interpreter teardown: there, under load, 2 of 50 two-worker runs aborted on rank 1
    os._exit(code)  # ("terminate called without an active exception", no Python frame left)
