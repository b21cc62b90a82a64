"""The reference experiment: N workers do the same training as one, and their replicas agree."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
import workers

import helpers.reproduce as reproduce_module
from helpers.dist.cores import available_cores, plan_world_sizes
from helpers.dist.launch import launch
from helpers.dist.loopback import LOOPBACK
from helpers.experiments.scaling import sweep
from helpers.training import (
    TrainConfig,
    epoch_order,
    local_slice,
    run_training,
    run_trainings,
    steps_per_epoch,
    train_in_process,
    validate,
)
from helpers.training import loop as loop_module
from helpers.training.schedules import Constant, LinearWarmup, linearly_scaled_lr

TINY_RUN = ["--global-batch", "4096", "--epochs", "1", "--threads-per-worker", "1"]

# 4 steps of 512 keep these runs short: each step all-reduces, so 4 steps compare the two
# trainings' rounding four times over, and a different seed still ends elsewhere.
SHORT = TrainConfig(global_batch=512, epochs=1, max_steps=4, data="standin", return_weights=True)


@pytest.fixture(scope="module")
def one_worker():
    return run_training(1, SHORT)


@pytest.fixture(scope="module")
def two_workers():
    return run_training(2, SHORT)


@pytest.fixture
def steps_taken(monkeypatch) -> list[int]:
    """Every optimizer step the training loop takes in this process, counted as it is taken;
    each one also moves a fake ``time.perf_counter`` on by one second, so that a training's
    measured seconds count the steps it timed."""
    taken: list[int] = []
    real_step = loop_module.sgd_step

    def counted(*args, **kwargs):
        loss = real_step(*args, **kwargs)
        taken.append(1)
        return loss

    monkeypatch.setattr(loop_module, "sgd_step", counted)
    monkeypatch.setattr(time, "perf_counter", lambda: float(len(taken)))
    return taken


def test_two_workers_train_exactly_like_one(one_worker, two_workers):
    assert two_workers.steps == one_worker.steps == 4
    # Same weights up to float rounding (the sum of two half-batch gradients is added in a
    # different order than one whole-batch gradient), and so the same predictions.
    np.testing.assert_allclose(two_workers.weights[0], one_worker.weights[0], rtol=0, atol=1e-5)
    assert not np.array_equal(
        one_worker.weights[0],
        run_training(1, replace(SHORT, seed=1)).weights[0],
    ), "a different seed must give different weights, or this test proves nothing"
    assert abs(two_workers.accuracy - one_worker.accuracy) < 2 / 2947


def test_ddp_keeps_replicas_bit_identical(two_workers):
    assert two_workers.replicas_identical
    assert two_workers.checksums[0] == two_workers.checksums[1]
    assert np.array_equal(two_workers.weights[0], two_workers.weights[1])
    assert len(two_workers.digests) == 2 and two_workers.digests[0] == two_workers.digests[1]
    # a digest is SHA-256 of the float32 weights' bytes, parameter after parameter
    mine = hashlib.sha256(two_workers.weights[0].astype(np.float32).tobytes()).hexdigest()
    assert two_workers.digests[0] == mine


@pytest.mark.slow
def test_without_communication_replicas_drift_apart():
    run = run_training(2, TrainConfig(global_batch=512, epochs=1, data="standin", sync="none"))
    assert not run.replicas_identical
    assert run.checksums[0] != run.checksums[1]
    assert run.digests[0] != run.digests[1]


@pytest.mark.slow
def test_ddp_broadcast_repairs_different_seeds_but_hand_averaging_does_not():
    seeds = dict(global_batch=512, epochs=1, data="standin", seed_per_rank=True)
    assert run_training(2, TrainConfig(**seeds, sync="ddp")).replicas_identical
    assert not run_training(2, TrainConfig(**seeds, sync="allreduce")).replicas_identical


@pytest.mark.slow
def test_three_workers_train_like_one_oversubscribed_or_not():
    """An odd world size, where the cores allow it, else run anyway and flagged."""
    plan = plan_world_sizes([3], threads_per_worker=1)[0]
    if not plan.runs:
        plan = plan_world_sizes([3], threads_per_worker=1, oversubscribe=True)[0]
    config = replace(SHORT, global_batch=3072)  # 3 x 1024, 2 steps
    three = run_training(3, config, plan.threads_per_worker, plan.oversubscribed)
    assert three.oversubscribed == (3 > available_cores())
    assert three.replicas_identical and len(three.checksums) == 3
    alone = train_in_process(config, threads=1)
    assert three.steps == alone.steps
    # Averaging three gradients rounds (a third is not exact in binary) more than two do;
    # a different training differs by 1e-2 and more (see the seed check above).
    np.testing.assert_allclose(three.weights[0], alone.weights[0], rtol=0, atol=1e-4)
    assert abs(three.accuracy - alone.accuracy) < 2 / 2947


@pytest.mark.slow
def test_in_process_training_matches_the_workers_and_records_accuracy():
    """Notebook 06 trains in process on the grounds that it does what the workers do; and the
    per-epoch accuracy recorded inside the workers is the accuracy of the model at that point."""
    # 6 steps over 2 epochs: without SHORT's 4-step stop
    config = replace(SHORT, global_batch=2048, epochs=2, max_steps=None, record_accuracy=True)
    workers_run = run_training(2, config)
    alone = train_in_process(config, threads=1)
    np.testing.assert_allclose(workers_run.weights[0], alone.weights[0], rtol=0, atol=1e-5)
    assert len(workers_run.epoch_accuracies) == len(alone.epoch_accuracies) == 2
    np.testing.assert_allclose(workers_run.epoch_accuracies, alone.epoch_accuracies, atol=2 / 2947)
    assert workers_run.epoch_accuracies[-1] == workers_run.accuracy  # after the last epoch
    assert workers_run.epoch_accuracies[1] != workers_run.epoch_accuracies[0]


def test_local_slices_partition_every_global_batch():
    order = epoch_order(7352, epoch=3)
    assert torch.equal(order, epoch_order(7352, epoch=3))  # every worker sees the same order
    batch = order[:256]
    slices = [local_slice(batch, rank, 4) for rank in range(4)]
    assert all(len(s) == 64 for s in slices)
    assert torch.equal(torch.cat(slices), batch)
    assert steps_per_epoch(7352, 256) == 28 and steps_per_epoch(7352, 2048) == 3


@pytest.mark.parametrize(
    ("world", "batch", "message"),
    [
        (3, 256, "not divisible by 3 workers"),
        (1, 8192, "larger than the 7352"),
        (0, 256, "at least 1"),
    ],
)
def test_configurations_that_cannot_split_are_refused(world, batch, message):
    with pytest.raises(ValueError, match=message):
        validate(TrainConfig(global_batch=batch), world, 7352)


def test_a_training_asking_for_more_threads_than_its_launch_reserved_is_refused():
    with pytest.raises(ValueError, match="threads must be at least 1"):
        validate(TrainConfig(threads=0), 1, 7352)
    # before any worker starts: 1 worker of 1 thread reserved, a training asks for 2
    with pytest.raises(ValueError, match="asks for 2 threads where its launch reserved 1 per"):
        run_trainings(1, [TrainConfig(threads=2, data="standin")], threads_per_worker=1)


@pytest.mark.slow
def test_run_training_takes_a_world_plan(one_worker):
    plan = plan_world_sizes([1], threads_per_worker=1)[0]
    run = run_training(plan, SHORT)
    assert run.world == 1 and run.threads_per_worker == 1 and not run.oversubscribed
    assert run.checksums == one_worker.checksums


def test_the_step_count_is_the_steps_taken(steps_taken):
    alone = train_in_process(replace(SHORT, global_batch=3072), threads=1)
    assert alone.steps == len(steps_taken) > 0


def test_untimed_steps_change_the_clock_not_the_training(steps_taken):
    # 7352 // 4096 = 1 step per epoch: 2 epochs take 2 steps, so 2 untimed would leave none
    with pytest.raises(ValueError, match=r"untimed_steps must be from 0 to 1 .*2 steps"):
        validate(TrainConfig(global_batch=4096, epochs=2, untimed_steps=2), 1, 7352)
    config = TrainConfig(global_batch=2048, epochs=2, data="standin", return_weights=True)
    timed_all = train_in_process(config, threads=1)
    all_steps = len(steps_taken)
    timed_late = train_in_process(replace(config, untimed_steps=4), threads=1)
    assert timed_late.checksums == timed_all.checksums and timed_late.steps == timed_all.steps
    # the fake clock moves one second a step: the clock ran over every step, then all but 4
    assert (timed_all.seconds, timed_late.seconds) == (all_steps, all_steps - 4)


def test_schedules_scale_linearly_and_warm_up_to_the_target():
    assert linearly_scaled_lr(0.05, 256, 2048) == pytest.approx(0.4)
    assert linearly_scaled_lr(0.05, 256, 64) == pytest.approx(0.0125)
    warm = LinearWarmup(epochs=2, start_factor=0.125)
    assert warm.factor(0, 10) == pytest.approx(0.125)
    assert warm.factor(10, 10) == pytest.approx(0.5625)
    assert warm.factor(19, 10) < 1.0 and warm.factor(20, 10) == 1.0 and warm.factor(99, 10) == 1.0
    assert Constant().factor(123, 10) == 1.0


def reproduce(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "helpers.reproduce", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--workers", "2", "--global-batch", "255"], "255 is not divisible by 2 workers"),
        (["--global-batch", "100000"], "larger than the 7352 training samples"),
        (["--threads-per-worker", "0"], "--threads-per-worker must be at least 1, got 0"),
        (["--data", "bogus"], "invalid choice: 'bogus'"),
        (["--epochs", "0"], "epochs must be at least 1"),
        (["--threads-per-worker", "100000"], "does not fit even 1 worker on"),
        (["--json", "{tmp}/a-file/runs.json"], "cannot write --json"),
        (["--json", "{tmp}"], "is a folder"),
    ],
)
def test_reproduce_refuses_bad_values_in_one_line(args, words, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = reproduce(*args, "--data", "standin") if "--data" not in args else reproduce(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and words in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "running" not in done.stderr  # nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written


@pytest.mark.slow
def test_reproduce_says_which_worker_failed_and_exits_1(monkeypatch, capsys):
    def failing_run(*args, **kwargs):
        return launch(workers.fail_on_rank, 2, 1, collective_timeout=30)  # real workers

    monkeypatch.setattr(reproduce_module, "run_training", failing_run)
    assert reproduce_module.main(["--workers", "1", "--data", "standin", *TINY_RUN]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "error: worker rank 1 of 2 failed: ValueError: bad input on rank 1"


def test_reproduce_interrupted_exits_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce_module, "run_training", interrupted)
    assert reproduce_module.main(["--workers", "1", "--data", "standin", *TINY_RUN]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted: all workers stopped"


@pytest.mark.slow
def test_reproduce_writes_one_record_per_run(tmp_path):
    out = tmp_path / "runs.json"
    done = reproduce(
        "--workers",
        "1",
        "2",
        "--global-batch",
        "1024",
        "--epochs",
        "1",
        "--data",
        "standin",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "stand-in" in done.stdout
    report = json.loads(out.read_text())
    assert report["data_source"] == "standin" and report["machine"]["cores"] >= 1
    runs = report["runs"]
    assert [r["world"] for r in runs] == [1, 2]
    for r in runs:
        assert r["global_batch"] == 1024 and r["epochs"] == 1 and r["seconds"] > 0
        assert r["replicas_identical"] and len(r["checksums"]) == r["world"]
        assert set(r) >= {"threads_per_worker", "accuracy", "startup_seconds"}
    assert abs(runs[0]["accuracy"] - runs[1]["accuracy"]) < 2 / 2947


@pytest.fixture
def network_attempts(monkeypatch):
    """Every attempt to reach the network over HTTP or HTTPS, by this process or any process it
    starts (they inherit the environment): a proxy on loopback that counts the connections made
    to it and answers none."""
    proxy = socket.create_server((LOOPBACK, 0))
    proxy.settimeout(0.05)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://{LOOPBACK}:{proxy.getsockname()[1]}")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    attempts: list[int] = []
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            try:
                proxy.accept()[0].close()
            except TimeoutError:
                continue
            attempts.append(1)

    counter = threading.Thread(target=count)
    counter.start()
    yield attempts
    stop.set()
    counter.join()
    proxy.close()


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["run_training", "sweep"])
def test_the_default_data_is_what_har_data_says(entry, monkeypatch, tmp_path, network_attempts):
    """TrainConfig's default must mean $HAR_DATA (else auto), in the caller and the workers:
    with HAR_DATA=standin nothing may try the network, as "auto" would in an empty folder."""
    monkeypatch.setenv("HAR_DATA", "standin")
    monkeypatch.setenv("HAR_ROOT", str(tmp_path / "har"))
    if entry == "run_training":
        sources = [run_training(2, TrainConfig(global_batch=4096, epochs=1)).data_source]
    else:
        table = sweep([4096], world_sizes=[1], min_steps=1, threads=1)
        sources = [table.attrs["data_source"]]
    assert sources == ["standin"] and network_attempts == []
    # the proxy sees what a worker tries, or the check above proves nothing
    assert "could not download UCI HAR" in launch(workers.try_to_download, 1)[0]
    assert network_attempts, "a worker's download did not reach the proxy"
