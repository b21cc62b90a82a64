"""The large-batch experiment: divergence, seeds, the tuning's bookkeeping, budgets."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from helpers.data import HARData, HARSpec
from helpers.experiments.large_batch import (
    BATCHES,
    LR_GRID,
    best_lr_table,
    diverged,
    epochs_to_reach,
    fit_lr_max,
    format_best_lr,
    format_loss_grid,
    format_plan,
    format_time_to_target,
    format_warmup,
    last_epoch_loss,
    predicted_best_lr,
    reordered,
    run_grid,
    time_to_target_table,
)
from helpers.training import TrainConfig, validate


def tiny_data(n: int = 300) -> HARData:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (n, 561)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + 2 * (X[:, 1] > 0)
    subjects = np.ones(n, dtype=np.int64)
    return HARData(X, y, subjects, X[:100], y[:100], subjects[:100], "standin", "data: tiny")


def test_the_grid_doubles_the_batch_and_steps_the_lr_by_root_two():
    assert np.array_equal(np.diff(np.log2(BATCHES)), np.ones(len(BATCHES) - 1))
    assert np.allclose(np.diff(np.log2(LR_GRID)), 0.5)
    for batch in BATCHES:  # every batch of the grid splits across 1, 2 and 4 workers
        for world in (1, 2, 4):
            validate(TrainConfig(global_batch=batch), world, HARSpec().n_rows("train"))


def test_a_recovered_spike_is_not_divergence():
    # steps_per_epoch 2: the last epoch's mean is compared with the first loss
    assert not diverged([1.8, 9.0, 1.0, 0.9], steps_per_epoch=2)  # catapult: up, then down
    assert diverged([1.8, 1.5, 1.9, 2.0], steps_per_epoch=2)  # ends above the start
    assert diverged([1.8, 1.0, float("nan"), 0.5], steps_per_epoch=2)  # not finite, ever
    assert diverged([1.8, float("inf"), 0.1, 0.1], steps_per_epoch=2)


def test_last_epoch_loss_averages_the_last_epochs_steps():
    assert last_epoch_loss([9.0, 9.0, 1.0, 2.0, 3.0], steps_per_epoch=3) == pytest.approx(2.0)
    assert last_epoch_loss([1.0, float("nan")], steps_per_epoch=2) == math.inf


def test_each_seed_gets_its_own_order_of_the_same_samples():
    data = tiny_data()
    X0, y0 = reordered(data, 0)
    X1, y1 = reordered(data, 1)
    assert np.array_equal(X0.numpy(), data.X_train)  # seed 0: as stored
    assert not np.array_equal(X1.numpy(), data.X_train)
    rows = {tuple(r) for r in X1.numpy()[:, :3].tolist()}
    assert rows == {tuple(r) for r in data.X_train[:, :3].tolist()}
    assert sorted(y1.tolist()) == sorted(y0.tolist())


def test_a_small_grid_trains_every_run_and_counts_its_budget():
    lines: list[str] = []
    grid = run_grid(
        tiny_data(), [50, 100], [0.01, 0.1], [0, 1], 2, threads=1, progress=lines.append
    )
    assert len(grid) == 8 and len(lines) == 4
    at_100 = grid[grid["global_batch"] == 100]
    assert (at_100["steps"] == 6).all() and (at_100["samples"] == 600).all()
    assert all(len(acc) == 2 for acc in grid["epoch_accuracies"])
    # seeds differ, the runs are otherwise equal
    one = grid[(grid["global_batch"] == 50) & (grid["lr"] == 0.1)]
    assert one["final_loss"].nunique() == 2
    warm = run_grid(tiny_data(), [50], [0.1], [0], 1, warmup_steps=3, threads=1)
    assert warm["warmup_steps"].tolist() == [3]
    assert warm["final_loss"].iloc[0] != one[one["seed"] == 0]["final_loss"].iloc[0]


def synthetic_grid() -> pd.DataFrame:
    rows = []
    losses = {  # (batch, lr): loss per seed
        (64, 0.1): [0.5, 0.6, 0.4],
        (64, 0.2): [0.45, 0.7, 0.5],
        (256, 0.1): [0.9, 0.9, 0.8],
        (256, 0.2): [0.7, 0.8, 0.85],
    }
    for (batch, lr), per_seed in losses.items():
        for seed, loss in enumerate(per_seed):
            rows.append(
                {
                    "global_batch": batch,
                    "lr": lr,
                    "seed": seed,
                    "epochs": 2,
                    "steps": 2 * (1024 // batch),
                    "samples": 2 * 1024,
                    "final_loss": loss,
                    "accuracy": 1 - loss,
                    "diverged": False,
                    "seconds": 2.0,
                    "epoch_accuracies": [0.5, 0.9] if seed else [0.85, 0.95],
                }
            )
    return pd.DataFrame(rows)


def test_the_best_lr_is_the_lowest_seed_mean_and_the_seeds_give_its_range():
    best = best_lr_table(synthetic_grid()).set_index("global_batch")
    assert best.loc[64, "best_lr"] == 0.1  # mean 0.5 against 0.55
    assert (best.loc[64, "lowest_seed_best"], best.loc[64, "highest_seed_best"]) == (0.1, 0.2)
    assert best.loc[256, "best_lr"] == 0.2
    assert best.loc[256, "final_loss"] == pytest.approx(0.7833, abs=1e-3)
    assert best.loc[256, "steps"] == 8


def test_mccandlish_best_lr_is_linear_below_the_noise_scale_and_flat_above():
    lr = predicted_best_lr(np.array([1.0, 2.0, 1e6]), lr_max=0.5, b_noise=1000)
    assert lr[1] / lr[0] == pytest.approx(2.0, rel=1e-3)
    assert lr[2] == pytest.approx(0.5, rel=1e-3)
    best = pd.DataFrame({"global_batch": [64, 256, 1024]})
    best["best_lr"] = predicted_best_lr(best["global_batch"], 0.3, 100)
    assert fit_lr_max(best, 100) == pytest.approx(0.3)


def test_time_to_target_reads_the_same_runs():
    grid = synthetic_grid()
    table = time_to_target_table(grid, best_lr_table(grid), target=0.9).set_index("global_batch")
    # at 64 (best lr 0.1): seed 0 reaches 90% after epoch 2, seeds 1 and 2 after epoch 2
    assert table.loc[64, "seeds_reaching"] == 3 and table.loc[64, "epochs"] == 2
    assert table.loc[64, "steps"] == 32 and table.loc[64, "samples"] == 2048
    assert table.loc[64, "seconds"] == pytest.approx(2.0)
    assert epochs_to_reach([0.5, 0.9], 0.95) is None
    assert epochs_to_reach([0.5, 0.9], 0.9) == 2


def test_the_tables_format():
    grid = synthetic_grid().assign(warmup_steps=0, peak_loss=1.0)
    best = best_lr_table(grid)
    assert "best lr" in format_best_lr(best)
    assert "0.500±0.100" in format_loss_grid(grid)
    assert "diverged" in format_warmup(grid)
    assert "seeds reaching" in format_time_to_target(time_to_target_table(grid, best, 0.9))
    plan = format_plan([64, 4096], 7415, 3)
    assert "3319" in plan  # 7415 - 4096 samples left out at batch 4096


def test_goyal_comparison_counts_their_steps():
    from helpers.experiments.large_batch import format_goyal, goyal_comparison

    table = goyal_comparison(7415, 2048, 3, 512, 4, 20, (0.2, 0.4)).set_index("")
    theirs, largest, warm = table.columns
    assert table.loc["budget, steps", theirs] == "14,040"  # 90 x 156
    assert table.loc["warm-up, steps", theirs] == "780"
    assert table.loc["warm-up, rate", theirs] == "0.1 to 3.2, linear"  # 0.1 x 8192 / 256
    assert table.loc["budget, steps", largest] == "9"
    # the warm-up runs: 4 epochs of 14 steps at batch 512, 20 of them warming up
    assert (table.loc["budget, steps", warm], table.loc["warm-up, steps", warm]) == ("56", "20")
    assert "27.6%" in format_goyal(table.reset_index())


def test_the_noise_scale_pools_the_seeds_before_dividing():
    from helpers.experiments.large_batch import format_noise_scale, noise_scale_during_training
    from helpers.training import TrainConfig

    config = TrainConfig(global_batch=50, lr=0.05, data="standin")
    table = noise_scale_during_training(
        tiny_data(), [0, 1], config, seeds=(0, 1, 2), local_batch=10, workers=3, n_batches=5,
        threads=1,
    )
    assert table["epochs"].tolist() == [0, 1] and (table["seeds"] == 3).all()
    assert (table["big_batch"] == 30).all()
    for row in table.itertuples():
        # the pooled ratio is a weighted mean of the seeds' ratios, so it lies between them,
        # and the seeds (weights, data order, batches) do not all agree
        assert row.b_simple == pytest.approx(row.trace / row.grad_sq)
        assert row.b_simple_low < row.b_simple_high
        assert row.b_simple_low <= row.b_simple <= row.b_simple_high
    assert "seeds' B_simple: from" in format_noise_scale(table)


def test_the_noise_scale_interval_inverts_the_predicted_growth():
    from helpers.experiments.large_batch import noise_scale_interval

    def growth(b_noise: float) -> float:
        return float(predicted_best_lr(2048, 1, b_noise) / predicted_best_lr(64, 1, b_noise))

    low, high = noise_scale_interval(2.0, 64, 2048, resolution=2)
    assert low == 0  # a growth of 1 or less: no noise scale is too small
    assert growth(high) == pytest.approx(4.0)
    low, high = noise_scale_interval(8.0, 64, 2048, resolution=2)
    assert (growth(low), growth(high)) == pytest.approx((4.0, 16.0))
    assert noise_scale_interval(20.0, 64, 2048, resolution=2)[1] == math.inf  # 40 > 32
