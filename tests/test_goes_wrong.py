"""Notebook 11's failures, made on purpose: each diagnosis must keep finding its cause, every
hang must end without leaving a process or a listening socket, and the torch behaviours the
notebook states (DETAIL crashing DDP, fr_trace failing on Gloo's dumps) are checked, so that a
release that changes them fails here first."""

from __future__ import annotations

import itertools
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from helpers.dist.launch import WorkerError, launch
from helpers.experiments import (
    cost,
    ddp_pitfalls,
    evaluation,
    hangs,
    leftovers,
    nondeterminism,
    straggler,
)
from helpers.training.model import make_mlp

MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"
TIMEOUT = 3.0

# --------------------------------------------------------------------------- what is left behind


def test_left_behind_sees_a_process_and_a_socket_it_did_not_see_before():
    """The check the notebook asserts can fail: a child and a listening socket opened after the
    snapshot are reported, and nothing once they are gone."""
    before = leftovers.snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = socket.create_server(("127.0.0.1", 0))
    try:
        left = leftovers.left_behind(before, wait=0.5)
        assert child.pid in left["processes"]
        assert f"127.0.0.1:{server.getsockname()[1]}" in left["listening"]
    finally:
        child.kill()
        child.wait()
        server.close()
    assert leftovers.left_behind(before) == {"processes": [], "listening": []}


def test_parents_names_each_processs_parent():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        table = leftovers.parents()
        assert table[child.pid] == os.getpid() and table[os.getpid()] == os.getppid()
    finally:
        child.kill()
        child.wait()


def test_tagged_finds_a_process_by_its_environment_wherever_it_is():
    tag = leftovers.new_tag()
    script = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **tag},
                             stdout=subprocess.PIPE)  # fmt: skip
    try:
        # Popen returns once the child's exec has closed its descriptors, which the kernel does
        # before it sets up the new environment: wait until the child has run a line of Python.
        assert child.stdout.readline() == b"up\n"
        assert leftovers.tagged(tag) == [child.pid]
        assert leftovers.tagged(leftovers.new_tag()) == []
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert leftovers.tagged(tag) == []
    with pytest.raises(ValueError, match="one tag"):
        leftovers.tagged({**tag, "OTHER": "x"})


# --------------------------------------------------------------------------- stragglers


def test_expected_max_is_the_mean_over_every_draw():
    samples = [0.3, 1.0, 2.5, 2.5]
    for n in (1, 2, 3):
        every = [max(draw) for draw in itertools.product(samples, repeat=n)]
        assert np.isclose(straggler.expected_max(samples, n), np.mean(every))
    assert np.isclose(straggler.simulated_max(samples, 3), np.mean(
        [max(d) for d in itertools.product(samples, repeat=3)]), rtol=0.02)  # fmt: skip
    with pytest.raises(ValueError):
        straggler.expected_max(samples, 0)


def test_find_straggler_wants_the_longest_before_and_the_shortest_inside():
    summary = pd.DataFrame({"compute": [0.01, 0.01, 0.01], "delay": [0.0, 0.2, 0.0],
                            "allreduce": [0.2, 0.01, 0.2]})  # fmt: skip
    assert straggler.find_straggler(summary) == 1
    summary.loc[0, "allreduce"] = 0.001  # rank 0 waits least but rank 1 computes longest
    with pytest.raises(ValueError, match="no single straggler"):
        straggler.find_straggler(summary)


@pytest.mark.slow
@pytest.mark.parametrize("slow_rank", [0])  # the notebook finds rank 1
def test_a_delayed_rank_is_found_and_the_other_waits_for_it(slow_rank: int):
    delay = 0.25
    per_rank = launch(straggler.straggler_worker, 2, slow_rank, delay, steps=4,
                      baseline_steps=4)  # fmt: skip
    summary = straggler.per_rank_summary(straggler.step_table(per_rank))
    assert straggler.find_straggler(summary) == slow_rank
    assert summary.loc[1 - slow_rank, "allreduce"] > delay / 2


# --------------------------------------------------------------------------- hangs


@pytest.mark.slow
def test_a_skipped_collective_times_out_and_leaves_nothing_behind(tmp_path: Path):
    """Also: notebook 11 says PyTorch's flight-recorder analyser stops on Gloo's dumps in 2.13;
    when it reads them, compare with it there instead of with first_divergence."""
    from torch.distributed.flight_recorder.fr_trace import main as fr_trace

    before = leftovers.snapshot()
    with hangs.worker_environment(TORCH_FR_BUFFER_SIZE="64"):
        hang = hangs.run_hang("skip", tmp_path, collective_timeout=TIMEOUT)
    assert hang.failed_rank == 0 and "Timed out" in hang.error
    assert hang.waited[0] >= 0.9 * TIMEOUT
    assert hangs.first_divergence(hang.flight) == {
        "seq": 4, "entered": {0: "gloo:all_reduce"}, "missing": [1]}  # fmt: skip
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ  # restored
    assert leftovers.left_behind(before) == {"processes": [], "listening": []}
    with pytest.raises(KeyError):
        fr_trace([str(tmp_path), "--prefix", "fr_"])


@pytest.mark.slow
def test_an_order_mismatch_hangs_without_detail_and_is_named_with_it(tmp_path: Path):
    plain = hangs.run_hang("order", tmp_path / "plain", collective_timeout=TIMEOUT)
    assert "Timed out" in plain.error
    with hangs.worker_environment(TORCH_DISTRIBUTED_DEBUG="DETAIL"):
        detail = hangs.run_hang("order", tmp_path / "detail", collective_timeout=TIMEOUT)
    assert "Detected mismatch between collectives" in detail.error
    assert "OpType=BROADCAST" in detail.error and "OpType=ALLREDUCE" in detail.error


@pytest.mark.slow
def test_monitored_barrier_names_the_absent_rank(tmp_path: Path):
    hang = hangs.run_hang("monitored", tmp_path, collective_timeout=TIMEOUT)
    assert "Ranks 1 failed to pass monitoredBarrier" in hang.error
    assert any("monitoredBarrier" in line for line in hang.logs[0])  # Gloo's own log line


def test_first_divergence_reads_flight_records():
    def table(ops: dict[int, list[str]]) -> pd.DataFrame:
        return pd.DataFrame([{"rank": r, "seq": i + 1, "op": op}
                             for r, seq in ops.items() for i, op in enumerate(seq)])  # fmt: skip

    assert hangs.first_divergence(table({0: ["a", "b"], 1: ["a", "c"]})) == {
        "seq": 2, "entered": {0: "b", 1: "c"}, "missing": []}  # fmt: skip
    with pytest.raises(ValueError, match="do not diverge"):
        hangs.first_divergence(table({0: ["a"], 1: ["a"]}))


DETAIL_DDP = """
import sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
print(dist.get_debug_level(), flush=True)
DDP(torch.nn.Linear(4, 2))(torch.ones(3, 4)).sum().backward()
print("trained", flush=True)
"""


def _detail_script(tmp_path, env: dict[str, str], code: str = DETAIL_DDP
                   ) -> subprocess.CompletedProcess:  # fmt: skip
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "rendezvous")],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_detail_still_crashes_ddp_on_gloo(tmp_path):
    """Notebook 11 says TORCH_DISTRIBUTED_DEBUG=DETAIL makes DDP's constructor crash (SIGSEGV)
    in torch 2.13, in a plain one-process script, not only under the course's launcher: when
    this fails, a release fixed it, and the notebook should say so."""
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    crashed = _detail_script(tmp_path, env)
    assert crashed.stdout.split() == ["DebugLevel.DETAIL"]  # the level took, then DDP crashed
    assert crashed.returncode == -11, crashed.stderr[-2000:]


@pytest.mark.slow
def test_the_debug_level_is_read_when_torch_is_imported(tmp_path):
    """Notebook 11 says that setting TORCH_DISTRIBUTED_DEBUG after ``import torch`` does
    nothing (which makes DETAIL look harmless in a quick test)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISTRIBUTED_DEBUG"}
    late = DETAIL_DDP.replace("from torch.nn", "import os; os.environ['TORCH_DISTRIBUTED_DEBUG']"
                              " = 'DETAIL'\nfrom torch.nn")
    done = _detail_script(tmp_path, env, late)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["DebugLevel.OFF", "trained"]


def test_default_timeouts_are_read_from_torch():
    timeouts = hangs.default_timeouts()
    assert timeouts["gloo (and every backend but NCCL)"] == "0:30:00"


def test_cpu_seconds_reads_a_computing_process_then_a_sleeping_one_then_none():
    """What torchrun_hang tells a hang by: the workers' CPU time stops growing."""
    script = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
    child = subprocess.Popen([sys.executable, "-c", script + "time.sleep(30)"])
    try:
        deadline, used = time.monotonic() + 30, 0.0
        while used < 0.5 and time.monotonic() < deadline:  # computing
            time.sleep(0.1)
            used = hangs.cpu_seconds(child.pid)
        assert used >= 0.5
        time.sleep(0.5)  # asleep now, as a worker waiting in a collective
        assert hangs.cpu_seconds(child.pid) - used < 0.05
    finally:
        child.kill()
        child.wait()
    assert hangs.cpu_seconds(child.pid) is None  # reaped: the pid names no process


@pytest.mark.slow
def test_a_hang_under_torchrun_is_stopped_and_nothing_of_it_survives():
    """torchrun's workers run in sessions of their own: whatever stops the job must stop them
    too. The job's processes are found by a tag in their environment."""
    hang = hangs.torchrun_hang(hang_for=5.0)
    assert not hang.finished and all(code != 0 for code in hang.returncodes)
    # the workers were found idle (hung, not starting) and stayed so until the stop
    assert hang.hung_at is not None and 5.0 <= hang.hung_for < hang.seconds - hang.hung_at
    assert hang.hang_cpu < hangs.IDLE_SHARE
    assert not any("rror" in line for node in hang.before_stop for line in node)
    assert all(any("death signal" in line for line in node) for node in hang.after_stop)
    assert hang.left == []


# --------------------------------------------------------------------------- DDP


@pytest.mark.slow
def test_unused_parameters_join_and_uneven_inputs():
    result = launch(ddp_pitfalls.pitfalls_worker, 2, steps=5, short_by=2)
    aux = 4 * sum(p.numel() for p in ddp_pitfalls.WithAuxHead().aux.parameters())
    for r in result:
        assert r["error"]["unused"] == ["aux.weight", "aux.bias"]
        assert "Expected to have finished reduction" in r["error"]["error"]
        v = r["variants"]
        assert v["find_unused_parameters=True"]["unused_parameter_bytes"] == aux
        assert v["static_graph=True"]["static_graph"]
        assert len({x["body_digest"] for x in v.values()}) == 1
    # each rank stepped once per batch of its own; the join hook matched the longer rank's
    # bucket all-reduces on the shorter one, so both made as many
    assert [r["join"]["batches"] for r in result] == [r["join"]["steps"] for r in result] == [5, 3]
    assert result[0]["join"]["bucket_allreduces"] == result[1]["join"]["bucket_allreduces"] >= 5
    assert result[0]["join"]["digest"] == result[1]["join"]["digest"]
    with pytest.raises(WorkerError, match="Timed out"):
        launch(ddp_pitfalls.uneven_worker, 2, steps=4, short_by=2, collective_timeout=TIMEOUT)


# --------------------------------------------------------------------------- bits


def test_threads_change_a_sum_and_deterministic_mode_orders_a_race():
    sums = nondeterminism.thread_sums((1, 2, 1))
    assert sums[0] == sums[2] != sums[1]
    ordered = nondeterminism.ordered_sum()
    assert set(nondeterminism.racing_sums(repeats=5, mode=True)) == {ordered}
    assert set(nondeterminism.racing_sums(repeats=3, threads=1)) == {ordered}
    assert not torch.are_deterministic_algorithms_enabled()  # restored
    flagged = nondeterminism.flagged_on_cpu()
    assert flagged["put_(accumulate=False)"] == flagged["MaxUnpool1d"] == "raises"
    assert flagged["index_put_(accumulate=True)"] == flagged["scatter_add_"] == "runs"


def test_the_simulated_processor_is_the_makefiles():
    line = re.search(r"^OTHER_PROCESSOR\s*:?=\s*(.+)$", MAKEFILE.read_text(), re.MULTILINE)
    assert dict(item.split("=", 1) for item in line.group(1).split()) == (
        nondeterminism.OTHER_PROCESSOR)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the simulated processor selects x86 kernels")  # fmt: skip
def test_fresh_processes_reproduce_bit_for_bit_and_the_other_processor_does_not():
    fresh = nondeterminism.fresh_checksums(
        {"a": {}, "b": {}, "other": nondeterminism.OTHER_PROCESSOR}, "recordings")
    assert fresh["a"] == fresh["b"] != fresh["other"]


def test_the_native_capability_is_read_without_the_simulated_processors_variables(monkeypatch):
    """Under the simulated processor this process runs DEFAULT kernels; the fresh process must
    still report what the CPU itself offers (on x86 with AVX2, not DEFAULT)."""
    for key, value in nondeterminism.OTHER_PROCESSOR.items():
        monkeypatch.setenv(key, value)
    capability = nondeterminism.native_capability()
    assert capability.isupper() and capability.isalnum()
    if platform.machine().lower() in ("x86_64", "amd64") and "avx2" in _cpu_flags():
        assert capability != "DEFAULT"


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("world", [2, 3, 5, 7])
def test_exact_shards_cover_every_sample_once_and_the_sampler_pads(world: int):
    n, subjects = 2996, np.repeat(np.arange(9), 333)[:2996]
    for split in ("strided", "drop_last_remainder", "by_volunteer"):
        taken = [i for r in range(world) for i in evaluation.shard(split, n, r, world, subjects)]
        assert sorted(taken) == list(range(n)), split
    padded = [i for r in range(world) for i in evaluation.shard("padded", n, r, world)]
    assert len(padded) == -(-n // world) * world and set(padded) == set(range(n))
    (row,) = evaluation.padding_table(n, [world])
    assert row["counted_twice"] == len(padded) - n
    with pytest.raises(ValueError, match="subjects"):
        evaluation.shard("by_volunteer", n, 0, world)


@pytest.mark.slow
def test_summed_counts_reproduce_one_process_and_padding_does_not():
    torch.manual_seed(0)
    result = launch(evaluation.evaluation_worker, 3, make_mlp().state_dict(), "recordings")
    reference = result[0]["reference"]
    for split in ("strided", "drop_last_remainder", "by_volunteer"):
        assert result[0][split]["summed_correct"] == reference["correct"]
        assert result[0][split]["summed_seen"] == reference["seen"]
    assert result[0]["padded"]["summed_seen"] == reference["seen"] + 1


# --------------------------------------------------------------------------- cost


def test_cost_is_time_times_cores_times_price():
    steps = pd.DataFrame({"setup": ["a", "b"], "workers": [1, 2], "threads": [1, 1],
                          "cores": [1, 2], "global_batch": [100, 100],
                          "step_seconds": [0.5, 0.3]})  # fmt: skip
    reach = pd.DataFrame({"global_batch": [100], "steps": [20]})
    prices = cost.Prices(usd_per_core_hour=3.6, watts_per_core=10.0)
    table = cost.cost_table(steps, reach, prices=prices)
    assert table["seconds"].tolist() == [20 * 0.5, 20 * 0.3]
    assert np.allclose(table["usd"], [10 * 1 * 3.6 / 3600, 6 * 2 * 3.6 / 3600])
    assert np.allclose(table["joules"], [10 * 10.0, 6 * 2 * 10.0])
    never = cost.cost_table(steps, reach.assign(steps=np.inf), prices)
    assert np.isinf(never["usd"]).all()
    assert cost.Setup(2, 1).name == "2 workers x 1 thread" and cost.Setup(1, 2).cores == 2



@pytest.mark.slow
def test_step_seconds_reads_the_all_reduces_of_a_step_from_ddps_own_log_and_counts_them():
    """Notebook 11 reads a step's buckets from what DDP logged (2 for the MLP: its first bucket
    past the 1 MB cap, then the rest) and counts the collectives of an untimed step: one
    all-reduce per logged bucket, of its bytes, and nothing else (the first step would show DDP's
    single first bucket, the second the broadcasts of its rebuilt layout, two steps twice as
    many), in each training of a launch; none for a worker alone."""
    from helpers.dist.buckets import bucket_plan

    timed = cost.step_seconds([cost.Setup(1, 1), cost.Setup(2, 1)], [256, 512], steps=4,
                              data="recordings")  # fmt: skip
    alone, ddp = timed[timed["workers"] == 1], timed[timed["workers"] == 2]
    assert alone["buckets"].tolist() == alone["calls"].tolist() == [[], []]
    plan = [bucket.nbytes for bucket in bucket_plan(make_mlp())]
    assert len(plan) == 2
    for logged, calls in zip(ddp["buckets"], ddp["calls"], strict=True):
        assert logged == plan
        assert calls == [("all-reduce", size) for size in logged]


def test_timing_configs_train_every_step_they_divide_by_even_where_an_epoch_is_short():
    from dataclasses import replace

    from helpers.data import load_har
    from helpers.training import train_in_process

    n = len(load_har("recordings").y_train)
    (config,) = cost.timing_configs([1024], n, steps=12, data="recordings")
    assert n // 1024 < 12  # one epoch is too short at this batch: the case that went wrong
    run = train_in_process(replace(config, record_loss=True), threads=1)
    # the loop's own record: a loss at each of the 12 steps that step_seconds divides by
    assert len(run.losses) == 12 and all(loss > 0 for loss in run.losses)


def test_the_count_is_where_the_moving_average_went_above_the_target_for_good():
    assert cost.moving_average([0.5, 0.7, 0.9, 0.8]) == pytest.approx([0.7, 0.8])
    assert cost.eval_every(64) == 32 and cost.eval_every(1024) == 2 and cost.eval_every(4096) == 1
    runs = pd.DataFrame({"global_batch": [64, 64, 64, 256], "seed": [0, 1, 2, 0],
                         "steps": [100, 300, np.inf, 40]})  # fmt: skip
    summary = cost.steps_summary(runs).set_index("global_batch")
    # the median with a seed that never held: finite while most seeds reached the target
    assert summary.loc[64, ["steps", "fewest", "most"]].tolist() == [300, 100, np.inf]
    assert summary.loc[64, "reached"] == 2 and summary.loc[64, "seeds"] == 3


@pytest.mark.slow
def test_steps_to_target_stops_once_the_count_held_or_gives_inf():
    # target 0: the first moving average counts (the 3rd evaluation, step 6 at every 2 steps);
    # the run stops at the 5th, 3 averages later and past 1.25 times the count
    reached = cost.steps_to_target(1024, 0.0, seed=0, max_epochs=3, data="recordings")
    assert reached["steps"] == 6 and reached["marks"] == [2, 4, 6, 8, 10]
    assert all(0 <= a <= 1 for a in reached["accuracies"])
    never = cost.steps_to_target(2048, target=1.01, seed=1, max_epochs=2, data="recordings")
    assert never["steps"] == np.inf and never["marks"] == [1, 2, 3, 4, 5, 6]


# --------------------------------------------------------------------------- every cell


def test_the_cell_guard_names_the_cell_that_left_a_process_or_a_socket():
    """Notebook 11 asserts at its end that no cell left anything; this is the guard failing."""
    from IPython.core.interactiveshell import InteractiveShell

    from helpers.notebook.cell_guard import watch_cells

    shell = InteractiveShell.instance()
    guard = watch_cells(shell, wait=0.5)
    try:
        shell.run_cell("x = 1", store_history=True)
        shell.run_cell("import subprocess, sys\n"
                       "child = subprocess.Popen([sys.executable, '-c', 'import time; "
                       "time.sleep(30)'])", store_history=True)  # fmt: skip
        shell.run_cell("import socket\nserver = socket.create_server(('127.0.0.1', 0))",
                       store_history=True)  # fmt: skip
        child, server = shell.user_ns["child"], shell.user_ns["server"]
        assert guard.cells == 3 and [f["cell"] for f in guard.found] == [2, 3]
        assert guard.found[0]["processes"] == [child.pid]
        assert guard.found[1]["listening"] == [f"127.0.0.1:{server.getsockname()[1]}"]
        shell.run_cell("child.kill(); child.wait(); server.close()", store_history=True)
        assert len(guard.found) == 2  # gone again: nothing new
    finally:
        guard.stop()
        shell.run_cell("child.kill(); child.wait(); server.close()")  # if an assert failed
        InteractiveShell.clear_instance()
    shell.run_cell("y = 2")  # not watched any more
    assert guard.cells == 4
