"""Notebook 06: DDP's buckets as DDP builds them, gradient accumulation with and without
no_sync(), the hooks Gloo refuses and the configuration of PowerSGD that works on it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import workers

from helpers import buckets as bk
from helpers.comm_engineering import ONE_BUCKET_MB, model_step_seconds
from helpers.comm_hooks import POWERSGD_START_ITER, CommHook, bytes_per_step
from helpers.comm_model import AlphaBeta
from helpers.launch import launch
from helpers.model import gradient_bytes, make_mlp
from helpers.replicas import SAME_TRAINING_ATOL, gap_to_reference
from helpers.scaling import ComputeModel
from helpers.training import TrainConfig, run_trainings, train_in_process, validate

CAPS = [None, 0.001, 1, ONE_BUCKET_MB]
STEPS = 5
RANK = 2
SHAPES = [tuple(p.shape) for p in make_mlp().parameters()]


@pytest.fixture(scope="module")
def ddp_facts():
    return launch(workers.ddp_communication, 2, CAPS, STEPS, RANK)


def test_bucket_plan_is_the_buckets_ddp_builds(ddp_facts):
    for cap in CAPS:
        plan = [b.nbytes for b in bk.bucket_plan(make_mlp(), cap)]
        for rank in ddp_facts:
            assert rank["rebuilt"][str(cap)] == ", ".join(map(str, plan)), cap
    # the default gives two buckets (the first capped at 1 MiB), an explicit 25 MiB one
    assert len(bk.bucket_plan(make_mlp())) == 2
    assert len(bk.bucket_plan(make_mlp(), 25)) == 1


def test_no_sync_all_reduces_once_per_step_without_it_once_per_micro_batch(ddp_facts):
    # DDP's first backward all-reduces a single bucket; it rebuilds its buckets (2) after it
    buckets = len(bk.bucket_plan(make_mlp()))
    for rank in ddp_facts:
        assert rank["calls"][False] == 1 + buckets * (STEPS - 1)
        assert rank["calls"][True] == 1 + buckets * (4 * STEPS - 1)


def test_powersgd_bytes_are_what_pytorch_says_it_sent(ddp_facts):
    compressed_steps = STEPS - POWERSGD_START_ITER
    for rank in ddp_facts:
        _, before, after = rank["powersgd"]
        assert before == compressed_steps * gradient_bytes(make_mlp()) // 4
        assert 4 * after == compressed_steps * bytes_per_step(SHAPES, CommHook.POWER_SGD, RANK)
    assert bytes_per_step(SHAPES, CommHook.FP16) == gradient_bytes(make_mlp()) // 2


def test_gloo_refuses_bf16_and_powersgd_on_several_buckets_with_what_to_do():
    with pytest.raises(ValueError, match="use CommHook.FP16"):
        validate(TrainConfig(comm_hook=CommHook.BF16), 2, 7000)
    with pytest.raises(ValueError, match=f"bucket_cap_mb={ONE_BUCKET_MB} or more"):
        validate(TrainConfig(comm_hook=CommHook.POWER_SGD), 2, 7000)
    with pytest.raises(ValueError, match="bucket_cap_mb=7"):
        validate(TrainConfig(comm_hook=CommHook.POWER_SGD, bucket_cap_mb=1), 2, 7000)
    validate(TrainConfig(comm_hook=CommHook.POWER_SGD, bucket_cap_mb=ONE_BUCKET_MB), 2, 7000)
    with pytest.raises(ValueError, match="sync='ddp'"):
        validate(TrainConfig(sync="allreduce", comm_hook=CommHook.FP16), 2, 7000)
    with pytest.raises(ValueError, match="equal micro-batches"):
        validate(TrainConfig(global_batch=256, accumulation_steps=3), 2, 7000)


def test_accumulation_and_powersgd_on_one_bucket_train_with_identical_replicas():
    """The fix for PowerSGD on Gloo, one bucket, trains (on 2 workers, replicas identical), and
    really compresses; accumulating 4 micro-batches, with no_sync() or without, is the training
    without accumulation, to rounding."""
    base = TrainConfig(global_batch=512, epochs=1, max_steps=8, data="standin", return_weights=True)
    configs = [
        base,
        replace(base, accumulation_steps=4),
        replace(base, accumulation_steps=4, sync_every_micro_batch=True),
        replace(base, comm_hook=CommHook.POWER_SGD, bucket_cap_mb=ONE_BUCKET_MB),
    ]
    plain, no_sync, every, powersgd = run_trainings(2, configs)
    assert all(r.replicas_identical for r in (plain, no_sync, every, powersgd))
    assert gap_to_reference(no_sync, plain) <= SAME_TRAINING_ATOL
    assert gap_to_reference(every, plain) <= SAME_TRAINING_ATOL
    # a rank-1 approximation of the gradients is no rounding: the weights move elsewhere
    assert gap_to_reference(powersgd, plain) > SAME_TRAINING_ATOL
    assert math.isfinite(powersgd.accuracy) and powersgd.accuracy > 1 / 6


def test_pipeline_hides_what_backward_covers():
    # two buckets of 1 s each, ready at 0.5 s and at the end of a 2 s backward
    pipe = bk.pipeline([0.5, 2.0], [1.0, 1.0], 2.0)
    assert list(pipe.starts) == [0.5, 2.0] and pipe.exposed == 1.0 and pipe.total == 2.0
    # a bucket that cannot start before the previous one ends
    pipe = bk.pipeline([0.5, 1.0], [2.0, 1.0], 2.0)
    assert list(pipe.starts) == [0.5, 2.5] and pipe.exposed == 1.5
    shares = bk.backward_shares([(561, 1024), (1024, 1024), (1024, 6)])
    assert np.isclose(shares.sum(), 1) and shares.argmax() == 1
    compute, comm = ComputeModel(c0=2e-3, c1=80e-6), AlphaBeta(alpha=2e-4, beta=5e-10)
    no = model_step_seconds(compute, comm, 2048, 2, overlap=False)
    assert np.isclose(no, 2e-3 + 80e-6 * 1024 + 2 * 2e-4 + 5e-10 * gradient_bytes(make_mlp()))
    with_overlap = model_step_seconds(compute, comm, 2048, 2)
    one_bucket = model_step_seconds(compute, comm, 2048, 2, bucket_cap_mb=ONE_BUCKET_MB)
    assert with_overlap < one_bucket < no  # one bucket: no overlap, but one latency fewer


def test_max_steps_stops_mid_epoch_without_evaluating_a_partial_epoch():
    one_step_epochs = TrainConfig(global_batch=4096, epochs=5, max_steps=3, data="standin")
    run = train_in_process(replace(one_step_epochs, record_accuracy=True, record_loss=True), 1)
    assert run.steps == 3 and len(run.losses) == 3 and len(run.epoch_accuracies) == 3
    mid_epoch = TrainConfig(global_batch=2048, epochs=2, max_steps=2, data="standin")
    run = train_in_process(replace(mid_epoch, record_accuracy=True), 1)
    assert run.steps == 2 and run.epoch_accuracies == []
