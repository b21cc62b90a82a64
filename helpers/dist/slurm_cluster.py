"""A real two-node Slurm cluster on one Linux machine, to run ``cluster/slurm/train.sbatch`` as it
runs on a real one (notebook 10, ``make test-slurm``).

Two network namespaces joined by a veth pair (``helpers.dist.netns``) are the two machines. Every
program of a node runs in its namespace with the node's host name (a UTS namespace of its own)
and the cluster's ``/etc/hosts`` (a mount namespace of its own, the file bind-mounted), so that
the batch script's ``scontrol show hostnames`` and torchrun's rendezvous resolve the node names
as on a cluster. ``munged`` (credentials, over a Unix socket in a temporary folder), ``slurmctld``
and one ``slurmd`` run on the first node, the second ``slurmd`` on the other; the daemons bind
their node's address only (``CommunicationParameters=NoInAddrAny``), and whatever a job opens
is inside the namespaces too. slurm.conf, state, spool and logs go to a temporary folder.
``slurm_cluster()`` starts it all and stops it all again, whatever happens (an error, Ctrl-C)::

    with slurm_cluster() as cluster:
        job = cluster.sbatch(SLURM_SCRIPT, env={...})
        print(cluster.wait(job))

Needs root, iproute2, util-linux and Debian 12's ``slurm-wlm`` and ``munge`` (Slurm 22.05):
``python -m helpers.dist.slurm_jobs`` runs the course's training on it and says why not where it
cannot. Without slurmdbd there is no accounting database, so ``sacct`` has nothing to read: the
job's end is read from ``scontrol show job`` (slurmctld keeps finished jobs for ``MinJobAge``)
and from Slurm's job-completion log (``jobcomp/filetxt``). A SIGKILL to the Python process that
started the cluster cannot be handled: it leaves the cluster running in its namespaces (``ip
netns pids NS`` lists the processes to kill, then ``ip netns del NS``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from helpers.dist.cluster import REPO, SCHEDULER_FILES
from helpers.dist.loopback import listening_addresses
from helpers.dist.netns import VethPair, veth_pair, why_no_namespaces
from helpers.dist.slurm_config import (
    NODES,
    hosts_file,
    write_config,
)

PROGRAMS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "srun": "slurm-client",
}
FINISHED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
SLURM_SCRIPT = REPO / SCHEDULER_FILES["slurm"]  # the batch script, unchanged
RDZV_PORT = 29500  # the batch script's default; each namespace has its own ports

# The short training the demonstration and the test run: 7,415 recordings / 2048 = 3 steps per
# epoch, 12 steps; one worker of one thread per node, so that it fits 2 busy cores.
SHORT_RUN = {
    "NPROC_PER_NODE": "1",
    "TRAIN_GLOBAL_BATCH": "2048",
    "TRAIN_EPOCHS": "4",
    "TRAIN_THREADS_PER_WORKER": "1",
    "TRAIN_CHECKPOINT_EVERY": "2",
    "HAR_DATA": "recordings",  # real data that needs no network: the namespaces have none
}


def program(name: str) -> str | None:
    """The program's path, looked up on ``PATH`` and in the sbin folders, where Debian puts
    the daemons and which a user's ``PATH`` often leaves out."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
    return shutil.which(name, path=path)


def why_no_slurm() -> str | None:
    """Why this machine cannot run the cluster, in one line, or None if it can."""
    missing = sorted({pkg for prog, pkg in PROGRAMS.items() if program(prog) is None})
    if missing:
        return (
            f"needs Debian's packages {', '.join(missing)} "
            "(as root: apt-get install slurm-wlm munge)"
        )
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "needs the unshare and nsenter commands (util-linux)"
    return why_no_namespaces()


def _quiet(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


def parse_record(line: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line as a dict (values end at the next space)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)", line))


@dataclass
class SlurmCluster:
    """A running cluster: the namespaces, the folder with its configuration and logs, and its
    daemons. Commands run inside the first node's namespace, where slurmctld listens."""

    pair: VethPair
    root: Path
    nodes: tuple[str, str] = NODES
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster's."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def prefix(self, node: int = 0) -> list[str]:
        """The command that runs a program on that node: in its network namespace, with its
        host name and its hosts file."""
        net = ["nsenter", f"--net=/run/netns/{self.pair.namespaces[node]}", "--"]
        return [*net, *_as_host(self.nodes[node], self.root / "hosts", [])]

    def command(self, *argv: str, timeout: float = 30) -> str:
        """Run a Slurm command (``scontrol``, ``sinfo``, ...) against this cluster; its stdout."""
        done = _quiet([*self.prefix(), *argv], env=self.env, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.command("scontrol", "show", "nodes", "-o")
        return {r["NodeName"]: r["State"] for r in map(parse_record, out.splitlines()) if r}

    def sbatch(self, script: Path, env: dict[str, str], *options: str) -> int:
        """Submit ``script`` from the repository's root with ``env`` added to this process's
        environment (``sbatch --export=ALL``, the default); the job's id."""
        out = _quiet(
            [*self.prefix(), "sbatch", "--parsable", *options, str(script)],
            env={**self.env, **env},
            cwd=REPO,
            timeout=30,
        )
        if out.returncode:
            raise RuntimeError(f"sbatch refused the job: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s record of the job."""
        return parse_record(self.command("scontrol", "show", "job", "-o", str(job_id)))

    def wait(self, job_id: int, timeout: float = 300, poll: float = 1.0) -> dict[str, str]:
        """The job's record once it has finished; cancelled, and an error, after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record.get("JobState") in FINISHED:
                return record
            if time.monotonic() > deadline:
                _quiet([*self.prefix(), "scancel", str(job_id)], env=self.env, timeout=30)
                raise TimeoutError(
                    f"job {job_id} still {record.get('JobState')} after {timeout:.0f} s; "
                    f"cancelled (logs in {self.root})"
                )
            time.sleep(poll)

    def accounting(self, job_id: int) -> dict[str, str] | None:
        """``sacct``'s record of the job, or None where there is no accounting (no slurmdbd:
        sacct says "Slurm accounting storage is disabled")."""
        fields = ["JobID", "State", "ExitCode", "NodeList"]
        argv = ["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", ",".join(fields)]
        done = _quiet([*self.prefix(), *argv], env=self.env, timeout=30)
        if done.returncode or not done.stdout.strip():
            return None
        values = done.stdout.strip().splitlines()[0].split("|")
        return dict(zip(["JobId", "JobState", "ExitCode", "NodeList"], values, strict=True))

    def completion_log(self, job_id: int) -> dict[str, str] | None:
        """The job's line in Slurm's job-completion log (``jobcomp/filetxt``), if written."""
        path = self.root / "jobcomp.log"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [parse_record(line) for line in lines]
        return next((r for r in records if r.get("JobId") == str(job_id)), None)

    def pids(self, node: int) -> list[int]:
        """Every process in that node's network namespace."""
        out = _quiet(["ip", "netns", "pids", self.pair.namespaces[node]]).stdout
        return [int(p) for p in out.split()]

    def workers(self, node: int) -> list[int]:
        """The training workers on that node: its processes that torchrun gave a ``RANK``."""
        found = []
        for pid in self.pids(node):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(b"RANK=") for v in environ):
                found.append(pid)
        return found

    def listening(self, node: int) -> list[str]:
        """What the processes in that node's namespace listen on, read from its own table."""
        pids = self.pids(node)
        return listening_addresses(pids, net_of=pids[0]) if pids else []

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of every daemon's log, for an error message."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            tail = log.read_text(errors="replace").strip().splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def _as_host(name: str, hosts: Path, argv: list[str]) -> list[str]:
    """``argv`` as if on the machine ``name``: a UTS namespace whose host name is ``name`` and a
    mount namespace whose ``/etc/hosts`` is ``hosts`` (the pid stays: nothing forks). Not
    ``ip netns exec``, which mounts a fresh ``/sys`` without the cgroup file systems that
    slurmd 22.05 insists on reading even when no cgroup plugin is configured."""
    script = 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"'
    return ["unshare", "--uts", "--mount", "--", "sh", "-c", script, name, str(hosts), *argv]


def _start(cluster: SlurmCluster, key: str, node: int, argv: list[str]) -> None:
    """Start a daemon on node ``node`` (its namespace, host name and hosts file)."""
    with open(cluster.root / f"{key}.out", "w") as log:  # the daemon holds its own copy
        cluster.daemons[key] = subprocess.Popen(
            [*cluster.prefix(node), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cluster.env,
            start_new_session=True,  # Ctrl-C reaches this process only; it stops them
        )


def _wait_for(what: str, ready, cluster: SlurmCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        dead = [k for k, p in cluster.daemons.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while {what}:\n{cluster.log_tail()}")
        try:
            if ready():
                return
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s {what}:\n{cluster.log_tail()}")
        time.sleep(0.3)


def _stop(cluster: SlurmCluster, grace: float = 10) -> None:
    """Stop the daemons (SIGTERM), then kill whatever still runs in the namespaces (job steps,
    torchrun, workers) with SIGKILL, and wait until nothing is left in them."""
    for proc in cluster.daemons.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in cluster.daemons.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    _kill_what_is_left(cluster, grace)
    for proc in cluster.daemons.values():
        proc.wait()


def _kill_what_is_left(cluster: SlurmCluster, grace: float) -> None:
    """SIGKILL every process left in the namespaces until none is, or fail after ``grace``."""
    deadline = time.monotonic() + grace
    while left := [pid for node in range(2) for pid in cluster.pids(node)]:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {left} in the cluster's namespaces would not stop")
        time.sleep(0.1)


@contextmanager
def slurm_cluster(timeout: float = 90, keep_logs: Path | None = None) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and two slurmd in two fresh network namespaces, wait until both
    nodes are idle, and stop everything again on leaving, whatever happens: the daemons, every
    process left in the namespaces, the namespaces and their veth pair, the temporary folder
    (copied to ``keep_logs`` first, if given)."""
    why = why_no_slurm()
    if why:
        raise RuntimeError(f"cannot start a Slurm cluster here: {why}")
    with veth_pair() as pair:
        root = Path(tempfile.mkdtemp(prefix="slurm-"))
        root.chmod(0o711)  # munged wants its socket's folder open to all (not readable: 0711)
        cluster = SlurmCluster(pair, root)
        try:
            write_config(root, pair)
            (root / "hosts").write_text(hosts_file(pair.addresses, NODES))
            key = root / "munge.key"
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o600)
            munged = [program("munged"), "--foreground", f"--socket={root}/munge.socket"]
            munged += [f"--key-file={key}", f"--pid-file={root}/munged.pid"]
            munged += [f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"]
            _start(cluster, "munged", 0, munged)
            _wait_for("starting munged", (root / "munge.socket").exists, cluster, timeout)
            _start(cluster, "slurmctld", 0, [program("slurmctld"), "-D", "-f", str(cluster.conf)])
            for node, name in enumerate(NODES):
                argv = [program("slurmd"), "-D", "-N", name, "-f", str(cluster.conf)]
                _start(cluster, f"slurmd-{name}", node, argv)

            def idle() -> bool:
                states = cluster.node_states()
                return all(states.get(n, "").startswith("IDLE") for n in NODES)

            _wait_for("waiting for both nodes to be idle", idle, cluster, timeout)
            yield cluster
        finally:
            try:
                _stop(cluster)
            finally:
                try:
                    if keep_logs is not None:
                        _copy_files(root, keep_logs)
                finally:
                    shutil.rmtree(root, ignore_errors=True)


def _copy_files(root: Path, to: Path) -> None:
    """The regular files under ``root`` (not the daemons' sockets) into ``to``."""
    for path in root.rglob("*"):
        if path.is_file():
            target = to / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


# --------------------------------------------------------------------------- the demonstration
