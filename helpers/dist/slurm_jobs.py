"""The course's training submitted to the two-node Slurm cluster of ``helpers.dist.slurm_cluster``
with ``sbatch cluster/slurm/train.sbatch`` (only its environment variables changed), read back
from the job's output, and compared with the same training under torchrun alone; a worker killed
mid-run to see the job restart and resume.

    python -m helpers.dist.slurm_jobs [--kill-worker]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.dist.cluster import REPO
from helpers.dist.slurm_cluster import (
    FINISHED,
    SHORT_RUN,
    SLURM_SCRIPT,
    SlurmCluster,
    slurm_cluster,
    why_no_slurm,
)


@dataclass
class SlurmRun:
    """One run of the batch script on the cluster: Slurm's records and the training's report."""

    job_id: int
    record: dict[str, str]  # scontrol show job
    accounting: dict[str, str] | None  # sacct, None without accounting
    completion: dict[str, str] | None  # the job-completion log's line
    report: dict | None  # rank 0's --json report
    output: str  # the job's output file
    killed: list[int] = field(default_factory=list)  # worker pids this run killed
    killed_node: int | None = None
    command: str = ""  # the submission, as typed on the first node (the paths left out)

    @property
    def run(self) -> dict:
        if self.report is None:
            raise RuntimeError(
                f"job {self.job_id} ended {self.record.get('JobState')} "
                f"{self.record.get('ExitCode')} without a report; its output ends:\n"
                + "\n".join(self.output.strip().splitlines()[-5:])
            )
        return self.report["runs"][0]

def training_env(
    cluster: SlurmCluster, folder: Path, settings: dict[str, str] | None = None
) -> dict[str, str]:
    """What a job of the batch script needs from the environment here: ``settings`` (the
    script's variables, over ``SHORT_RUN``), this Python's venv first on ``PATH``, this
    repository's ``helpers``, Gloo on the namespaces' interface, checkpoints in ``folder``."""
    return {
        **SHORT_RUN,
        **(settings or {}),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "GLOO_SOCKET_IFNAME": cluster.pair.interface,
        "TRAIN_CHECKPOINT_DIR": str(folder / "checkpoints"),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(folder),  # torchrun's agents leave their log folders there, not in /tmp
    }

# the script asks for 4 CPUs a task (2 workers of 2 threads); here 1 worker of 1 thread a node
CPUS = ("--cpus-per-task", "1")

def submit_training(
    cluster: SlurmCluster,
    folder: Path,
    settings: dict[str, str] | None = None,
    kill_worker_on: int | None = None,
    timeout: float = 300,
) -> SlurmRun:
    """``sbatch cluster/slurm/train.sbatch`` in ``training_env`` (``settings``, default
    ``SHORT_RUN``), with the output, checkpoints and report in ``folder``; what Slurm and the
    training recorded once it has ended. With ``kill_worker_on=N``, the worker on node N gets
    SIGKILL once the first checkpoint is complete, for torchrun to restart the group."""
    from helpers.dist.checkpoint import latest

    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "report.json"
    env = {**training_env(cluster, folder, settings), "TRAIN_JSON": str(report)}
    checkpoints = Path(env["TRAIN_CHECKPOINT_DIR"])
    job_id = cluster.sbatch(SLURM_SCRIPT, env, *CPUS, "--output", str(folder / "%x-%j.out"))
    killed: list[int] = []
    if kill_worker_on is not None:
        deadline = time.monotonic() + timeout
        asked = 0.0
        while not killed:
            if latest(checkpoints) is not None:  # the first checkpoint is complete
                for pid in cluster.workers(kill_worker_on):
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
            if not killed and time.monotonic() - asked > 1:  # scontrol once a second
                asked = time.monotonic()
                state = cluster.job(job_id).get("JobState")
                if state in FINISHED or asked > deadline:
                    raise RuntimeError(f"job {job_id} {state} before a worker could be killed")
            time.sleep(0.05)
    record = cluster.wait(job_id, timeout=timeout)
    out = next(folder.glob(f"*-{job_id}.out"), None)
    return SlurmRun(
        job_id,
        record,
        cluster.accounting(job_id),
        cluster.completion_log(job_id),
        json.loads(report.read_text()) if report.exists() else None,
        out.read_text() if out else "",
        killed,
        kill_worker_on,
        " ".join(
            [
                *(f"{k}={v}" for k, v in {**SHORT_RUN, **(settings or {})}.items()),
                "GLOO_SOCKET_IFNAME=" + cluster.pair.interface,
                "sbatch",
                *CPUS,
                str(SLURM_SCRIPT.relative_to(REPO)),
            ]
        ),
    )

def train_args(settings: dict[str, str] = SHORT_RUN) -> list[str]:
    """``helpers.train``'s options for the same training as the batch script with ``settings``."""
    return [
        "--global-batch",
        settings["TRAIN_GLOBAL_BATCH"],
        "--epochs",
        settings["TRAIN_EPOCHS"],
        "--threads-per-worker",
        settings["TRAIN_THREADS_PER_WORKER"],
        "--data",
        settings["HAR_DATA"],
    ]

def restart_counts(run: dict) -> list[int]:
    """Each rank's ``TORCHELASTIC_RESTART_COUNT``: across nodes they differ, since an agent
    whose own workers were healthy restarts them for the new round without counting it."""
    return [int(r["TORCHELASTIC_RESTART_COUNT"]) for r in run["ranks"]]

def summary(run: SlurmRun, alone: dict | None = None) -> str:
    """What the scheduler and the training recorded, in a few lines; with ``alone`` (the run
    record of the same training under torchrun alone), whether the weights are the same."""
    r = run.record
    lines = [f"node1$ {run.command}"] if run.command else []
    if run.accounting:
        a = run.accounting
        lines.append(
            f"sacct: JobState={a['JobState']} ExitCode={a['ExitCode']} NodeList={a['NodeList']}"
        )
    else:
        lines.append("sacct: Slurm accounting storage is disabled (no slurmdbd here)")
    lines.append(
        f"scontrol show job {run.job_id}: JobState={r.get('JobState')} "
        f"ExitCode={r.get('ExitCode')} NodeList={r.get('NodeList')} BatchHost={r.get('BatchHost')}"
    )
    if run.completion:
        c = run.completion
        lines.append(
            f"job-completion log: JobState={c.get('JobState')} ExitCode={c.get('ExitCode')} "
            f"NodeList={c.get('NodeList')}"
        )
    done = run.run
    for rank in done["ranks"]:
        lines.append(
            f"  rank {rank['RANK']} of {rank['WORLD_SIZE']}: host {rank['host']}, "
            f"node rank {rank['GROUP_RANK']}, rendezvous host {rank['MASTER_ADDR']}"
        )
    if run.killed:
        lines.append(f"killed with SIGKILL mid-run: the worker on node {run.killed_node + 1}")
    restarts = restart_counts(done)
    if any(restarts):
        lines.append(
            f"torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT by rank: {restarts}); "
            f"they resumed from the checkpoint of step {done['resumed_from']}"
        )
    lines.append(
        f"{done['steps']} steps; checksum {done['checksums'][0]:.6f}, replicas identical: "
        f"{'yes' if done['replicas_identical'] else 'no'}, test accuracy {done['accuracy']:.2%}"
    )
    if alone is not None:
        same = done["digest"] == alone["digest"]
        lines.append(
            f"the same training under torchrun alone (2 nodes here): checksum "
            f"{alone['checksums'][0]:.6f}; {'the same' if same else 'DIFFERENT'} weights"
            f"{', bit for bit' if same else ''}"
        )
    return "\n".join(lines)

@dataclass
class SlurmDemo:
    """The batch script's run on the cluster beside the same training under torchrun alone;
    printed, what each recorded. ``skipped`` says why it did not run, where it could not."""

    skipped: str | None = None
    run: SlurmRun | None = None
    alone: dict | None = None  # torchrun alone's run record

    @property
    def same_weights(self) -> bool:
        """Whether the two trainings ended with the same weights, bit for bit."""
        return self.run is not None and self.run.run["digest"] == self.alone["digest"]

    def __str__(self) -> str:
        return f"skipped: {self.skipped}" if self.skipped else summary(self.run, self.alone)

def run_slurm_demo(
    kill_worker: bool = False,
    timeout: float = 300,
    settings: dict[str, str] | None = None,
    alone: dict | None = None,
) -> SlurmDemo:
    """Run the batch script (``settings`` over ``SHORT_RUN``) on a two-node cluster here (with
    ``kill_worker``, the second node's worker killed mid-run) beside the same training under
    torchrun alone, two nodes on loopback: ``alone``, that training's run record where the
    caller has one (a notebook that ran it already), else run here. Where this machine cannot
    (no root, no Slurm), say why instead."""
    why = why_no_slurm()
    if why:
        return SlurmDemo(skipped=why)
    if alone is None:
        from helpers.dist.cluster import run_torchrun

        args = train_args({**SHORT_RUN, **(settings or {})})
        alone = run_torchrun(args, nproc_per_node=1, nnodes=2, timeout=timeout).run
    with tempfile.TemporaryDirectory(prefix="slurm-run-") as tmp, slurm_cluster() as cluster:
        run = submit_training(
            cluster,
            Path(tmp),
            settings,
            kill_worker_on=1 if kill_worker else None,
            timeout=timeout,
        )
    return SlurmDemo(run=run, alone=alone)

def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # a kill (SIGTERM) stops the cluster as Ctrl-C does

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.dist.slurm_cluster", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--kill-worker",
        action="store_true",
        help="kill the second node's worker with SIGKILL once a checkpoint is saved",
    )
    args = p.parse_args(argv)
    why = why_no_slurm()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    try:
        print(run_slurm_demo(kill_worker=args.kill_worker))
    except (RuntimeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the cluster and its jobs are stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
