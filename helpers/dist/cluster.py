"""Beyond the notebook launcher: ``python -m helpers.train`` started by torchrun, on one node or
several, here or under a cluster's scheduler.

``run_torchrun`` starts torchrun as a reader would in a terminal (one torchrun per node, each
node here a process group of its own on this machine) and reads rank 0's ``--json`` report.
``scheduler_commands`` reads the Slurm batch script and the Kubernetes manifests (a Kubeflow
PyTorchJob and a Trainer v2 TrainJob) kept in the checkout's ``cluster/``, for checking that they
run the same entry point with the same options.

What listens, and where. torchrun's rendezvous store and the workers' store are ``TCPStore``s,
and neither they nor Gloo's connections carry authentication or encryption; object collectives
(``gather_object``) unpickle what they receive. In torch 2.13 a ``TCPStore`` listens on every
interface of its host, whatever address ``--rdzv-endpoint`` or ``MASTER_ADDR`` names, so a
torchrun typed by hand is reachable from the network: the rendezvous store on the node that
hosts it, and the workers' store that rank 0's agent hosts beside it. For runs on this machine,
``run_torchrun`` keeps all of it on loopback:

- it hosts the rendezvous store itself, bound to 127.0.0.1 (``helpers.dist.loopback``), and
  passes ``--rdzv-conf is_host=0`` to every node, so that no agent hosts another;
- it sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, so that no agent hosts the workers' store
  either: rank 0's worker hosts it, and ``helpers.train`` binds it to 127.0.0.1 itself;
- ``--local-addr 127.0.0.1`` makes that store's address loopback, and ``helpers.train`` points
  Gloo at the loopback interface (``GLOO_SOCKET_IFNAME``) when it is.

``tests/test_train.py`` checks, while such a run is up, that nothing it opened listens beyond
loopback. On a real cluster the stores and Gloo must be reachable from the other nodes, so they
listen on the cluster's network (the stores on every interface of their hosts): run there only
on a trusted, private network (a cluster's own, pods kept apart by a NetworkPolicy), never on
one that others share.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from helpers.dist.loopback import LOOPBACK, loopback_store
from helpers.dist.processes import TimedOut, run_together

# the folder above helpers/, wherever this module sits in the package: the checkout, when it runs
# from one (an installed copy has no cluster/ there; pass scheduler_commands the checkout's root)
REPO = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]
SCHEDULER_FILES = {
    "slurm": Path("cluster", "slurm", "train.sbatch"),
    "pytorchjob": Path("cluster", "kubernetes", "pytorchjob.yaml"),
    "trainjob": Path("cluster", "kubernetes", "trainjob.yaml"),
}
ENTRY = ["-m", "helpers.train"]
NO_AGENT_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"  # rank 0's worker hosts the workers' store


def torchrun_argv(
    train_args: list[str],
    nproc_per_node: int,
    endpoint: str,
    nnodes: int = 1,
    node_rank: int = 0,
    max_restarts: int = 0,
    local_addr: str | None = LOOPBACK,
    store_hosted_by_caller: bool = False,
) -> list[str]:
    """The torchrun command line for one node: c10d rendezvous at ``endpoint`` (HOST:PORT).
    The rendezvous store is hosted by whoever started the nodes (``store_hosted_by_caller``:
    no node hosts it), else by node 0."""
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
    if store_hosted_by_caller:
        argv += ["--rdzv-conf", "is_host=0"]
    elif nnodes > 1:  # node 0 hosts the rendezvous store: no guessing from host names
        argv += ["--rdzv-conf", f"is_host={int(node_rank == 0)}"]
    return [*argv, *ENTRY, *train_args]


_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # an environment variable's NAME=VALUE


def shown(argv: list[str]) -> str:
    """A torchrun command line as a reader would type it: ``torchrun``, not this Python's
    ``-m torch.distributed.run``, ``NAME=VALUE`` without ``env`` (one or a chain of them in
    front), a loopback port written ``PORT``, no ``--json`` file."""
    words = list(argv)
    lead = 0  # the settings in front: env, NAME=VALUE, env, NAME=VALUE ...
    while lead < len(words) and (words[lead] == "env" or _SETTING.match(words[lead])):
        lead += 1
    words = [w for w in words[:lead] if w != "env"] + words[lead:]
    for i in range(len(words) - 2):
        if words[i : i + 3] == [sys.executable, "-m", "torch.distributed.run"]:
            words[i : i + 3] = ["torchrun"]
            break
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
    Without an ``endpoint`` everything listens on loopback only (the module's docstring says
    how). ``timeout`` bounds the whole run; past it every node and its workers are killed.

    ``prefixes``: a command to put before each node's torchrun (``ip netns exec ns0``),
    ``endpoint`` then the rendezvous address they reach, hosted by node 0, and ``local_addrs``
    each node's own address, which its workers' peers connect to."""
    store = None if endpoint else loopback_store(None, timeout, multi_tenant=True)
    endpoint = endpoint or f"{LOOPBACK}:{store.port}"
    local_addrs = local_addrs or [LOOPBACK] * nnodes
    with tempfile.TemporaryDirectory(prefix="torchrun-") as tmp:
        report_path = Path(tmp) / "report.json"
        commands = []
        for node in range(nnodes):
            # every node gets --json: the rendezvous, not --node-rank, decides which node holds
            # global rank 0, and only that rank writes the report and prints the results
            args = [*train_args, "--json", str(report_path)]
            argv = torchrun_argv(
                args, nproc_per_node, endpoint, nnodes, node, max_restarts, local_addrs[node],
                store_hosted_by_caller=store is not None,
            )  # fmt: skip
            setting = ["env", NO_AGENT_STORE] if store is not None else []
            commands.append([*(prefixes[node] if prefixes else []), *setting, *argv])
        try:
            # each agent keeps its logs in a folder of its own under TMPDIR (torchelastic_...),
            # which it leaves behind: here, in this run's folder, removed with it
            done = run_together(
                commands, timeout, env={**os.environ, "TMPDIR": tmp, **(env or {})}
            )
        except TimedOut as e:
            raise TimeoutError(
                f"torchrun did not finish within {timeout:g} s; every node and worker stopped"
                + "".join(_tail(f"node {i}", d.stderr) for i, d in enumerate(e.finished))
            ) from None
        finally:
            del store  # after every node has gone
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    lead_stdout = next((d.stdout for d in done if d.stdout.strip()), done[0].stdout)
    return TorchrunRun(
        commands, [d.returncode for d in done], lead_stdout, [d.stderr for d in done], report
    )


def _tail(who: str, text: str, lines: int = 8) -> str:
    """The last lines ``who`` printed, indented under a heading, to tell where a run stuck."""
    last = text.strip().splitlines()[-lines:] or ["(nothing)"]
    return f"\n{who}'s last lines:\n" + "\n".join(f"    {line}" for line in last)


def train_args_of(argv: list[str]) -> list[str]:
    """The options after ``-m helpers.train`` in a command line."""
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ENTRY:
            return argv[i + 2 :]
    raise ValueError(f"no `-m helpers.train` in {shlex.join(argv)}")


def scheduler_commands(root: str | Path | None = None) -> dict[str, list[str]]:
    """The torchrun command each scheduler file runs, as a list of words: ``slurm`` from the
    batch script's ``srun`` line, ``pytorchjob`` from the PyTorchJob's containers, ``trainjob``
    from the TrainJob's trainer. ``root``: the course's checkout (default: the one this package
    runs from; an installed package has none, and must be given it)."""
    root = Path(root) if root is not None else REPO
    paths = {name: root / rel for name, rel in SCHEDULER_FILES.items()}
    missing = [str(rel) for name, rel in SCHEDULER_FILES.items() if not paths[name].is_file()]
    if missing:
        raise FileNotFoundError(
            f"no {', '.join(missing)} under {root}: pass the course checkout's folder, "
            "scheduler_commands(root=...)"
        )
    return {
        "slurm": _slurm_command(paths["slurm"].read_text()),
        "pytorchjob": _pytorchjob_command(yaml.safe_load(paths["pytorchjob"].read_text())),
        "trainjob": _trainjob_command(yaml.safe_load(paths["trainjob"].read_text())),
    }


def _slurm_command(script: str) -> list[str]:
    """The srun line's torchrun command as the script runs it when the environment sets none of
    its variables: ``${NAME:-default}`` is the default, ``${NAME:+words}`` nothing."""
    joined = script.replace("\\\n", " ")  # continuation lines
    joined = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", joined)
    joined = re.sub(r"\$\{\w+:\+[^}]*\}", "", joined)
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


def _trainjob_command(job: dict) -> list[str]:
    if job.get("kind") != "TrainJob":
        raise ValueError(f"expected kind TrainJob, got {job.get('kind')}")
    trainer = job["spec"]["trainer"]
    return [*trainer.get("command", []), *trainer.get("args", [])]
