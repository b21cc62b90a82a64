"""python -m helpers.train under torchrun: the notebook launcher's training, on one node or two,
surviving a killed worker; the scheduler files run the same command."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel

from helpers import train
from helpers.dist import cluster
from helpers.dist.cluster import (
    REPO,
    SCHEDULER_FILES,
    run_torchrun,
    scheduler_commands,
    train_args_of,
)
from helpers.dist.loopback import (
    LOOPBACK,
    listening_addresses,
    loopback_store,
    on_loopback,
    socket_inodes,
    tcp_sockets,
)
from helpers.training import TrainConfig, run_training

# 7,415 recordings / 2048 = 3 steps per epoch: 6 steps, a few seconds per launch
ARGS = [
    "--global-batch",
    "2048",
    "--epochs",
    "2",
    "--data",
    "recordings",
    "--threads-per-worker",
    "1",
]


@pytest.fixture(scope="module")
def in_notebook():
    """The same training through helpers.dist.launch, as the notebooks run it."""
    return run_training(2, TrainConfig(global_batch=2048, epochs=2, data="recordings"))


@pytest.mark.slow
def test_torchrun_ends_with_the_notebook_launchers_weights(in_notebook, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # what the run leaves in the temporary folder
    monkeypatch.setattr(tempfile, "tempdir", None)
    done = run_torchrun(ARGS, nproc_per_node=2)
    assert done.returncodes == [0], done.stderr[0]
    assert not list(tmp_path.iterdir())  # nothing: not the agent's torchelastic_* log folder
    run = done.run
    assert run["checksums"] == in_notebook.checksums  # exactly: the same weights
    assert run["replicas_identical"] and run["world"] == 2
    assert [r["RANK"] for r in run["ranks"]] == ["0", "1"]
    assert {r["MASTER_ADDR"] for r in run["ranks"]} == {"127.0.0.1"}
    assert "rerun: " in done.stdout and "torchrun --standalone --nproc-per-node 2 -m" in done.stdout


@pytest.mark.slow
def test_two_nodes_on_one_machine_do_the_same_training(in_notebook):
    done = run_torchrun(ARGS, nproc_per_node=1, nnodes=2)
    assert done.returncodes == [0, 0], done.stderr
    assert done.run["checksums"] == in_notebook.checksums
    assert sorted(r["GROUP_RANK"] for r in done.run["ranks"]) == ["0", "1"]


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_resumes_from_the_last_checkpoint(in_notebook, tmp_path):
    checkpoints = ["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "2"]
    # a second restart in reserve, as notebook 10 keeps: a restart can fail on its own (seen once
    # in CI: the restarted rank 1 aborted on start, SIGABRT), and the test is of the resume
    done = run_torchrun([*ARGS, *checkpoints, "--inject-kill", "1:5"], max_restarts=2)
    assert done.returncodes == [0], done.stderr[0]
    assert done.lines("exitcode: -9"), "rank 1 died of SIGKILL"
    run = done.run
    assert run["restarts"] >= 1 and run["resumed_from"] == 4
    assert "1 step(s) redone" in done.stdout
    assert run["checksums"] == in_notebook.checksums  # the uninterrupted run's weights


@pytest.mark.slow
def test_a_rank_that_dies_before_joining_is_restarted_into_a_fresh_store(
    in_notebook, tmp_path, monkeypatch
):
    """The case that breaks helpers.train's attempt count in a shared agent store (its ``_join``):
    rank 1 fails before it joins, on the first attempt only, once rank 0 waits in the group (its
    store accepts connections). With the scheduler files' setting, a fresh store for every
    attempt, the restart trains on; with the agent's store shared, every restart fails."""
    entry = tmp_path / "dies_first.py"
    entry.write_text(
        "import os, socket, sys, time\n"
        "if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
        "    store = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))\n"
        "    for _ in range(600):  # until the workers' store is up: a fresh one, rank 0's\n"
        "        try:\n"
        "            socket.create_connection(store, timeout=1).close()\n"
        "            break\n"
        "        except OSError:\n"
        "            time.sleep(0.1)\n"
        "    if os.environ['TORCHELASTIC_USE_AGENT_STORE'] == 'True':  # up from the start\n"
        "        import torch.distributed as dist\n"
        "        agent = dist.TCPStore(*store, is_master=False)\n"
        "        agent.wait(['helpers.train/starts/rank_0'])  # rank 0 has counted\n"
        "    sys.exit(3)  # before helpers.train prepares, counts or joins\n"
        "from helpers.train import main\n"
        "sys.exit(main())\n"
    )
    monkeypatch.setattr(cluster, "ENTRY", [str(entry)])  # torchrun runs it instead of -m
    done = run_torchrun(ARGS, nproc_per_node=2, max_restarts=2)
    assert done.returncodes == [0], done.stderr[0]
    assert done.lines("exitcode: 3"), "rank 1 should have failed on the first attempt"
    assert done.run["restarts"] >= 1
    assert done.run["digest"] == in_notebook.digests[0]  # the same training, bit for bit


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--global-batch", "256", "512"], "one run per launch"),
        (["--inject-kill", "1:5"], "needs --checkpoint-dir"),
        (["--inject-kill", "one"], "RANK:STEP"),
        (["--checkpoint-every", "0", "--checkpoint-dir", "x"], "at least 1"),
        (
            ["--checkpoint-dir", "x", "--checkpoint-every", "5", "--inject-kill", "0:7:save"],
            "no checkpoint is saved at step 7",
        ),
        (["--lr", "0"], "--lr must be above 0"),
    ],
)
def test_bad_options_end_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        train.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_a_training_that_cannot_split_is_refused_before_it_starts(capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert train.main(["--global-batch", "100000", "--data", "recordings"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: global batch 100000 is larger") and "\n" not in err
    assert (
        train.main(["--checkpoint-dir", "x", "--inject-kill", "1:5", "--data", "recordings"]) == 2
    )
    assert (
        capsys.readouterr().err.strip()
        == "error: --inject-kill 1:5: there is no rank 1 among 1 workers"
    )


def test_backend_follows_the_device():
    assert train.backend_for("cuda:1") == "nccl"
    assert train.backend_for("cpu") == "gloo"


def test_the_scheduler_files_run_the_same_entry_point_and_options():
    commands = scheduler_commands()
    assert set(commands) == {"slurm", "pytorchjob", "trainjob"}
    options = {name: train_args_of(words) for name, words in commands.items()}
    assert options["slurm"] == options["pytorchjob"] == options["trainjob"]
    args = train.parse_args(options["slurm"])  # options helpers.train accepts
    assert args.checkpoint_dir is not None, "a long run on a cluster saves checkpoints"
    for words in commands.values():
        assert words[0] == "torchrun" and words[words.index("--max-restarts") + 1] == "1"
        assert words[words.index("--nproc-per-node") + 1] == "2"
        assert words.index("--nnodes") < words.index("-m")  # torchrun's, on every node


def test_a_command_line_is_shown_as_a_reader_types_it():
    """Settings in front of torchrun, however many ``env`` chain them, read NAME=VALUE; a
    prefix that is not one (``ip netns exec``) stays; the port and the report file go."""
    argv = cluster.torchrun_argv(["--epochs", "1", "--json", "/tmp/r.json"], 1,
                                 f"{LOOPBACK}:29512", nnodes=2, node_rank=1)  # fmt: skip
    chained = cluster.shown(["env", "HAR_DATA=standin", "env", cluster.NO_AGENT_STORE, *argv])
    assert chained.startswith(f"HAR_DATA=standin {cluster.NO_AGENT_STORE} torchrun --nnodes 2 ")
    assert f"--rdzv-endpoint {LOOPBACK}:PORT " in chained and chained.endswith("--epochs 1")
    prefixed = cluster.shown(["ip", "netns", "exec", "ns1", "env", cluster.NO_AGENT_STORE, *argv])
    assert prefixed.startswith(f"ip netns exec ns1 env {cluster.NO_AGENT_STORE} torchrun ")


def test_every_scheduler_file_gives_each_attempt_a_fresh_store():
    """None leaves the workers in torchrun's agent store, which outlives a killed group (notebook
    10, section 7; pytorch/pytorch#135712)."""
    sbatch = (REPO / SCHEDULER_FILES["slurm"]).read_text()
    assert re.search(r"^export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1$", sbatch, re.MULTILINE)
    job = yaml.safe_load((REPO / SCHEDULER_FILES["pytorchjob"]).read_text())
    envs = [c.get("env", []) for role in job["spec"]["pytorchReplicaSpecs"].values()
            for c in role["template"]["spec"]["containers"]]  # fmt: skip
    job = yaml.safe_load((REPO / SCHEDULER_FILES["trainjob"]).read_text())
    envs.append(job["spec"]["trainer"].get("env", []))
    for env in envs:
        assert {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"} in env, env


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net (Linux)")
def test_a_tcpstore_listens_on_every_interface_whatever_its_host():
    """What the security notes say: torch 2.13's TCPStore, the store torchrun's rendezvous
    hosts, binds every interface even when given 127.0.0.1, unlike helpers.dist.launch's store."""
    store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
    ours = loopback_store(1, 10.0)
    try:
        listening = listening_addresses([os.getpid()])
        assert {f"0.0.0.0:{store.port}", f"[::]:{store.port}"} & set(listening)
        assert f"{LOOPBACK}:{ours.port}" in listening
    finally:
        del store, ours


@pytest.mark.slow
def test_two_nodes_in_two_network_namespaces_joined_by_a_veth_pair(namespaces, in_notebook):
    from helpers.dist.netns import veth_pair

    with veth_pair() as pair:
        done = run_torchrun(
            ARGS,
            nproc_per_node=1,
            nnodes=2,
            prefixes=pair.prefixes,
            endpoint=f"{pair.addresses[0]}:29400",
            local_addrs=list(pair.addresses),
            env={"GLOO_SOCKET_IFNAME": pair.interface},
        )
    assert done.returncodes == [0, 0], done.stderr
    assert done.run["checksums"] == in_notebook.checksums
    assert {r["MASTER_ADDR"] for r in done.run["ranks"]} <= set(pair.addresses)


def test_a_checkpoint_folder_that_cannot_be_made_is_one_line(capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    argv = ["--checkpoint-dir", "/proc/nope", "--global-batch", "4096", "--data", "recordings"]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write checkpoints in /proc/nope") and "\n" not in err, err


def test_a_checkpoint_error_frees_the_ddp_model_before_the_group(monkeypatch):
    """A reducer that outlives the group's name destroys the group when it is freed, with the GIL
    held: a hang if one of Gloo's threads still needs the GIL (pytorch/pytorch#56297)."""
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    real, alive = dist.destroy_process_group, []

    def counting(*args, **kwargs):
        alive.append(sum(type(o) is DistributedDataParallel for o in gc.get_objects()))
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", counting)
    argv = ["--checkpoint-dir", "/proc/nope", "--global-batch", "4096", "--data", "recordings"]
    assert train.main(argv) == 2
    assert alive == [0], f"DDP models alive when the group was destroyed: {alive}"


@pytest.fixture
def broken_teardown(monkeypatch):
    """One worker without torchrun, whose process-group teardown raises: what it reports must
    be its own error. The group is torn down for real afterwards."""
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    real = dist.destroy_process_group

    def broken(*args, **kwargs):
        raise RuntimeError("the teardown failed")

    monkeypatch.setattr(dist, "destroy_process_group", broken)
    yield
    if dist.is_initialized():
        real()


def test_a_checkpoint_error_is_reported_whatever_the_teardown_does(broken_teardown, capsys):
    argv = ["--checkpoint-dir", "/proc/nope", "--global-batch", "4096", "--data", "recordings"]
    assert train.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: cannot write checkpoints in /proc/nope")


def test_a_training_error_is_not_replaced_by_the_teardown(broken_teardown, monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("the training's own error")

    monkeypatch.setattr(train, "train_worker", failing)
    with pytest.raises(ValueError, match="the training's own error"):
        train.main(["--global-batch", "4096", "--data", "recordings"])


def descendants(pid: int) -> list[int]:
    """Every process started, directly or not, by process ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net (Linux)")
def test_nothing_a_torchrun_run_opens_listens_beyond_loopback(in_notebook):
    """While two nodes train: the agents and workers (this process's descendants), and the
    rendezvous store, wherever it runs (found by its port once the run has said which)."""
    seen: set[tuple[str, bool]] = set()  # (listening address, opened by the run's processes)
    done_sampling = threading.Event()

    def sample() -> None:
        while not done_sampling.is_set():
            ours = socket_inodes(descendants(os.getpid()))
            seen.update((local, inode in ours) for state, local, _, inode in tcp_sockets()
                        if state == "0A")  # fmt: skip
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        done = run_torchrun(ARGS, nproc_per_node=1, nnodes=2)
    finally:
        done_sampling.set()
        sampler.join()
    assert done.returncodes == [0, 0], done.stderr
    assert done.run["checksums"] == in_notebook.checksums
    rendezvous = next(w for w in done.commands[0] if w.startswith(f"{LOOPBACK}:")).split(":")[1]
    workers_store = done.run["ranks"][0]["MASTER_PORT"]
    found = sorted(a for a, by_run in seen if by_run or a.rsplit(":", 1)[1] == rendezvous)
    ports = {a.rsplit(":", 1)[1] for a in found}
    assert {rendezvous, workers_store} <= ports, f"the stores were not seen: {found}"
    assert [a for a in found if not on_loopback(a)] == [], found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_timeout_kills_what_a_node_started_even_after_the_node_has_exited(tmp_path):
    """Node 0 (a stand-in for torchrun) leaves a child running and exits; node 1 hangs. The
    timeout must stop both, and node 0's child with them."""
    child = tmp_path / "child.pid"
    prefixes = [
        ["bash", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! > {child}", "node0"],
        ["bash", "-c", "sleep 300", "node1"],
    ]
    with pytest.raises((TimeoutError, subprocess.TimeoutExpired)):
        run_torchrun(ARGS, nproc_per_node=1, nnodes=2, timeout=5, prefixes=prefixes)
    pid = int(child.read_text())
    deadline = time.monotonic() + 30  # a bound for a hang, not a timing
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid), "node 0's child outlived the run"


@pytest.mark.slow
def test_the_timeout_bounds_the_whole_run_not_each_node(tmp_path):
    """Node 0 ends after 6 s, node 1 would end after 13 s: a 10 s timeout stops node 1, which
    per-node timeouts (6 s, then 10 s more for node 1) would let finish."""
    finished = tmp_path / "node1.finished"
    prefixes = [
        ["bash", "-c", "sleep 6", "node0"],
        ["bash", "-c", f"sleep 13 && touch {finished}", "node1"],
    ]
    with pytest.raises(TimeoutError, match="did not finish within 10 s; every node and worker"):
        run_torchrun(ARGS, nproc_per_node=1, nnodes=2, timeout=10, prefixes=prefixes)
    time.sleep(5)  # past node 1's 13 s: it would have finished by now, had it run on
    assert not finished.exists()
