"""Beyond the notebook launcher: ``python -m helpers.train`` started by torchrun, on one node or
several, here or under a cluster's scheduler.

``run_torchrun`` starts torchrun as a reader would in a terminal (one torchrun per node, each
node here a process group of its own on this machine) and reads rank 0's ``--json`` report.
``scheduler_commands`` reads the Slurm batch script and the Kubernetes PyTorchJob manifest kept
in ``cluster/``, for checking that they run the same entry point with the same options.

Security: torchrun's rendezvous store (a ``TCPStore``) and Gloo's connections carry no
authentication and no encryption. Run across machines on a trusted network only. In torch 2.13
the store listens on every interface of the node that hosts it, whatever address
``--rdzv-endpoint`` names (``listening_addresses`` shows it); only Gloo's sockets follow
``GLOO_SOCKET_IFNAME``, which ``helpers.train`` sets to loopback when the master is local.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from helpers.dist.loopback import LOOPBACK

REPO = Path(__file__).resolve().parent.parent
SLURM_SCRIPT = REPO / "cluster" / "slurm" / "train.sbatch"
PYTORCHJOB = REPO / "cluster" / "kubernetes" / "pytorchjob.yaml"
ENTRY = ["-m", "helpers.train"]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on now (another program may take it before torchrun does:
    good enough on one machine, where the only other users are this course's runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_argv(
    train_args: list[str],
    nproc_per_node: int,
    endpoint: str,
    nnodes: int = 1,
    node_rank: int = 0,
    max_restarts: int = 0,
    local_addr: str | None = LOOPBACK,
) -> list[str]:
    """The torchrun command line for one node: c10d rendezvous at ``endpoint`` (HOST:PORT)."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--max-restarts",
        str(max_restarts),
    ]
    if local_addr:
        argv += ["--local-addr", local_addr]
    if nnodes > 1:  # node 0 hosts the rendezvous store: no guessing from host names
        argv += ["--rdzv-conf", f"is_host={int(node_rank == 0)}"]
    return [*argv, *ENTRY, *train_args]


def shown(argv: list[str]) -> str:
    """A torchrun command line as a reader would type it: ``torchrun``, not this Python's
    ``-m torch.distributed.run``, a loopback port written ``PORT``, no ``--json`` file."""
    words = list(argv)
    if words[1:3] == ["-m", "torch.distributed.run"]:
        words[:3] = ["torchrun"]
    if "--json" in words:
        del words[words.index("--json") : words.index("--json") + 2]
    return re.sub(rf"{re.escape(LOOPBACK)}:\d+", f"{LOOPBACK}:PORT", shlex.join(words))


@dataclass
class TorchrunRun:
    """What one launch of ``helpers.train`` under torchrun printed and reported."""

    commands: list[list[str]]  # each node's torchrun command line
    returncodes: list[int]  # one torchrun per node
    stdout: str  # node 0's: rank 0 prints the results
    stderr: list[str]  # every node's
    report: dict | None  # rank 0's --json report, None if the run failed

    @property
    def run(self) -> dict:
        if self.report is None:
            raise RuntimeError(
                f"torchrun failed (exit codes {self.returncodes}): "
                f"{self.stderr[0].strip().splitlines()[-1:]}"
            )
        return self.report["runs"][0]

    def lines(self, *words: str) -> list[str]:
        """Node 0's stderr lines that contain any of ``words`` (torchrun logs there)."""
        return [line for line in self.stderr[0].splitlines() if any(w in line for w in words)]


def run_torchrun(
    train_args: list[str],
    nproc_per_node: int = 2,
    nnodes: int = 1,
    max_restarts: int = 0,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    prefixes: list[list[str]] | None = None,
    endpoint: str | None = None,
    local_addrs: list[str] | None = None,
) -> TorchrunRun:
    """Run ``torchrun ... -m helpers.train TRAIN_ARGS --json FILE`` on ``nnodes`` nodes of
    ``nproc_per_node`` workers, all on this machine, and return what it printed and reported.

    ``prefixes``: a command to put before each node's torchrun (``ip netns exec ns0``),
    ``endpoint`` then the rendezvous address they reach (default: loopback, a free port), and
    ``local_addrs`` each node's own address, which its workers' peers connect to."""
    endpoint = endpoint or f"{LOOPBACK}:{free_port()}"
    local_addrs = local_addrs or [LOOPBACK] * nnodes
    env = {**os.environ, **(env or {})}
    with tempfile.TemporaryDirectory(prefix="torchrun-") as tmp:
        report_path = Path(tmp) / "report.json"
        procs, commands = [], []
        for node in range(nnodes):
            # every node gets --json: the rendezvous, not --node-rank, decides which node holds
            # global rank 0, and only that rank writes the report and prints the results
            args = [*train_args, "--json", str(report_path)]
            argv = torchrun_argv(
                args, nproc_per_node, endpoint, nnodes, node, max_restarts, local_addrs[node]
            )
            prefix = prefixes[node] if prefixes else []
            commands.append([*prefix, *argv])
            procs.append(
                subprocess.Popen(
                    [*prefix, *argv],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            )
        outputs = []
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=timeout))
        except BaseException:  # a timeout, or Ctrl-C: stop every node and its workers
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
            raise
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    lead_stdout = next((out for out, _ in outputs if out.strip()), outputs[0][0])
    return TorchrunRun(
        commands, [p.returncode for p in procs], lead_stdout, [err for _, err in outputs], report
    )


def train_args_of(argv: list[str]) -> list[str]:
    """The options after ``-m helpers.train`` in a command line."""
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ENTRY:
            return argv[i + 2 :]
    raise ValueError(f"no `-m helpers.train` in {shlex.join(argv)}")


def scheduler_commands() -> dict[str, list[str]]:
    """The torchrun command each scheduler file runs, as a list of words: ``slurm`` from the
    batch script's ``srun`` line, ``kubernetes`` from the PyTorchJob's worker container."""
    return {
        "slurm": _slurm_command(SLURM_SCRIPT.read_text()),
        "kubernetes": _pytorchjob_command(yaml.safe_load(PYTORCHJOB.read_text())),
    }


def _slurm_command(script: str) -> list[str]:
    joined = script.replace("\\\n", " ")  # continuation lines
    lines = [line.strip() for line in joined.splitlines()]
    runs = [line for line in lines if line.startswith("srun ")]
    if len(runs) != 1:
        raise ValueError(f"the batch script should have one srun line, found {len(runs)}")
    words = shlex.split(runs[0])
    return words[words.index("torchrun") :]


def _pytorchjob_command(job: dict) -> list[str]:
    if job.get("kind") != "PyTorchJob":
        raise ValueError(f"expected kind PyTorchJob, got {job.get('kind')}")
    specs = job["spec"]["pytorchReplicaSpecs"]
    commands = []
    for role in specs.values():
        (container,) = role["template"]["spec"]["containers"]
        commands.append([*container.get("command", []), *container.get("args", [])])
    if any(c != commands[0] for c in commands):
        raise ValueError("every replica type should run the same command")
    return commands[0]
