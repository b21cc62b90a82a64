"""Learning-rate schedules: linear scaling, warm-up, and independence from the world size."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.training import TrainConfig, run_training
from helpers.training.schedules import Constant, LinearWarmup, goyal_warmup, linearly_scaled_lr


@pytest.mark.parametrize("k", [0.25, 0.5, 1, 2, 4, 8, 16])
def test_scaling_is_linear_in_the_batch(k):
    assert linearly_scaled_lr(0.05, 256, int(256 * k)) == pytest.approx(0.05 * k)
    # doubling the batch doubles the lr, wherever one starts
    assert linearly_scaled_lr(0.05, 256, int(512 * k)) == pytest.approx(
        2 * linearly_scaled_lr(0.05, 256, int(256 * k))
    )


def test_scaling_refuses_empty_batches():
    with pytest.raises(ValueError, match="at least 1"):
        linearly_scaled_lr(0.05, 0, 256)
    with pytest.raises(ValueError, match="at least 1"):
        goyal_warmup(256, 0)


@pytest.mark.parametrize(("epochs", "steps_per_epoch"), [(5, 28), (2, 3), (2, 1), (0.5, 14)])
def test_warmup_reaches_the_target_exactly_at_the_end_of_the_warmup(epochs, steps_per_epoch):
    warm = LinearWarmup(epochs=epochs, start_factor=0.125)
    last = int(epochs * steps_per_epoch)  # the first step at the full rate
    factors = [warm.factor(step, steps_per_epoch) for step in range(last + 5)]
    assert factors[0] == pytest.approx(0.125)
    assert all(f < 1.0 for f in factors[:last])
    assert all(f == 1.0 for f in factors[last:])
    assert np.all(np.diff(factors[: last + 1]) > 0)  # rising all the way
    # linear: equal increments, (1 - start) / warm-up steps each
    np.testing.assert_allclose(np.diff(factors[: last + 1]), (1 - 0.125) / last)


def test_goyal_warmup_starts_at_the_base_rate_and_ends_at_the_scaled_rate():
    base_lr, base_batch, batch, spe = 0.05, 256, 2048, 3
    lr = linearly_scaled_lr(base_lr, base_batch, batch)
    warm = goyal_warmup(base_batch, batch, epochs=2)
    assert warm == LinearWarmup(epochs=2, start_factor=0.125)
    assert lr * warm.factor(0, spe) == pytest.approx(base_lr)  # step 0: the base rate
    assert lr * warm.factor(2 * spe, spe) == pytest.approx(lr)  # after 2 epochs: the scaled rate
    assert lr * warm.factor(spe, spe) == pytest.approx((base_lr + lr) / 2)  # half-way


@pytest.mark.parametrize("batch", [64, 128, 256])
def test_goyal_warmup_is_no_warmup_at_or_below_the_base_batch(batch):
    assert goyal_warmup(256, batch, epochs=2) == Constant()
    assert goyal_warmup(256, 4096, epochs=0) == Constant()


def test_constant_is_one_everywhere():
    assert {Constant().factor(step, 7) for step in range(50)} == {1.0}


# Global batch 512 (14 steps per epoch), 1 epoch, a warm-up over its first half: the lr changes
# inside an epoch and the warm-up ends in the middle of the run.
WARM = TrainConfig(
    global_batch=512,
    epochs=1,
    lr=linearly_scaled_lr(0.05, 256, 512),
    schedule=goyal_warmup(256, 512, epochs=0.5),
    data="standin",
    record_loss=True,
)


@pytest.fixture(scope="module")
def warm_runs():
    return run_training(1, WARM), run_training(2, WARM)


def test_a_warmup_trains_the_same_on_any_world_size(warm_runs):
    one, two = warm_runs
    assert one.steps == two.steps == 7352 // 512
    assert len(one.losses) == len(two.losses) == one.steps
    # the schedule depends on the step, not the world size: the same loss at every step
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-4, atol=1e-5)
    assert two.replicas_identical


@pytest.mark.slow
def test_the_loss_curve_does_see_the_schedule(warm_runs):
    one, _ = warm_runs
    without = run_training(1, TrainConfig(**{**WARM.__dict__, "schedule": Constant()}))
    assert without.losses[0] == pytest.approx(one.losses[0])  # same start, same first batch
    # a different schedule changes the curve by far more than the tolerance used above
    assert np.max(np.abs(np.array(without.losses) - np.array(one.losses))) > 1e-3


def test_a_warmup_counted_in_steps_ramps_from_zero_then_holds():
    from helpers.training.schedules import WarmupSteps

    warm = WarmupSteps(steps=20)
    assert [warm.factor(s, steps_per_epoch=14) for s in (0, 10, 20, 100)] == [0.0, 0.5, 1.0, 1.0]
    assert WarmupSteps(steps=4, start_factor=0.2).factor(2, 1) == pytest.approx(0.6)
    assert WarmupSteps(steps=0).factor(0, 1) == 1.0
