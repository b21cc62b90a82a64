"""Notebook 06's experiment: runs to a loss target, the best rate per batch, the steps-samples
fit and the noise scale along a run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from helpers.data import HARData
from helpers.experiments.large_batch import (
    HOLD,
    at_best_rate,
    best_per_batch,
    checkpoints,
    confirmed_by,
    diverged,
    eval_subset,
    fit_steps_samples,
    format_best,
    format_noise,
    format_runs,
    noise_scale_along_run,
    pooled_noise_scale,
    reordered,
    runs_to_target,
    stays_below,
    train_counting,
    train_to_target,
)
from helpers.training import TrainConfig


def tiny_data(n: int = 300) -> HARData:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (n, 561)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + 2 * (X[:, 1] > 0)
    subjects = np.ones(n, dtype=np.int64)
    return HARData(X, y, subjects, X[:100], y[:100], subjects[:100], "standin", "data: tiny")


def test_checkpoints_count_every_step_then_grow_by_about_ten_percent():
    marks = checkpoints(200)
    assert marks[:10] == list(range(1, 11)) and marks[-1] == 200
    before = np.array(marks[:-1])
    assert (np.diff(marks) >= 1).all()
    assert (np.diff(marks) <= np.maximum(1, 0.1 * before + 0.5)).all()  # 10%, rounded
    assert checkpoints(1) == [1]
    with pytest.raises(ValueError, match="growth"):
        checkpoints(10, growth=1.0)


def test_a_run_that_ends_above_its_start_diverged_a_recovered_spike_did_not():
    assert not diverged(1.8, [9.0, 1.0, 0.9])  # catapult: up, then down
    assert diverged(1.8, [1.5, 1.9, 1.97])  # ends above the start: worse than it began
    assert diverged(1.8, [1.0, math.nan, 0.5])
    assert diverged(1.8, [math.inf])


def test_each_seed_gets_its_own_order_of_the_same_samples():
    data = tiny_data()
    X0, _ = reordered(data, 0)
    X1, y1 = reordered(data, 1)
    assert np.array_equal(X0.numpy(), data.X_train)
    assert not np.array_equal(X1.numpy(), data.X_train)
    assert sorted(y1.tolist()) == sorted(data.y_train.tolist())


def test_the_evaluation_subset_is_fixed_and_spread_over_the_training_set():
    data = tiny_data(3000)
    X, y = eval_subset(data, 1000)
    assert len(X) == 1000 and np.array_equal(X[1].numpy(), data.X_train[3])
    assert np.array_equal(eval_subset(data, 1000)[0].numpy(), X.numpy())


def test_a_dip_below_the_target_counts_only_once_the_loss_stays_below():
    steps = [1, 2, 3, 4, 5, 6, 7, 8]
    losses = [1.0, 0.3, 0.6, 0.35, 0.3, 0.2, 0.25, 0.2]  # dips at 2, back up at 3, below from 4
    assert stays_below(steps[:2], losses[:2], 0.4, hold=1) == 2  # the first crossing alone
    assert stays_below(steps[:3], losses[:3], 0.4, hold=1) is None  # it came back up
    assert stays_below(steps[:4], losses[:4], 0.4, hold=1.25) is None  # below, not yet for long
    assert stays_below(steps[:5], losses[:5], 0.4, hold=1.25) == 4  # held until step 5 = 1.25 x 4
    assert stays_below(steps, losses, 0.4) == 4
    assert stays_below(steps[:2], losses[:2], 0.4, hold=1, evals=2) is None  # one evaluation
    assert stays_below(steps[:5], losses[:5], 0.4, hold=1, evals=3) is None  # two in a row
    assert stays_below(steps[:6], losses[:6], 0.4, hold=1, evals=3) == 4  # three: 4, 5 and 6
    with pytest.raises(ValueError, match="hold"):
        stays_below(steps, losses, 0.4, hold=0.5)
    with pytest.raises(ValueError, match="evals"):
        stays_below(steps, losses, 0.4, evals=0)


def test_a_run_stops_once_the_loss_has_stayed_below_the_target():
    data = tiny_data()
    full = train_to_target(data, 50, 0.1, 0, target=0.0, max_steps=30, threads=1)
    assert not full.reached and full.steps == full.steps_run == 30
    assert full.checkpoints == checkpoints(30)
    target = full.losses[10]  # a loss the same run reaches at its 11th checkpoint
    run = train_to_target(data, 50, 0.1, 0, target=target, max_steps=30, threads=1, hold=HOLD)
    assert run.reached and run.samples == run.steps * 50 and run.final_loss <= target
    assert run.losses == full.losses[: len(run.losses)]  # the same run, stopped early
    at = run.checkpoints.index(run.steps)
    # the count is where the loss went below for good, and the run went on 25% beyond it
    assert max(run.losses[at:]) <= target and (at == 0 or run.losses[at - 1] > target)
    assert run.steps_run >= 1.25 * run.steps and run.steps_run == run.checkpoints[-1]
    first = train_to_target(data, 50, 0.1, 0, target=target, max_steps=30, threads=1)  # hold 1
    assert first.steps == first.steps_run == full.checkpoints[10]  # the first checkpoint below
    three = train_to_target(data, 50, 0.1, 0, target=target, max_steps=30, threads=1, evals=3)
    at = three.checkpoints.index(three.steps)
    # the count: the first of three evaluations in a row below the target; it stops at the third
    assert three.losses == full.losses[: len(three.losses)] and len(three.losses) == at + 3
    assert max(three.losses[at:]) <= target and (at == 0 or three.losses[at - 1] > target)


def test_after_step_sees_the_model_before_and_after_every_step():
    seen: list[int] = []
    train_to_target(tiny_data(), 50, 0.1, 0, 0.0, 5, threads=1,
                    after_step=lambda step, model: seen.append(step))  # fmt: skip
    assert seen == [0, 1, 2, 3, 4, 5]


def test_the_loop_measures_before_the_first_step_and_at_each_mark_until_the_count():
    """The one loop behind notebook 06's counts and notebook 11's (``cost.steps_to_target``)."""
    seen: list[int] = []

    def measure(model) -> float:
        seen.append(len(seen))
        return float(len(seen))

    def count(done: list[int], values: list[float]) -> int | None:
        return done[1] if len(done) == 3 else None  # holds at the third mark

    run = train_counting(tiny_data(), TrainConfig(global_batch=50, lr=0.1), [2, 4, 6, 8, 10],
                         measure, count, threads=1)  # fmt: skip
    assert run.first == 1.0 and run.marks == [2, 4, 6] and run.values == [2.0, 3.0, 4.0]
    assert run.count == 4 and run.seconds > 0
    with pytest.raises(ValueError, match="mark"):
        train_counting(tiny_data(), TrainConfig(global_batch=50, lr=0.1), [], measure, count)


def test_a_batch_larger_than_the_data_is_refused():
    with pytest.raises(ValueError, match="larger than"):
        train_to_target(tiny_data(), 500, 0.1, 0, 0.5, 5, threads=1)


def test_a_slow_rate_stops_once_its_count_could_not_be_under_twice_the_best():
    data = tiny_data()
    probe = train_to_target(data, 50, 0.2, 0, 0.0, 40, threads=1)
    target = probe.losses[12]
    runs = runs_to_target(data, [50], [0.2, 1e-6], [0], target, max_samples=50 * 200, threads=1)
    fast, slow = runs.iloc[0], runs.iloc[1]
    assert fast["reached"] and not slow["reached"]
    # the last checkpoint at or below twice the best count, not the cap of 200 steps
    assert slow["steps_run"] == max(m for m in checkpoints(200) if m <= 2 * fast["steps"])
    assert slow["cut"] and not fast["cut"]  # stopped by that rule, short of the budget
    assert "1 cut" in format_runs(runs)
    with pytest.raises(ValueError, match="slack"):
        runs_to_target(data, [50], [0.1], [0], 0.5, 1000, slack=1.0)


def test_a_capped_run_has_the_evaluations_of_an_uncapped_one_up_to_its_confirmation():
    # a count of 30 needs 3 evaluations from checkpoint 29 on (29, 32, 35), then 25% more steps
    assert confirmed_by(30, 1000, evals=3) == 35
    assert confirmed_by(30, 1000, hold=1.25) == math.ceil(1.25 * 29)
    assert confirmed_by(30, 33, evals=3) == 33  # never past the cap
    limit = confirmed_by(30, 1000, evals=3)
    assert checkpoints(limit) == checkpoints(1000)[: len(checkpoints(limit))]


def test_each_batch_runs_its_own_grid_and_skips_rates_below_one_that_lost():
    data = tiny_data()
    probe = train_to_target(data, 50, 0.2, 0, 0.0, 40, threads=1)
    grids = {50: [0.2, 0.02, 0.002], 25: [0.2]}
    runs = runs_to_target(data, [50, 25], grids, [0], probe.losses[12], 50 * 200, threads=1)
    ran = runs.groupby("global_batch")["lr"].apply(list).to_dict()
    # 0.02 lost to 0.2 (missed within twice its steps): 0.002, lower still, is not run
    assert ran == {25: [0.2], 50: [0.2, 0.02]}
    assert not runs.set_index("lr").loc[0.02, "reached"].all()


def test_rates_above_a_diverged_one_are_not_run():
    runs = runs_to_target(tiny_data(), [50], [0.1, 1e4, 1e5], [0], 0.0, 50 * 20, threads=1)
    assert runs["lr"].tolist() == [0.1, 1e4] and runs.iloc[1]["diverged"]


def test_a_rate_whose_first_seed_missed_runs_no_other_seed():
    """The best rate needs every seed at the target: a rate one seed missed is out, and its
    other seeds, the costliest runs (they go to the cap), are not run."""
    data = tiny_data()
    probe = train_to_target(data, 50, 0.2, 0, 0.0, 40, threads=1)
    runs = runs_to_target(data, [50], [0.2, 1e-6], [0, 1], probe.losses[12], 50 * 200, threads=1)
    per_rate = runs.groupby("lr")["seed"].apply(list).to_dict()
    assert per_rate == {0.2: [0, 1], 1e-6: [0]}
    assert runs.set_index("lr").loc[0.2, "reached"].iloc[0]  # seed 0 reached: seed 1 ran too
    assert not runs.set_index("lr").loc[1e-6, "reached"]  # seed 0 missed: seed 1 never ran


def test_every_seed_at_top_runs_the_top_rates_other_seeds_after_one_missed():
    """Whether the top rate of a grid loses then rests on every seed; lower rates keep the rule."""
    data = tiny_data()
    probe = train_to_target(data, 50, 0.2, 0, 0.0, 40, threads=1)
    target = probe.losses[12]
    runs = runs_to_target(data, [50], [1e-5, 1e-6], [0, 1], target, 50 * 30, threads=1,
                          every_seed_at_top=True)  # fmt: skip
    per_rate = runs.groupby("lr")["seed"].apply(list).to_dict()
    assert per_rate == {1e-5: [0, 1], 1e-6: [0]} and not runs["reached"].any()
    # no rate reached the target, so none was cut: each ran its whole budget of 30 steps
    assert not runs["cut"].any() and (runs["steps_run"] == 30).all()
    assert "0/2, 2 capped" in format_runs(runs)


def scripted(monkeypatch, counts: dict) -> list:
    """``runs_to_target`` over scripted runs: ``counts[(lr, seed)]`` is the step at which that
    run's loss stays below the target (None: never); a run reaches it within a limit at or past
    that step. Returns the (lr, seed, limit) of every run, in order."""
    from types import SimpleNamespace

    from helpers.experiments.large_batch import target as module

    calls = []

    def fake(data, batch, lr, seed, target, limit, **kw):
        calls.append((lr, seed, limit))
        count = counts[(lr, seed)]
        reached = count is not None and count <= limit
        return SimpleNamespace(global_batch=batch, lr=lr, seed=seed, reached=reached,
                               steps=count if reached else limit, steps_run=limit,
                               diverged=False)  # fmt: skip

    monkeypatch.setattr(module, "train_to_target", fake)
    return calls


def test_a_rates_later_seed_has_the_budget_its_earlier_seeds_left(monkeypatch):
    """With 2 seeds the median is their mean: a rate can beat a best median of 110 only if its
    seeds' counts add up to at most 220, so once seed 0 took 150, seed 1 has 70 steps left."""
    calls = scripted(monkeypatch, {(0.1, 0): 100, (0.1, 1): 120, (0.05, 0): 150, (0.05, 1): 80})
    runs = runs_to_target(None, [8], [0.1, 0.05], [0, 1], 0.4, 8 * 1000)
    assert calls[2:] == [(0.05, 0, confirmed_by(220, 1000)), (0.05, 1, confirmed_by(70, 1000))]
    assert runs["cut"].tolist() == [False, False, False, True]
    assert best_per_batch(runs)["best_lr"].tolist() == [0.1]


def test_the_top_rates_seeds_stop_once_slower_than_themselves_at_the_best_rate(monkeypatch):
    counts = {(0.1, 0): 100, (0.1, 1): 120, (0.2, 0): None, (0.2, 1): 200}
    calls = scripted(monkeypatch, counts)
    runs = runs_to_target(None, [8], [0.1, 0.2], [0, 1], 0.4, 8 * 1000, every_seed_at_top=True)
    # each seed until it passed its own count at 0.1, not twice the best median (220)
    assert calls[2:] == [(0.2, 0, confirmed_by(100, 1000)), (0.2, 1, confirmed_by(120, 1000))]
    assert "0/2, 2 cut" in format_runs(runs)
    assert best_per_batch(runs)["best_lr"].tolist() == [0.1]


def test_a_top_rate_seed_that_reaches_the_target_sends_the_others_back_to_the_budget(monkeypatch):
    """Seed 0 at 0.2 is slower than at 0.1 (105 > 100), but seed 1 much faster (60 < 120): their
    mean, 82.5, beats 0.1's 110, so seed 0 is run again with the budget seed 1 left (160)."""
    counts = {(0.1, 0): 100, (0.1, 1): 120, (0.2, 0): 105, (0.2, 1): 60}
    calls = scripted(monkeypatch, counts)
    runs = runs_to_target(None, [8], [0.1, 0.2], [0, 1], 0.4, 8 * 1000, every_seed_at_top=True)
    assert calls[2:] == [(0.2, 0, confirmed_by(100, 1000)), (0.2, 1, confirmed_by(120, 1000)),
                         (0.2, 0, confirmed_by(160, 1000))]  # fmt: skip
    assert len(runs) == 4 and runs["reached"].all()  # the rerun replaced the short run
    assert best_per_batch(runs)["best_lr"].tolist() == [0.2]


def fake_runs() -> pd.DataFrame:
    rows = []
    for batch, lr, seed, reached, steps in [
        (8, 0.1, 0, True, 100), (8, 0.1, 1, True, 120), (8, 0.2, 0, True, 80),
        (8, 0.2, 1, False, 400), (32, 0.1, 0, True, 60), (32, 0.1, 1, True, 70),
        (32, 0.2, 0, True, 50), (32, 0.2, 1, True, 54), (128, 0.1, 0, False, 9),
        (128, 0.1, 1, True, 9),
    ]:  # fmt: skip
        rows.append({"global_batch": batch, "lr": lr, "seed": seed, "reached": reached,
                     "steps": steps, "samples": steps * batch, "diverged": False})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_best_rate_needs_every_seed_there_in_the_fewest_median_steps():
    runs = fake_runs()
    best = best_per_batch(runs)
    # batch 8: 0.2 is faster for one seed but not every seed got there; batch 128: none did
    assert best["global_batch"].tolist() == [8, 32]
    assert best["best_lr"].tolist() == [0.1, 0.2] and best["steps"].tolist() == [110, 52]
    assert best["samples"].tolist() == [880, 52 * 32]
    assert len(at_best_rate(runs, best)) == 4
    assert "0.2" in format_best(best) and "1/2, 9 steps" in format_runs(runs)


def test_the_fit_recovers_a_known_trade_off():
    s_min, e_min = 100.0, 1600.0
    batches = np.array([8, 8, 32, 128, 512])
    s_fit, e_fit = fit_steps_samples(batches, s_min + e_min / batches)
    assert s_fit == pytest.approx(s_min) and e_fit == pytest.approx(e_min)
    with pytest.raises(ValueError, match="two batch sizes"):
        fit_steps_samples([8, 8], [10, 12])


def test_the_noise_scale_along_a_run_pools_the_seeds_before_dividing():
    along = noise_scale_along_run(tiny_data(), 50, 0.1, [0, 1], [0, 3], local_batch=10,
                                  workers=4, n_batches=5, threads=1)  # fmt: skip
    assert along[["seed", "step"]].values.tolist() == [[0, 0], [0, 3], [1, 0], [1, 3]]
    assert (along["trace"] > 0).all() and (along["loss"] > 0).all()
    pooled = pooled_noise_scale(along)
    first = along[along["step"] == 0]
    assert pooled["b_simple"].iloc[0] == pytest.approx(
        first["trace"].mean() / first["grad_sq"].mean()
    )
    assert "seeds: from" in format_noise(pooled, along)


def test_a_median_ending_in_a_half_is_printed_as_it_is():
    """Rounded, 134.5 steps would print as 134 beside 17,216 samples (134.5 x 128)."""
    runs = fake_runs().query("global_batch == 32")
    runs = runs.assign(global_batch=128, lr=0.1, steps=[109, 160, 109, 160])
    assert "2/2, 134.5 steps" in format_runs(runs.iloc[:2])
    best = best_per_batch(runs)
    assert "134.5" in format_best(best) and "17,216" in format_best(best)


def test_runs_that_missed_are_reported_apart_as_cut_diverged_or_capped():
    runs = fake_runs().assign(cut=False)
    runs.loc[3, "cut"] = True  # batch 8, rate 0.2, seed 1: cut
    runs.loc[8, "diverged"] = True  # batch 128, seed 0: diverged
    table = format_runs(runs)
    assert "1/2, 80 steps, 1 cut" in table and "1/2, 9 steps, 1 div" in table
    runs.loc[3, "cut"] = False  # missed within its whole budget
    assert "1/2, 80 steps, 1 capped" in format_runs(runs)


def test_a_grid_rate_not_run_shows_a_dash_and_one_outside_the_grid_a_blank():
    table = format_runs(fake_runs(), {8: [0.05, 0.1, 0.2], 32: [0.1, 0.2], 128: [0.1]})
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert "lr 0.05" in table and rows["8"].split()[1] == "-"
    assert "-" not in rows["32"] and "-" not in rows["128"]
