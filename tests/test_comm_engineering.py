"""Notebook 07: DDP's buckets as DDP builds them, gradient accumulation with and without
no_sync(), the hooks Gloo refuses and the configuration of PowerSGD that works on it, the fp16
hook's rounding, the activations autograd keeps, and the tables and figure of the summary."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
import workers

from helpers.dist import buckets as bk
from helpers.dist.comm_hooks import POWERSGD_START_ITER, CommHook, bytes_per_step
from helpers.dist.comm_model import AlphaBeta
from helpers.dist.launch import launch
from helpers.experiments import comm_engineering as ce
from helpers.experiments.comm_engineering import ONE_BUCKET_MB, model_step_seconds
from helpers.experiments.replicas import SAME_TRAINING_ATOL, gap_to_reference
from helpers.experiments.scaling import ComputeModel, predict_speedup
from helpers.experiments.split_training import several
from helpers.training import TrainConfig, run_trainings, train_in_process, validate
from helpers.training.model import gradient_bytes, make_mlp

CAPS = [None, 0.001, 1, ONE_BUCKET_MB]
STEPS = 5
RANK = 2
SHAPES = [tuple(p.shape) for p in make_mlp().parameters()]


@pytest.fixture(scope="module")
def on_two_workers():
    """Both 2-worker jobs in one launch (each builds its own DDP model): one start-up."""
    jobs = [
        (workers.ddp_communication, (CAPS, STEPS, RANK), {}),
        (bk.ddp_bucket_record, ([561, 1024, 1024, 6], CAPS), {}),
    ]
    return launch(several, 2, jobs)


@pytest.fixture(scope="module")
def ddp_facts(on_two_workers):
    return [r[0] for r in on_two_workers]


def test_bucket_plan_is_the_buckets_ddp_builds(ddp_facts):
    for cap in CAPS:
        plan = [b.nbytes for b in bk.bucket_plan(make_mlp(), cap)]
        for rank in ddp_facts:
            assert rank["rebuilt"][str(cap)] == ", ".join(map(str, plan)), cap
    # the default gives two buckets (the first capped at 1 MiB), an explicit 25 MiB one
    assert len(bk.bucket_plan(make_mlp())) == 2
    assert len(bk.bucket_plan(make_mlp(), 25)) == 1


def test_ddp_bucket_record_is_what_ddp_logs_for_any_widths(on_two_workers):
    # the reference MLP's widths: DDP's record matches the plan at every cap (the ReLUs hold no
    # parameters), on every rank
    record = [r[1] for r in on_two_workers]
    for cap in CAPS:
        plan = [b.nbytes for b in bk.bucket_plan(make_mlp(), cap)]
        assert [rank[str(cap)] for rank in record] == [plan, plan], cap


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


@pytest.mark.slow
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



def test_deep_overlap_table_steps_on_the_calibrated_compute_and_divides_one_workers():
    alone, parallel = ComputeModel(c0=2e-3, c1=80e-6), ComputeModel(c0=3e-3, c1=120e-6)
    free = AlphaBeta(alpha=0.0, beta=0.0)
    table = ce.overlap_table(alone, free, [2, 8], 2048, parallel=parallel)
    for depth, row in zip([2, 8], table.itertuples(), strict=True):
        model = ce.deep_mlp(depth)
        ceiling = ce.communication_free_ceiling(
            ce.scaled_compute(alone, model), 2048, parallel=ce.scaled_compute(parallel, model))
        # with communication free, the step is the calibrated compute and nothing else
        assert np.isclose(row.speedup_overlap, ceiling)
        assert np.isclose(row.speedup_no_overlap, ceiling)
    slower = ce.overlap_table(alone, AlphaBeta(2e-4, 5e-10), [2], 2048, parallel=parallel)
    same = ce.overlap_table(alone, AlphaBeta(2e-4, 5e-10), [2], 2048)
    assert (slower.speedup_overlap < same.speedup_overlap).all()

@pytest.mark.slow
def test_max_steps_stops_mid_epoch_without_evaluating_a_partial_epoch():
    one_step_epochs = TrainConfig(global_batch=4096, epochs=5, max_steps=3, data="standin")
    run = train_in_process(replace(one_step_epochs, record_accuracy=True, record_loss=True), 1)
    assert run.steps == 3 and len(run.losses) == 3 and len(run.epoch_accuracies) == 3
    mid_epoch = TrainConfig(global_batch=2048, epochs=2, max_steps=2, data="standin")
    run = train_in_process(replace(mid_epoch, record_accuracy=True), 1)
    assert run.steps == 2 and run.epoch_accuracies == []


@pytest.mark.slow
def test_fp16_hook_equals_the_plain_all_reduce_to_fp16_rounding():
    """2 Gloo workers, the same model, each its own data: the fp16 hook's averaged gradient is
    DDP's plain one to within fp16's rounding, and not bitwise (it really rounds)."""
    ranks = launch(workers.fp16_and_plain_gradients, 2)
    local0, local1 = ranks[0]["local"], ranks[1]["local"]
    plain, fp16 = ranks[0]["plain"], ranks[0]["fp16"]
    assert all(torch.equal(r["plain"], plain) and torch.equal(r["fp16"], fp16) for r in ranks)
    exact = (local0 + local1) / 2
    mean_abs = (local0.abs() + local1.abs()) / 2
    # the plain all-reduce: float32 sums, rounded to float32's 24-bit significand
    assert torch.all((plain - exact).abs() <= 2**-23 * mean_abs + 1e-30)
    # fp16 has an 11-bit significand: each rounding errs by at most u = 2**-11 of its value, and
    # by half the smallest subnormal step (2**-25) below fp16's normal range (6.1e-5). The hook
    # rounds each rank's gradient to fp16 (u |g_r|, halving it is exact but for subnormals), then
    # the sum (u |mean|, at most u mean_abs): 2u mean_abs, plus float32's rounding of the plain
    # all-reduce (1% of u covers it), plus 4 subnormal half-steps
    bound = 2.01 * 2**-11 * mean_abs + 4 * 2**-25
    assert torch.all((fp16 - plain).abs() <= bound)
    assert not torch.equal(fp16, plain)
    # and the bound is no blanket: the errors reach a sizeable part of it
    assert ((fp16 - plain).abs() / bound).max() > 0.2


def test_activation_bytes_are_what_autograd_saves():
    # the input, each ReLU's output and the log-softmax: 561 + 1024 + 1024 + 6 floats a sample
    assert ce.activation_bytes(1) == 4 * (561 + 1024 + 1024 + 6)
    for batch in (1, 64, 256):
        assert ce.saved_activation_bytes(batch) == ce.activation_bytes(batch)
    deeper = make_mlp(n_features=20, hidden=30, hidden_layers=4)
    assert ce.saved_activation_bytes(5, deeper) == ce.activation_bytes(5, deeper)
    assert ce.activation_bytes(5, deeper) == 4 * 5 * (20 + 4 * 30 + 6)


def test_timing_rows_give_the_median_and_the_spread_of_the_rounds():
    found = {
        "variants": [[(0.3, True), (0.1, True), (0.2, True)], [(1.0, True), (3.0, False)]],
        "alone": {2048: [4.0, 2.0, 3.0], 256: [0.5, 0.7]},
    }
    timed, one = ce.timing_rows([("a", 256), ("b", 2048)], found)
    a = timed.set_index("variant").loc["a"]
    assert (a["step_seconds"], a["min_seconds"], a["max_seconds"]) == (0.2, 0.1, 0.3)
    assert a["round_seconds"] == (0.3, 0.1, 0.2)  # every round, in order, for pairing
    assert list(timed["replicas_identical"]) == [True, False]
    assert list(one["global_batch"]) == [256, 2048]
    assert list(one["step_seconds"]) == [0.6, 3.0] and list(one["max_seconds"]) == [0.7, 4.0]
    text = ce.speedup_text(ce.speedup_table(timed, one))
    assert "[100.0-300.0]" in text and "3.00x" in text  # a: 600 ms alone / 200 ms


def test_the_goal_picks_the_fastest_technique_within_the_accuracy_tolerance():
    table = pd.DataFrame(
        {
            "variant": ["base", "fast but worse", "a bit faster", "base", "untrained"],
            "global_batch": [256, 256, 256, 2048, 256],
            "speedup": [1.0, 1.6, 1.1, 1.5, 9.0],
        }
    )
    accuracy = {"base": 0.80, "fast but worse": 0.75, "a bit faster": 0.805}
    best = ce.best_within_tolerance(table, accuracy, 0.80, 0.01)
    assert list(best["variant"]) == ["a bit faster", "base"]
    assert best["accuracy_gap"].iloc[0] == pytest.approx(0.005)
    compute = ComputeModel(c0=4e-3, c1=80e-6)
    ceiling = ce.communication_free_ceiling(compute, 256)
    # notebook 05's step model, with an all-reduce that costs nothing, is the same ceiling
    assert ceiling == pytest.approx(predict_speedup(compute, AlphaBeta(0.0, 0.0), 256, 2))
    assert ce.communication_free_ceiling(ComputeModel(0.0, 1e-4), 256) == pytest.approx(2.0)
    # a calibration that makes each worker faster than one alone cannot carry 2 workers past 2x
    faster = ComputeModel(0.0, 0.5e-4)
    assert ce.communication_free_ceiling(compute, 4096, parallel=faster) == 2.0
    # the model's speed-ups stay below the ceiling, and cheaper bytes bring them closer
    comm = AlphaBeta(alpha=2e-4, beta=8e-9)
    variants = (ce.BUCKET_VARIANTS[2], ce.HOOK_VARIANTS[0], ce.ACCUMULATION_VARIANTS[0])
    model = ce.model_speedups(variants, compute, comm, [256, 2048]).set_index(
        ["variant", "global_batch"]
    )["speedup"]
    assert len(model) == 4  # accumulation is not modelled
    assert model.max() < ceiling
    assert model[(ce.HOOK_VARIANTS[0].name, 256)] > model[(ce.BUCKET_VARIANTS[2].name, 256)]


def test_capped_ceiling_caps_at_the_workers_and_passes_the_rest():
    # a ratio above N comes back N; one below comes back unchanged (a measured ceiling, 07's goal)
    assert ce.capped_ceiling(2.3, 2) == 2.0
    assert ce.capped_ceiling(1.54, 2) == 1.54
    assert ce.capped_ceiling(3.5, 4) == 3.5
    assert ce.capped_ceiling(4.5, 4) == 4.0
    assert ce.capped_ceiling(0.8, 2) == 0.8  # under 1x is not raised: section 6 then sets no goal


def test_plot_technique_speedups_draws_every_variant_and_names_the_data():
    from helpers.notebook.comm_plots import plot_technique_speedups

    measured = pd.DataFrame(
        {"variant": ["a", "a", "b", "b"], "global_batch": [256, 2048] * 2,
         "speedup": [1.1, 1.6, 1.0, 1.5]}
    )  # fmt: skip
    model = pd.DataFrame(
        {"variant": ["a", "a", "b", "b"], "global_batch": [64, 4096] * 2,
         "speedup": [1.2, 1.9, 1.1, 1.8]}
    )  # fmt: skip
    ceiling = pd.DataFrame({"global_batch": [64, 4096], "speedup": [1.3, 2.0]})
    panels = {"panel A": ["a"], "panel B": ["b"]}
    fig = plot_technique_speedups(measured, model, panels, "DATA BANNER", ceiling, goal=(256, 1.5))
    assert len(fig.axes) == 2 and "DATA BANNER" in fig.get_suptitle()
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "a" in labels and "b" not in labels and "goal: 1.50x at 256" in labels
    assert "communication free (the ceiling)" in labels
    assert len(fig.axes[0].get_lines()) >= 2  # a's model line and its measured points
    assert fig.axes[1].get_xscale() == "log"


def test_plot_overlap_depth_draws_both_settings_per_network_and_names_the_data():
    from helpers.notebook.comm_plots import plot_overlap_depth

    table = pd.DataFrame({"layers": [2, 8, 32], "speedup_no_overlap": [1.4, 1.45, 1.47],
                          "speedup_overlap": [1.6, 1.5, 1.9]})  # fmt: skip
    fig = plot_overlap_depth({"loopback": table, "1 Gbit/s": table}, "DATA BANNER")
    ax = fig.axes[0]
    assert "DATA BANNER" in ax.get_title() and ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["loopback, with overlap", "loopback, without overlap",
                      "1 Gbit/s, with overlap", "1 Gbit/s, without overlap"]  # fmt: skip
    drawn = [line for line in ax.get_lines() if line.get_label() in labels]
    assert list(drawn[0].get_ydata()) == [1.6, 1.5, 1.9]
    assert list(drawn[1].get_ydata()) == [1.4, 1.45, 1.47]


def test_plot_accumulation_draws_both_loops_under_the_ceiling_and_names_the_data():
    from helpers.notebook.comm_plots import plot_accumulation

    table = pd.DataFrame({"global_batch": [1024, 2048, 4096], "micro_batches": [1, 2, 4],
                          "speedup_no_sync": [1.5, 1.6, 1.7], "speedup_without": [1.5, 1.4, 1.3],
                          "ceiling": [1.8, 1.85, 1.9]})  # fmt: skip
    fig = plot_accumulation(table, "DATA BANNER")
    ax = fig.axes[0]
    assert "DATA BANNER" in ax.get_title() and ax.get_xscale() == "log"
    heights = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert heights["with no_sync(): 1 all-reduce"] == [1.5, 1.6, 1.7]
    assert heights["without no_sync(): one all-reduce per micro-batch"] == [1.5, 1.4, 1.3]
    assert heights["communication free (the ceiling)"] == [1.8, 1.85, 1.9]
    assert [t.get_text() for t in ax.texts] == ["k=1", "k=2", "k=4"]


def test_plot_hook_payoff_draws_each_network_and_model_beside_the_bandwidths_and_names_the_data():
    from helpers.notebook.comm_plots import plot_hook_payoff

    speedups = pd.DataFrame({"hook": ["none", "fp16"] * 2,
                             "network": ["loopback"] * 2 + ["slow"] * 2,
                             "global_batch": [256] * 4, "speedup_model": [0.8, 0.9, 0.4, 0.6]})
    break_even = pd.DataFrame({"model": ["small", "big"], "hook": ["fp16", "fp16"],
                               "pays_below_GB_per_s": [5.0, 6.0]})  # fmt: skip
    fig = plot_hook_payoff(speedups, break_even, {"loopback": 1.0, "slow": 0.125}, "DATA BANNER")
    left, right = fig.axes
    assert "DATA BANNER" in fig.get_suptitle()
    points = {line.get_label(): list(line.get_xdata()) for line in left.get_lines()}
    assert points == {"loopback, global batch 256": [0.8, 0.9],
                      "slow, global batch 256": [0.4, 0.6]}
    assert sorted(bar.get_width() for bar in right.patches) == [5.0, 6.0]
    labels = [t.get_text() for t in right.get_legend().get_texts()]
    assert labels == ["loopback: 1 GB/s", "slow: 0.125 GB/s", "small", "big"]
    assert right.get_xscale() == "log"


def test_overlap_counts_only_communication_inside_the_backward_bars():
    def table(comm: list[tuple[float, float]]) -> pd.DataFrame:
        rows = [("compute", "forward", 0.0, 10.0), ("compute", "backward layer 3", 10.0, 20.0),
                ("compute", "backward layer 2", 30.0, 40.0),
                ("compute", "backward layer 1", 39.0, 50.0)]  # fmt: skip
        rows += [("communication", f"bucket {i}", s, e) for i, (s, e) in enumerate(comm)]
        return pd.DataFrame(rows, columns=["row", "what", "start_ms", "end_ms"])

    # a bucket in the stall between two bars: the next backward waited for it, nothing hidden
    assert ce.overlap_share(table([(21.0, 29.0)])) == 0.0
    assert ce.overlap_share(table([(50.0, 60.0)])) == 0.0  # after the last bar
    # 5 of its 10 ms under layer 3's bar, 5 in the stall
    assert ce.overlap_share(table([(15.0, 25.0)])) == pytest.approx(0.5)
    # the bars of layers 2 and 1 overlap by 1 ms: counted once
    assert ce.overlap_share(table([(35.0, 45.0)])) == pytest.approx(1.0)
    assert ce.overlap_share(table([(15.0, 25.0), (35.0, 45.0)])) == pytest.approx(0.75)
