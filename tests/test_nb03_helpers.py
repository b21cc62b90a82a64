"""The helpers notebook 03 uses to compare replicas and runs (helpers/experiments/replicas.py)."""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from fakes import run_result

from helpers.data import ACTIVITIES, HARData, load_har
from helpers.experiments.replicas import (
    MISTAKES,
    SYNCS,
    GapProbe,
    class_balance,
    epoch_coverage,
    format_gap,
    gap_to_reference,
    initial_weights,
    mistake_configs,
    mistakes_table,
    reference_table,
    replica_gap,
    same_training,
    verdicts,
    weight_gap,
)
from helpers.notebook.plotting import plot_class_balance, plot_mistake_gaps
from helpers.training import TrainConfig, run_trainings, steps_per_epoch


def fake_run(weights: list[np.ndarray], world: int | None = None, accuracy: float = 0.9):
    """A RunResult as run_training would return it with return_weights=True."""
    world = world or len(weights)
    digests = {w.tobytes() for w in weights}
    return run_result(
        world=world,
        accuracy=accuracy,
        replicas_identical=len(digests) == 1,
        checksums=[float(w.sum()) for w in weights],
        accuracies=[accuracy + 0.01 * r for r in range(len(weights))],
        steps=28,
        data_source="standin",
        weights=weights,
    )


W = np.linspace(-1.0, 1.0, 11)


def test_weight_gaps_measure_the_largest_difference():
    assert weight_gap(W, W) == 0.0
    assert weight_gap(W, W + np.eye(11)[3] * 0.25) == pytest.approx(0.25)
    run = fake_run([W, W + 0.5, W - 0.75])
    assert replica_gap(run) == pytest.approx(0.75)
    assert replica_gap(fake_run([W])) == 0.0
    assert gap_to_reference(run, fake_run([W + 0.25])) == pytest.approx(1.0)


def test_same_training_allows_rounding_but_not_a_different_training():
    reference = fake_run([W])
    assert same_training(fake_run([W, W]), reference)
    assert same_training(fake_run([W + 1e-7, W + 1e-7]), reference)
    assert not same_training(fake_run([W, W + 1e-2]), reference)  # one replica off is enough
    assert not same_training(fake_run([W + 1e-7]), reference, atol=1e-8)


def test_gaps_need_the_weights():
    run = fake_run([W, W])
    run.weights = [None, None]
    with pytest.raises(ValueError, match="return_weights=True"):
        replica_gap(run)


def test_format_gap_says_zero_only_for_the_same_bits():
    assert format_gap(0.0) == "0"
    assert format_gap(3.2e-7) == "3e-07"
    assert format_gap(1e-300) != "0"


def test_mistake_configs_switch_on_one_mistake_per_row():
    base = TrainConfig(epochs=2, data="standin")
    configs = mistake_configs(base)
    assert list(configs) == [(m, s) for m in MISTAKES for s in SYNCS]
    assert len(configs) == 6
    for (mistake, sync), config in configs.items():
        assert config.sync == sync and config.epochs == 2 and config.return_weights
        assert config.seed_per_rank == (mistake == "different seeds")
        assert config.order_per_rank == (mistake == "different data orders")


def test_mistakes_table_has_one_row_per_run_and_each_replicas_numbers():
    reference = fake_run([W, W])
    runs = {
        ("different seeds", "ddp"): fake_run([W, W]),
        ("different seeds", "none"): fake_run([W, W + 0.5]),
        ("different data orders", "ddp"): fake_run([W + 0.5, W + 0.5]),
    }
    table = mistakes_table(runs, reference)
    assert table.index.tolist() == list(runs)
    assert table["replicas identical"].tolist() == [True, False, True]
    assert table["same as reference"].tolist() == [True, False, False]
    assert table["max |w0 - w1|"].tolist() == ["0", "5e-01", "0"]
    assert table.loc[("different seeds", "none"), "accuracy 1 %"] == pytest.approx(91.0)
    assert table.loc[("different seeds", "none"), "checksum 1"] == pytest.approx(5.5)


def test_reference_table_compares_every_world_with_the_first():
    table = reference_table([fake_run([W]), fake_run([W + 1e-6, W + 1e-6])])
    assert table.index.tolist() == [1, 2]
    assert table["replicas identical"].all()
    assert table["max |w - w(1 worker)|"].tolist() == ["0", "1e-06"]
    assert table["test accuracy %"].tolist() == [90.0, 90.0]
    far = reference_table([fake_run([W]), fake_run([W + 1e-6]), fake_run([W + 0.5])])
    assert far["same training as 1 worker"].tolist() == [True, True, False]


def test_verdicts_keep_only_the_yes_or_no_columns():
    reference = fake_run([W, W])
    runs = {("different seeds", "none"): fake_run([W, W + 0.5])}
    shown = verdicts(mistakes_table(runs, reference))
    assert shown.columns.tolist() == ["replicas identical", "same as reference"]
    shown = verdicts(reference_table([fake_run([W]), fake_run([W, W])]))
    assert shown.columns.tolist() == ["replicas identical", "same training as 1 worker"]


def test_one_shared_order_visits_every_sample_once_but_the_dropped_tail():
    n, batch = 7352, 256
    seen = steps_per_epoch(n, batch) * batch  # 7168
    assert epoch_coverage(n, batch, 1) == {0: n - seen, 1: seen}
    assert epoch_coverage(n, batch, 2, epoch=3) == {0: n - seen, 1: seen}
    assert epoch_coverage(n, batch, 4) == {0: n - seen, 1: seen}


def test_an_order_per_worker_visits_some_samples_twice_and_skips_others():
    n, batch = 7352, 256
    coverage = epoch_coverage(n, batch, 2, order_per_rank=True)
    assert coverage[2] > 1000 and coverage[0] > n - 7168 + 1000
    assert sum(coverage.values()) == n
    assert sum(times * count for times, count in coverage.items()) == 7168  # same work per epoch
    assert epoch_coverage(n, batch, 1, order_per_rank=True) == epoch_coverage(n, batch, 1)


def test_class_balance_counts_each_split():
    # UCI HAR's published windows per activity (the stand-in has the same counts).
    balance = class_balance(load_har("standin"))
    assert balance.index.tolist() == list(ACTIVITIES)
    assert balance.columns.tolist() == ["train", "test"]
    assert balance["train"].tolist() == [1226, 1073, 986, 1286, 1374, 1407]
    assert balance["test"].tolist() == [496, 471, 420, 491, 532, 537]
    # and a case small enough to count by hand: labels 0, 0, 5 and 2
    empty = np.zeros((0, 1), np.float32)
    tiny = HARData(
        empty, np.array([0, 0, 5]), np.array([1, 1, 1]),
        empty, np.array([2]), np.array([2]), source="test", banner="",
    )  # fmt: skip
    assert class_balance(tiny).to_dict("list") == {
        "train": [2, 0, 0, 0, 0, 1],
        "test": [0, 0, 1, 0, 0, 0],
    }


def test_initial_weights_depend_on_the_seed_only():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = initial_weights(0)
    assert torch.equal(torch.rand(1), before)  # the caller's random state is left alone
    assert first.shape == (1_631_238,) and first.dtype == np.float64
    assert np.array_equal(first, initial_weights(0))
    assert weight_gap(first, initial_weights(1)) > 0.01


def test_the_figures_label_their_axes_and_name_the_data():
    balance = class_balance(load_har("standin"))
    fig = plot_class_balance(balance, "data: test banner")
    assert "data: test banner" in fig.texts[0].get_text()  # the suptitle
    assert [ax.get_xlabel() for ax in fig.axes] == ["samples", "samples"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(ACTIVITIES)
    plt.close(fig)

    reports = {
        ("different seeds", "none"): {"replica_gaps": [0.1, 0.2], "reference_gaps": {2: 0.3}},
        ("different seeds", "ddp"): {"replica_gaps": [0.0, 0.0], "reference_gaps": {2: 0.0}},
    }
    fig = plot_mistake_gaps(reports, 2e-3, "data: test banner")
    left, right = fig.axes
    assert "data: test banner" in fig.texts[0].get_text()  # the suptitle
    assert left.get_yscale() == right.get_yscale() == "log"
    drawn = [line.get_ydata() for line in left.get_lines()]
    assert list(drawn[0]) == pytest.approx([0.1, 0.2])
    # the same bits, drawn on the tick labelled 0 (a log scale has no 0), inside the axis, and
    # named, since lines that stay there hide one another
    zero = left.get_yticks()[0]
    assert left.get_yticklabels()[0].get_text() == "0 (same bits)" and left.get_ylim()[0] < zero
    assert list(drawn[1]) == [zero, zero] and right.get_lines()[1].get_ydata()[0] == zero
    for ax in (left, right):
        assert "different seeds, sync=ddp" in "".join(t.get_text() for t in ax.texts)
    assert any(line.get_ydata()[0] == 2e-3 for line in right.get_lines())  # the tolerance
    plt.close(fig)


@pytest.mark.slow
def test_the_gap_probe_measures_what_the_final_weights_show():
    # a small model, 14 steps: the first training is the reference, the second drifts apart
    base = TrainConfig(epochs=1, max_steps=14, hidden=32, data="standin", return_weights=True)
    drifting = replace(base, sync="none", seed_per_rank=True)
    reference, drift = run_trainings(2, [base, drifting], probe=GapProbe(every=7))
    for probe in reference.probes:
        assert probe["replica_gaps"] == [0.0] * 14 and probe["reference_gaps"] == {7: 0.0, 14: 0.0}
    for probe in drift.probes:  # every rank reports the same all-reduced gaps
        assert probe == drift.probes[0]
    gaps = drift.probes[0]
    assert len(gaps["replica_gaps"]) == 14 and min(gaps["replica_gaps"]) > 0
    assert gaps["replica_gaps"][-1] == replica_gap(drift)  # exact, not to rounding
    assert gaps["reference_gaps"][14] == gap_to_reference(drift, reference)
