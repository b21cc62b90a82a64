"""The large-batch experiment driver: policies, sweep bookkeeping, time-to-accuracy arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from helpers.data import load_har
from helpers.large_batch import (
    BASE_BATCH,
    BASE_LR,
    BATCHES,
    Candidate,
    diverged,
    epochs_to_reach,
    last_epoch_loss,
    make_policies,
    run_sweep,
    sharpness,
    sharpness_during_training,
    time_to_accuracy,
    time_to_accuracy_table,
)
from helpers.model import make_mlp
from helpers.schedules import Constant, LinearWarmup
from helpers.training import TrainConfig, epochs_for_min_steps, lr_at, train_in_process

CONSTANT, LINEAR, WARMUP = make_policies(warmup_epochs=2)


def test_the_batches_double_from_64_to_4096():
    assert BATCHES == (64, 128, 256, 512, 1024, 2048, 4096)


@pytest.mark.parametrize("batch", BATCHES)
def test_policies_give_the_right_lr_per_batch(batch):
    k = batch / BASE_BATCH
    assert CONSTANT.lr(batch) == BASE_LR
    assert LINEAR.lr(batch) == pytest.approx(BASE_LR * k)
    assert WARMUP.lr(batch) == pytest.approx(BASE_LR * k)  # the target; the warm-up leads there
    assert CONSTANT.schedule(batch) == LINEAR.schedule(batch) == Constant()
    if batch > BASE_BATCH:
        assert WARMUP.schedule(batch) == LinearWarmup(epochs=2, start_factor=1 / k)
    else:
        assert WARMUP.schedule(batch) == Constant()


def test_warmup_runs_from_the_base_lr_to_the_scaled_lr():
    config = WARMUP.config(4096, epochs=10, data="standin")
    spe = 7352 // 4096  # 1 step per epoch: the warm-up is 2 steps
    assert lr_at(config, 0, spe) == pytest.approx(BASE_LR)
    assert lr_at(config, 1, spe) == pytest.approx((BASE_LR + 0.8) / 2)
    assert lr_at(config, 2, spe) == pytest.approx(0.8)
    assert lr_at(config, 9, spe) == pytest.approx(0.8)
    assert lr_at(CONSTANT.config(4096, epochs=10), 0, spe) == BASE_LR


def test_at_the_base_batch_every_policy_is_the_same_run():
    configs = {p.config(BASE_BATCH, 3, data="standin") for p in (CONSTANT, LINEAR, WARMUP)}
    assert len(configs) == 1
    assert len({p.config(64, 3) for p in (CONSTANT, LINEAR, WARMUP)}) == 2  # warm-up = linear
    assert len({p.config(512, 3) for p in (CONSTANT, LINEAR, WARMUP)}) == 3


def test_epochs_to_reach_counts_from_one():
    curve = [0.5, 0.7, 0.69, 0.9, 0.95]
    assert epochs_to_reach(curve, 0.4) == 1
    assert epochs_to_reach(curve, 0.7) == 2  # reaching the target exactly counts
    assert epochs_to_reach(curve, 0.8) == 4
    assert epochs_to_reach(curve, 0.96) is None
    assert epochs_to_reach([], 0.1) is None


def test_time_to_accuracy_is_epochs_times_seconds_per_epoch():
    curve = [0.5, 0.7, 0.9]
    assert time_to_accuracy(curve, 0.8, seconds_per_epoch=2.5) == pytest.approx(7.5)
    assert time_to_accuracy(curve, 0.5, seconds_per_epoch=2.5) == pytest.approx(2.5)
    assert time_to_accuracy(curve, 0.99, seconds_per_epoch=2.5) == math.inf


def test_time_to_accuracy_table_on_synthetic_numbers():
    sweep = pd.DataFrame(
        [
            {"global_batch": 64, "policy": "constant lr", "lr": 0.05,
             "epoch_accuracies": [0.80, 0.90, 0.92]},
            {"global_batch": 1024, "policy": "warm", "lr": 0.2,
             "epoch_accuracies": [0.50, 0.85, 0.91]},
            {"global_batch": 1024, "policy": "constant lr", "lr": 0.05,
             "epoch_accuracies": [0.30, 0.40, 0.50]},
        ]
    )  # fmt: skip
    seconds = pd.DataFrame(
        [
            {"world": 1, "global_batch": 64, "seconds_per_epoch": 4.0},
            {"world": 1, "global_batch": 1024, "seconds_per_epoch": 2.0},
            {"world": 2, "global_batch": 1024, "seconds_per_epoch": 1.25},
        ]
    )
    candidates = [
        Candidate(1, 64, "constant lr"),
        Candidate(1, 1024, "warm"),
        Candidate(2, 1024, "warm"),
        Candidate(2, 1024, "constant lr"),
        Candidate(4, 1024, "warm"),  # not measured (does not fit the cores): left out
    ]
    table = time_to_accuracy_table(candidates, sweep, seconds, target=0.9)
    assert table["configuration"].tolist() == [
        "1 worker, batch 64, constant lr",
        "1 worker, batch 1024, warm",
        "2 workers, batch 1024, warm",
        "2 workers, batch 1024, constant lr",
    ]
    assert table["epochs_to_target"].tolist()[:3] == [2, 3, 3]
    assert pd.isna(table["epochs_to_target"].iloc[3])
    assert table["seconds_to_target"].tolist() == pytest.approx([8.0, 6.0, 3.75, math.inf])
    assert table["speedup"].tolist() == pytest.approx([1.0, 8 / 6, 8 / 3.75, 0.0])


def test_time_to_accuracy_table_refuses_a_run_the_sweep_lacks():
    sweep = pd.DataFrame([{"global_batch": 64, "policy": "a", "lr": 0.1, "epoch_accuracies": [1]}])
    seconds = pd.DataFrame([{"world": 1, "global_batch": 128, "seconds_per_epoch": 1.0}])
    with pytest.raises(ValueError, match="batch 128"):
        time_to_accuracy_table([Candidate(1, 128, "a")], sweep, seconds, 0.5)


def test_timing_epochs_time_enough_steps():
    assert epochs_for_min_steps(64, 7352, 8) == 1  # 114 steps in one epoch
    assert epochs_for_min_steps(2048, 7352, 8) == 3  # 3 steps per epoch: 3 epochs for 8 steps
    assert epochs_for_min_steps(4096, 7352, 8) == 8
    with pytest.raises(ValueError, match="larger than"):
        epochs_for_min_steps(8192, 7352, 8)


def test_a_small_sweep_tabulates_every_pair_and_reuses_equal_runs():
    lines: list[str] = []
    table = run_sweep([256, 2048], (CONSTANT, LINEAR, WARMUP), 1, "standin", 1, lines.append)
    assert len(table) == len(lines) == 6
    assert table["same_as"].tolist() == ["", "constant lr", "constant lr", "", "", ""]
    at_base = table[table["global_batch"] == 256]
    assert at_base["accuracy"].nunique() == 1 and at_base["last_epoch_loss"].nunique() == 1
    big = table[table["global_batch"] == 2048].set_index("policy")
    assert big["lr"].tolist() == pytest.approx([0.05, 0.4, 0.4])
    assert (big["steps"] == 3).all() and (table[table["global_batch"] == 256]["steps"] == 28).all()
    assert big["warmup_epochs"].tolist() == [0.0, 0.0, 2.0]
    # the three policies really trained differently at 2048
    assert big["last_epoch_loss"].nunique() == 3
    assert all(
        len(losses) == steps for losses, steps in zip(table["losses"], table["steps"], strict=True)
    )
    assert all(len(curve) == 1 for curve in table["epoch_accuracies"])
    assert "the same run as constant lr" in lines[1]


def test_divergence_means_the_loss_rose_above_its_start():
    assert not diverged([1.8, 1.2, 0.9, 1.1])  # noisy, but never above where it started
    assert diverged([1.8, 2.5, 1.7])
    assert diverged([1.8, 1.0, float("nan")])
    assert diverged([1.8, float("inf")])


def test_last_epoch_loss_averages_the_last_epochs_steps():
    assert last_epoch_loss([9.0, 9.0, 1.0, 2.0, 3.0], steps_per_epoch=3) == pytest.approx(2.0)
    assert last_epoch_loss([9.0, 4.0], steps_per_epoch=1) == 4.0
    assert last_epoch_loss([1.0, float("nan")], steps_per_epoch=2) == math.inf


def test_sharpness_matches_the_hessian_of_a_softmax_model():
    # Logits W x with W = 0 and 2 classes: both probabilities are 1/2, and the Hessian of the
    # mean cross-entropy is [[1, -1], [-1, 1]] / 4 (x) X^T X / n, whose largest eigenvalue is
    # 1/2 times that of X^T X / n.
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(200, 5, generator=gen) * torch.tensor([3.0, 1.0, 1.0, 0.5, 0.2])
    y = torch.randint(0, 2, (200,), generator=gen)
    model = nn.Linear(5, 2, bias=False)
    nn.init.zeros_(model.weight)
    expected = 0.5 * np.linalg.eigvalsh((X.T @ X / len(X)).double().numpy()).max()
    assert sharpness(model, X, y, iters=100) == pytest.approx(expected, rel=1e-3)
    # scaling the inputs by 2 scales the curvature by 4
    assert sharpness(model, 2 * X, y, iters=100) == pytest.approx(4 * expected, rel=1e-3)


def test_sharpness_during_training_reports_the_stable_lr():
    """It trains for each number of epochs, as train_in_process does, then measures."""
    config = TrainConfig(global_batch=2048, epochs=1, lr=0.5, data="standin", return_weights=True)
    table = sharpness_during_training([0, 1], config, n_samples=32, iters=3, threads=1)
    assert table["epochs"].tolist() == [0, 1]
    at_start, trained = table["sharpness"].tolist()
    assert trained != at_start  # the second point really was trained
    np.testing.assert_allclose(table["max_stable_lr"], [2 / at_start, 2 / trained])
    # the same training done by train_in_process, measured by hand, gives the same sharpness
    model = make_mlp()
    weights = train_in_process(config, threads=1).weights[0]
    torch.nn.utils.vector_to_parameters(torch.from_numpy(weights).float(), model.parameters())
    data = load_har("standin")
    X, y = torch.from_numpy(data.X_train[:32]), torch.from_numpy(data.y_train[:32])
    assert sharpness(model, X, y, iters=3) == pytest.approx(trained, rel=1e-4)
