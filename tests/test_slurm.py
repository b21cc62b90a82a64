"""cluster/slurm/train.sbatch on a real two-node Slurm cluster on this machine (munged, slurmctld
and two slurmd in two network namespaces, helpers.dist.slurm_cluster): the job completes on both
nodes with the weights of the same training under torchrun alone, survives a worker killed on
one node, and leaves nothing running or listening. Needs root and Debian's slurm-wlm and munge;
about 2 minutes. `make test` leaves it out (marker ``slurm``); `make test-slurm` runs it."""

from __future__ import annotations

import socket
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from helpers.dist.cluster import run_torchrun
from helpers.dist.loopback import _address, listening_addresses
from helpers.dist.slurm_cluster import RDZV_PORT, SLURM_SCRIPT, slurm_cluster, why_no_slurm
from helpers.dist.slurm_config import NODES, SLURMCTLD_PORT, SLURMD_PORT
from helpers.dist.slurm_jobs import (
    CPUS,
    restart_counts,
    submit_training,
    train_args,
    training_env,
)

WHY = why_no_slurm()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(WHY is not None, reason=str(WHY))]


def root_listening() -> set[str]:
    """Every TCP address something listens on in this (the root) network namespace."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found.add(_address(fields[1], family))
    return found


def running(pid: int) -> bool:
    """Whether the process runs: not gone, and not a zombie that init has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def alone():
    """The same training under torchrun alone, two nodes on loopback (helpers.dist.cluster)."""
    done = run_torchrun(train_args(), nproc_per_node=1, nnodes=2, timeout=300)
    assert done.returncodes == [0, 0], done.stderr
    return done.run


class Session:
    """The cluster, kept open across this module's tests; the last test stops it."""

    def __init__(self) -> None:
        self.listening_before = root_listening()
        self.stack = ExitStack()
        self.cluster = self.stack.enter_context(slurm_cluster())
        self.seen_pids: set[int] = set()

    def note_pids(self) -> None:
        for node in range(2):
            self.seen_pids.update(self.cluster.pids(node))


@pytest.fixture(scope="module")
def session(alone):
    s = Session()
    try:
        yield s
    finally:
        s.stack.close()


def check_ended_well(run) -> None:
    """Slurm's own records: sacct where there is accounting, else scontrol and the job log."""
    record = run.accounting or run.record
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), run.output[-2000:]
    assert run.record["NodeList"] == "node[1-2]" and run.record["NumNodes"] == "2"
    if run.accounting is None:
        assert run.completion is not None, "jobcomp/filetxt wrote no line for the job"
        assert (run.completion["JobState"], run.completion["ExitCode"]) == ("COMPLETED", "0:0")


def test_the_daemons_listen_inside_the_namespaces_only(session):
    cluster = session.cluster
    assert cluster.node_states() == {n: "IDLE" for n in NODES}
    for node, address in enumerate(cluster.pair.addresses):
        listening = cluster.listening(node)
        assert listening and all(a.startswith(f"{address}:") for a in listening), listening
    daemons = [p.pid for p in cluster.daemons.values()]
    assert listening_addresses(daemons) == []  # none of their sockets in this namespace


def test_the_batch_script_trains_on_both_nodes_as_torchrun_alone_does(session, alone, tmp_path):
    run = submit_training(session.cluster, tmp_path)
    session.note_pids()
    check_ended_well(run)
    done = run.run
    ranks = {r["RANK"]: (r["host"], r["GROUP_RANK"]) for r in done["ranks"]}
    assert sorted(host for host, _ in ranks.values()) == list(NODES), ranks  # one rank a node
    assert {r["MASTER_ADDR"] for r in done["ranks"]} == {NODES[0]}  # the script's head node
    assert done["world"] == 2 and done["replicas_identical"]
    assert done["digest"] == alone["digest"]  # the same weights, bit for bit
    assert done["checksums"] == alone["checksums"]
    assert restart_counts(done) == [0, 0] and done["resumed_from"] == 0


def test_a_worker_killed_on_one_node_is_restarted_and_resumes(session, alone, tmp_path):
    run = submit_training(session.cluster, tmp_path, kill_worker_on=1)
    session.note_pids()
    assert run.killed, "no worker was killed"
    check_ended_well(run)
    assert "failed (exitcode: -9)" in run.output  # torchrun saw the SIGKILL
    done = run.run
    assert max(restart_counts(done)) == 1  # the killed node's agent counted one restart
    assert 0 < done["resumed_from"] < done["steps"]  # from a checkpoint, not from scratch
    assert done["digest"] == alone["digest"]  # the uninterrupted training's weights
    assert sorted(r["host"] for r in done["ranks"]) == list(NODES)


def test_stopping_mid_job_leaves_nothing_running_or_listening(session, tmp_path):
    """Stop the cluster while a job trains, as an error or Ctrl-C in the caller would."""
    cluster = session.cluster
    env = training_env(cluster, tmp_path, {"TRAIN_EPOCHS": "1000"})
    job = cluster.sbatch(SLURM_SCRIPT, env, *CPUS, "--output", str(tmp_path / "job.out"))
    deadline = time.monotonic() + 120
    while not (cluster.workers(0) and cluster.workers(1)):  # training on both nodes
        assert cluster.job(job)["JobState"] in ("PENDING", "RUNNING")
        assert time.monotonic() < deadline, "the job's workers did not start"
        time.sleep(0.2)
    session.note_pids()
    namespaces, addresses, root = cluster.pair.namespaces, cluster.pair.addresses, cluster.root
    session.stack.close()
    alive = sorted(pid for pid in session.seen_pids if running(pid))
    assert alive == [], f"processes left: {alive}"
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in left for ns in namespaces)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(f"v{ns[3:9]}" in links for ns in namespaces)  # the veth pair's ends
    assert not root.exists()
    # nothing new listens here on the cluster's addresses or ports (others' programs may come
    # and go on this machine meanwhile, so only what could be the cluster's counts)
    new = root_listening() - session.listening_before
    ports = {SLURMCTLD_PORT, SLURMD_PORT, RDZV_PORT}
    ours = [
        a
        for a in new
        if a.rsplit(":", 1)[0].strip("[]") in addresses or int(a.rsplit(":", 1)[1]) in ports
    ]
    assert ours == [], ours
