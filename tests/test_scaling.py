"""Speed-up against the global batch: the model's arithmetic, the budget, and a tiny real sweep."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch

from helpers.dist.comm_model import AlphaBeta
from helpers.dist.cores import available_cores
from helpers.experiments.scaling import (
    GRADIENT_BYTES,
    PUBLISHED,
    UNTIMED_STEPS,
    ComputeModel,
    _launch_order,
    add_speedup,
    batch_for_speedup,
    budget,
    compute_fit_text,
    ddp_cost,
    ddp_cost_text,
    fit_compute,
    fit_compute_physical,
    measured_and_model,
    measured_and_model_text,
    predict_speedup,
    predict_step_seconds,
    prediction_table,
    published_table,
    sweep,
)
from helpers.experiments.single_device import speedup_text
from helpers.training import TrainConfig
from helpers.training.model import make_mlp

matplotlib.use("Agg")

COMPUTE = ComputeModel(c0=0.002, c1=1e-5)  # 2 ms per step, 10 us per sample
COMM = AlphaBeta(alpha=300e-6, beta=1e-9)  # 0.3 ms + 1 ns per byte


def test_step_time_divides_only_the_per_sample_work():
    # Worked by hand: 1,631,238 float32 gradients are 6,524,952 bytes, so one all-reduce takes
    # 0.3 ms + 6.524952 ms = 6.824952 ms; a step at 1024 is 2 ms + 10.24 ms of compute on one
    # worker, 2 ms + 5.12 ms (+ the all-reduce) on two, 2 ms + 2.56 ms on four.
    assert predict_step_seconds(COMPUTE, None, 1024, 1) == pytest.approx(0.01224)
    assert predict_step_seconds(COMPUTE, COMM, 1024, 2) == pytest.approx(0.013944952)
    assert predict_step_seconds(COMPUTE, COMM, 1024, 4) == pytest.approx(0.011384952)
    # 12.24 / 13.944952 = 0.87774: at this batch the all-reduce costs more than compute saves
    assert predict_speedup(COMPUTE, COMM, 1024, 2) == pytest.approx(0.8777370, rel=1e-6)


def test_the_gradient_bytes_are_those_pytorch_allocates():
    """GRADIENT_BYTES, counted from the model's shape, against the gradients a backward pass
    of the real model leaves (PyTorch's own record of what DDP all-reduces)."""
    torch.manual_seed(0)
    model = make_mlp()
    model(torch.randn(2, 561)).sum().backward()
    assert GRADIENT_BYTES == sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())


def test_speedup_grows_with_the_batch_towards_the_number_of_workers():
    batches = 64 * 2.0 ** np.arange(12)
    for world in (2, 4):
        s = predict_speedup(COMPUTE, COMM, batches, world)
        assert np.all(np.diff(s) > 0)
        assert np.all(s < world) and s[-1] > 0.9 * world
    assert predict_speedup(COMPUTE, None, batches, 1) == pytest.approx(np.ones_like(batches))


def test_more_workers_need_their_all_reduce_fit():
    with pytest.raises(ValueError, match="AlphaBeta"):
        predict_step_seconds(COMPUTE, None, 256, 2)


def test_prediction_table_has_one_row_per_world_and_batch():
    table = prediction_table(COMPUTE, {2: COMM, 4: COMM}, [256, 2048])
    assert table[["world", "global_batch"]].values.tolist() == [
        [2, 256],
        [2, 2048],
        [4, 256],
        [4, 2048],
    ]
    # By hand: one worker takes 4.56 ms at 256 and 22.48 ms at 2048; two take 10.104952 ms and
    # 17.064952 ms, four 8.824952 ms and 13.944952 ms (see the test above for the all-reduce).
    np.testing.assert_allclose(
        table["speedup"], [0.4512639, 1.1791270, 0.4817774, 1.6120529], rtol=1e-6
    )
    np.testing.assert_allclose(
        table["efficiency"], [0.2256319, 0.5895635, 0.1204444, 0.4030132], rtol=1e-6
    )


def test_batch_for_speedup_inverts_the_prediction():
    for world, target in [(2, 1.0), (2, 1.7), (4, 1.49), (4, 3.0)]:
        batch = batch_for_speedup(COMPUTE, COMM, world, target)
        assert 0 < batch < math.inf
        assert predict_speedup(COMPUTE, COMM, batch, world) == pytest.approx(target)
    assert batch_for_speedup(COMPUTE, COMM, 2, 2.0) == math.inf  # never reached
    assert batch_for_speedup(COMPUTE, COMM, 2, 0.01) == 0.0  # reached by any batch


def test_fit_compute_recovers_the_line_from_one_worker_runs_only():
    batches = np.array([64, 128, 256, 512, 1024])
    one = pd.DataFrame(
        {"world": 1, "global_batch": batches, "step_seconds": COMPUTE.predict(batches)}
    )
    two = one.assign(world=2, step_seconds=one["step_seconds"] * 10)  # must be ignored
    fit = fit_compute(pd.concat([one, two]))
    assert fit.c0 == pytest.approx(COMPUTE.c0) and fit.c1 == pytest.approx(COMPUTE.c1)
    with pytest.raises(ValueError, match="2 or more"):
        fit_compute(one.head(1))


def test_a_negative_fixed_cost_is_refitted_through_the_origin():
    batches = np.array([64, 256, 1024, 2048])
    line = pd.DataFrame({"world": 1, "global_batch": batches,
                         "step_seconds": COMPUTE.predict(batches)})  # fmt: skip
    assert fit_compute_physical(line) == fit_compute(line)  # c0 > 0: the plain fit
    # load on the small batches only: the free line's c0 goes below 0
    loaded = line.assign(step_seconds=batches * 1e-4 * np.array([0.6, 0.8, 1.0, 1.0]))
    assert fit_compute(loaded).c0 < 0
    kept = fit_compute_physical(loaded)
    assert kept.c0 == 0.0 and kept.c1 > 0
    # the least relative error through the origin: nudging c1 either way does worse
    def error(c1: float) -> float:
        return float((((c1 * batches) / loaded["step_seconds"] - 1) ** 2).sum())
    assert error(kept.c1) < min(error(kept.c1 * 1.01), error(kept.c1 * 0.99))


def test_budget_trains_whole_epochs_and_at_least_min_steps_after_the_untimed_ones():
    assert UNTIMED_STEPS == 2
    plan = budget([64, 256, 2048, 4096], n_samples=7352, min_steps=4).set_index("global_batch")
    # columns: epochs, steps, timed steps, samples
    assert plan.loc[64].tolist() == [1, 114, 112, 114 * 64]
    assert plan.loc[256].tolist() == [1, 28, 26, 28 * 256]
    assert plan.loc[2048].tolist() == [2, 6, 4, 6 * 2048]  # 3 steps per epoch: 2 epochs
    assert plan.loc[4096].tolist() == [6, 6, 4, 6 * 4096]  # 1 step per epoch: 4 + 2 epochs
    with pytest.raises(ValueError, match="larger than"):
        budget([8192], n_samples=7352)


def test_add_speedup_compares_with_one_worker_at_the_same_batch():
    runs = pd.DataFrame(
        {"world": [1, 2, 1, 2], "global_batch": [256, 256, 2048, 2048], "seconds": [4, 8, 6, 4]}
    )
    out = add_speedup(runs)
    assert out["speedup"].tolist() == [1.0, 0.5, 1.0, 1.5]
    assert out["efficiency"].tolist() == [1.0, 0.25, 1.0, 0.75]
    with pytest.raises(ValueError, match="1-worker run"):
        add_speedup(runs[runs["world"] == 2])


def test_the_published_points_are_those_the_readme_quotes():
    """The figures typed in twice, in the code and in the README's account of the article, must
    agree: a typo in either shows."""
    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    quoted = re.search(
        r"speed-up at batch 256: ([\d.]+)x \(2 workers\), ([\d.]+)x \(4\); "
        r"at batch 2048: ([\d.]+)x and ([\d.]+)x",
        readme,
    )
    assert quoted, "the README no longer quotes the published speed-ups"
    table = published_table().set_index(["world", "global_batch"])["speedup"]
    assert len(table) == len(PUBLISHED) == 4
    assert [table[(2, 256)], table[(4, 256)], table[(2, 2048)], table[(4, 2048)]] == [
        float(x) for x in quoted.groups()
    ]


def test_plot_scaling_draws_every_series_and_names_the_data():
    from helpers.notebook.plotting import plot_scaling

    measured = add_speedup(
        pd.DataFrame({"world": [1, 2], "global_batch": [256, 256], "seconds": [4.0, 3.0]})
    )
    predicted = prediction_table(COMPUTE, {2: COMM}, [256, 512])
    fig = plot_scaling(measured, predicted, published_table(), "efficiency", "DATA BANNER")
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "measured, 2 workers" in labels and "model, 2 workers" in labels
    assert sum("not measured here" in label for label in labels) == 2  # 2 and 4 workers
    assert "DATA BANNER" in ax.get_title() and ax.get_xscale() == "log"
    with pytest.raises(ValueError, match="metric"):
        plot_scaling(measured, predicted, published_table(), "seconds", "DATA BANNER")


def test_sweep_needs_the_one_worker_baseline():
    with pytest.raises(ValueError, match="world size 1"):
        sweep([256], world_sizes=[2], data="standin")


@pytest.mark.slow
def test_a_tiny_real_sweep_returns_a_well_formed_table():
    lines = []
    table = sweep([2048, 4096], world_sizes=[1, 2, 4], min_steps=1, threads=1, data="standin",
                  silent=True, progress=lines.append, repeat=True)  # fmt: skip
    runs = 2 if available_cores() < 4 else 3
    assert len(table) == 2 * runs
    assert table["world"].tolist()[:runs] == [1, 2, 4][:runs]
    # min_steps=1 timed after the 2 untimed: one epoch of 3 steps at 2048, three of 1 at 4096
    assert table["steps"].tolist()[:2] == [3, 3] and table["timed_steps"].tolist()[:2] == [1, 1]
    assert (table["seconds"] > 0).all() and table["replicas_identical"].all()
    assert (table.loc[table["world"] == 1, "speedup"] == 1.0).all()
    # the baseline is the plain model, the rest DDP, as each worker's own training reported it
    assert table["sync"].tolist()[:runs] == ["none"] + ["ddp"] * (runs - 1)
    assert len(table.attrs["skipped"]) == 3 - runs
    # N workers do the same training as one: equal weights up to float rounding
    for _, same_batch in table.groupby("global_batch"):
        assert np.ptp(same_batch["checksum"]) < 1e-2
    # a warm-up per launch, shown and left out; DDP's rebuilt buckets as DDP logged them
    assert sum("warm-up (discarded)" in line for line in lines) == runs
    repeats = table.attrs["repeats"]  # per launch, the warm-up and the same training timed
    assert len(repeats) == runs and all(w > 0 and t > 0 for w, t in repeats)
    assert (table.loc[table["world"] > 1, "buckets"] == 2).all()  # bucket_plan's 2 for the MLP
    # the never-communicating runs, one per batch and world size beyond 1, without DDP
    silent = pd.DataFrame(table.attrs["silent"])
    assert len(silent) == 2 * (runs - 1) and (silent["layout"] == "no communication").all()
    assert (silent["buckets"] == 0).all() and not silent["replicas_identical"].any()
    # DDP at world size 1, once per batch beside the plain model: the same weights, bit for bit
    ddp_one = pd.DataFrame(table.attrs["ddp_one"])
    assert ddp_one["layout"].eq("DDP, 1 worker").all() and ddp_one["sync"].eq("ddp").all()
    plain = table[table["world"] == 1]
    assert ddp_one["global_batch"].tolist() == plain["global_batch"].tolist()
    assert ddp_one["digest"].tolist() == plain["digest"].tolist()
    assert ddp_cost(table).index.tolist() == [2048, 4096]
    # repeat: every training, DDP's and the silent ones, timed a second time right after
    twice = pd.DataFrame(table.attrs["twice"])
    assert len(twice) == len(table) + len(silent) and (twice[["first", "second"]] > 0).all().all()
    assert sorted(twice.loc[twice["layout"] != "no communication", "first"]) == sorted(
        table["seconds"])  # fmt: skip
    assert "DDP, 1 worker" not in set(twice["layout"])  # timed once: for its cost only


def test_a_launch_alternates_each_training_with_its_partner():
    configs = [TrainConfig(global_batch=b) for b in (64, 256)]
    # more than one worker: DDP, then never communicating, the pair again with repeat
    _, roles = _launch_order(configs, one=False, silent=True, repeat=True)
    assert roles[:4] == [(0, 0, "ddp"), (0, 0, "none"), (0, 1, "ddp"), (0, 1, "none")]
    # one worker: the plain model, then DDP; DDP not repeated
    launched, roles = _launch_order(configs, one=True, silent=True, repeat=True)
    assert roles[:3] == [(0, 0, "none"), (0, 0, "ddp"), (0, 1, "none")] and len(roles) == 6
    assert [c.sync for c in launched] == [sync for _, _, sync in roles]
    assert [c.global_batch for c in launched] == [64, 64, 64, 256, 256, 256]
    # without silent: the main training only, the plain model on one worker
    _, roles = _launch_order(configs, one=True, silent=False, repeat=False)
    assert roles == [(0, 0, "none"), (1, 0, "none")]


def test_ddp_cost_is_ddp_at_world_size_1_over_the_plain_model():
    table = pd.DataFrame({"world": [1, 2, 1], "global_batch": [64, 64, 256],
                          "seconds": [2.0, 1.5, 4.0]})  # fmt: skip
    table.attrs["ddp_one"] = [{"global_batch": 64, "seconds": 2.5},
                              {"global_batch": 256, "seconds": 4.2}]  # fmt: skip
    np.testing.assert_allclose(ddp_cost(table), [0.25, 0.05])  # by hand: 2.5 / 2, 4.2 / 4
    assert ddp_cost_text(table).endswith("64 +25%, 256 +5%")
    table.attrs["ddp_one"] = []
    with pytest.raises(ValueError, match="silent=True"):
        ddp_cost(table)


def test_the_tables_to_read_put_measured_and_model_side_by_side():
    runs = add_speedup(
        pd.DataFrame(
            {
                "world": [1, 2],
                "global_batch": [256, 256],
                "seconds": [4.0, 2.5],
                "samples_per_s": [1000.0, 1600.0],
                "step_seconds": [0.02, 0.0125],
            }
        )
    )
    text = speedup_text(runs)
    assert "1.60x" in text and "80%" in text and "1,600" in text
    both = measured_and_model(runs, prediction_table(COMPUTE, {2: COMM}, [256]))
    assert both["world"].tolist() == [2] and both["speedup_measured"].tolist() == [1.6]
    assert "1.60x" in measured_and_model_text(both)
    assert "20.00" in compute_fit_text(runs, COMPUTE)  # the measured 0.02 s, in ms
