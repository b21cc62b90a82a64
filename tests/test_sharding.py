"""FSDP2 beside DDP (notebook 08): the same training, 1/N of the state, the traffic counted,
a memory budget enforced, sharded checkpoints loaded on another number of workers."""

from __future__ import annotations

import platform
from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers.dist.counting import COUNTED, per_step_traffic, wire_bytes
from helpers.dist.launch import WorkerError, launch
from helpers.experiments.memory import (
    expected_bytes,
    momentum_step_bytes,
    stored_bytes,
    unlaunched_step_bytes,
    why_rss_not_comparable,
)
from helpers.experiments.replicas import weight_gap
from helpers.experiments.sharding import (
    ShardingProbe,
    load_sharded,
    load_worker,
    memory_table,
    traffic_by_kind,
    traffic_table,
)
from helpers.experiments.split_training import several
from helpers.notebook.plotting import plot_memory, plot_state_held, plot_traffic
from helpers.training import (
    TrainConfig,
    make_optimizer,
    run_training,
    run_trainings,
    validate,
)
from helpers.training.model import count_parameters, gradient_bytes, make_mlp

# SGD with momentum: its update scales with the gradient (unlike Adam's), so a wrapping that
# summed instead of averaging would train differently; and it keeps one buffer per weight.
CONFIG = TrainConfig(
    global_batch=256,
    epochs=1,
    max_steps=5,
    optimizer="momentum",
    lr=0.05,
    data="standin",
    record_loss=True,
    return_weights=True,
)
PARAM_BYTES = 6_524_952  # the reference MLP's float32 parameters
# between FSDP2's half of the state on 2 workers (9.8 MB) and DDP's whole state (19.6 MB)
BUDGET = 15 * 10**6


@pytest.fixture(scope="module")
def ddp_run():
    return run_training(2, CONFIG, probe=ShardingProbe(count_step=2))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkpoint")
    probe = ShardingProbe(budget_bytes=BUDGET, count_step=2, digest=True, save_to=str(path))
    return run_training(2, replace(CONFIG, sync="fsdp2"), probe=probe), path


def test_fsdp2_trains_like_ddp_for_the_configured_steps(ddp_run, fsdp_run):
    fsdp, _ = fsdp_run
    assert fsdp.steps == ddp_run.steps == 5 and len(fsdp.losses) == 5
    assert fsdp.replicas_identical
    # float rounding at most: 5 momentum steps move the weights by about 1e-2
    assert weight_gap(fsdp.weights[0], ddp_run.weights[0]) < 1e-5
    assert np.allclose(fsdp.losses, ddp_run.losses, rtol=0, atol=1e-6)
    assert fsdp.losses[-1] < fsdp.losses[0]


def test_each_fsdp2_worker_holds_half_of_ddps_state(ddp_run, fsdp_run):
    fsdp, _ = fsdp_run
    for probe in ddp_run.probes:
        assert probe["held"] == {k: PARAM_BYTES for k in probe["held"]}  # momentum: 1 copy
    for probe in fsdp.probes:
        assert probe["held"] == {k: PARAM_BYTES // 2 for k in probe["held"]}  # even shards
        assert sum(probe["held"].values()) <= BUDGET  # so the budget let it train


def test_fsdp2_sends_one_and_a_half_times_ddps_bytes(ddp_run, fsdp_run):
    fsdp, _ = fsdp_run
    ddp_traffic = per_step_traffic(ddp_run.probes[0]["calls"], 2)
    fsdp_traffic = per_step_traffic(fsdp.probes[0]["calls"], 2)
    assert ddp_traffic["all-reduce"]["message_bytes"] == PARAM_BYTES
    layers = 3  # every Linear is one unit: gathered for forward and again for backward
    assert fsdp_traffic["all-gather"] == {
        "calls": 2 * layers,
        "message_bytes": 2 * PARAM_BYTES,
        "wire_bytes": PARAM_BYTES,
    }
    assert fsdp_traffic["reduce-scatter"]["calls"] == layers
    assert fsdp_traffic["reduce-scatter"]["message_bytes"] == PARAM_BYTES
    sent = {
        name: sum(r["wire_bytes"] for r in t.values())
        for name, t in (("ddp", ddp_traffic), ("fsdp", fsdp_traffic))
    }
    assert sent["fsdp"] / sent["ddp"] == pytest.approx(1.5, abs=1e-4)




def test_the_probe_splits_the_rss_growth_by_part_and_counts_the_imports(ddp_run):
    for probe in ddp_run.probes:
        parts = probe["growth_by_part"]
        assert list(parts) == ["setup", "first_step", "later_steps"]
        assert None not in parts.values()  # 5 steps: every part was reached
        # the parts run from the baseline to the later steps' peak, at most the whole peak's
        assert sum(parts.values()) <= probe["peak_growth"]
        assert list(probe["modules_imported"]) == list(parts)
        # the steps' spread brackets their median, from the probe's own clock
        assert 0 < probe["step_q1_seconds"] <= probe["step_seconds"] <= probe["step_q3_seconds"]


def test_traffic_by_kind_splits_the_tables_total_and_the_figures_name_their_data(
    ddp_run, fsdp_run
):
    import matplotlib.pyplot as plt

    runs = [ddp_run, fsdp_run[0]]
    by_kind = traffic_by_kind(runs)
    assert list(by_kind.columns) == list(COUNTED)
    assert np.allclose(by_kind.sum(axis=1), traffic_table(runs)["sent per worker MB"])
    assert by_kind.iloc[0]["all-reduce"] > 0 and by_kind.iloc[1]["all-reduce"] == 0
    memory = memory_table(runs)
    for fig in (plot_traffic(by_kind, "data: X"),
                plot_state_held(memory, memory["state_total"], "data: X", "held"),
                plot_memory(memory, "data: X", "measured: Y")):  # fmt: skip
        assert "data: X" in fig.axes[0].get_title()
        plt.close(fig)
    fig = plot_memory(memory, "data: X", "measured: Y")
    assert "measured: Y" in fig.axes[0].get_title()
    assert len(fig.axes[0].get_legend().get_texts()) == 6  # three tensors, three RSS parts
    plt.close(fig)

@pytest.mark.slow  # notebook 08's headline cell depends on it too, on every make test
def test_one_probe_measures_each_training_of_a_launch_afresh():
    # DDP first: a probe that carried its measurements over would report DDP's whole state, and
    # DDP's all-reduce, for the FSDP2 training that follows it in the same workers
    short = replace(CONFIG, max_steps=2)
    ddp, fsdp = run_trainings(
        2, [short, replace(short, sync="fsdp2")], probe=ShardingProbe(count_step=2)
    )
    assert ddp.probes[0]["held"] == {k: PARAM_BYTES for k in ddp.probes[0]["held"]}
    for probe in fsdp.probes:
        assert probe["held"] == {k: PARAM_BYTES // 2 for k in probe["held"]}
        assert {kind for kind, _ in probe["calls"]} == {"all-gather", "reduce-scatter"}

@pytest.mark.slow
def test_a_sharded_checkpoint_reshards_bit_for_bit_both_ways(fsdp_run, tmp_path):
    fsdp, path = fsdp_run
    assert (path / ".metadata").exists()
    config = replace(CONFIG, sync="fsdp2")
    # saved by 2, loaded by 1, which saves it again; that save loaded back by 2
    loaded = launch(load_worker, 1, config, str(path), str(tmp_path))[0]
    assert loaded["held"]["parameters"] == PARAM_BYTES  # whole again, on one worker
    reloaded = launch(load_worker, 2, config, str(tmp_path))
    for report in [loaded, *reloaded]:
        assert np.array_equal(report["weights"], fsdp.weights[0])
        assert report["optimizer_digest"] == fsdp.probes[0]["optimizer_digest"]
    assert [r["held"]["parameters"] for r in reloaded] == [PARAM_BYTES // 2] * 2


@pytest.mark.slow
def test_the_budget_stops_ddp_at_its_first_step_in_one_line():
    # one DDP worker holds what each of any number of DDP workers holds
    with pytest.raises(WorkerError) as caught:
        run_training(1, CONFIG, probe=ShardingProbe(budget_bytes=BUDGET, count_step=None))
    message = str(caught.value)
    assert "MemoryBudgetError" in message and "after step 1" in message
    assert "sync='fsdp2'" in message and "\n" not in message


def test_loading_a_missing_checkpoint_says_so(tmp_path):
    model = make_mlp()
    with pytest.raises(FileNotFoundError, match="no DCP checkpoint"):
        load_sharded(model, make_optimizer(model, CONFIG), str(tmp_path))


def test_zero_stages_arithmetic():
    whole = expected_bytes(100, "adam", 4, 0)
    assert whole == {"parameters": 100, "gradients": 100, "optimizer_state": 200}
    assert expected_bytes(100, "adam", 4, 1)["optimizer_state"] == 50
    assert expected_bytes(100, "momentum", 4, 2) == {
        "parameters": 100,
        "gradients": 25,
        "optimizer_state": 25,
    }
    assert sum(expected_bytes(100, "sgd", 4, 3).values()) == 50
    with pytest.raises(ValueError, match="stage"):
        expected_bytes(100, "adam", 4, 4)


def test_stored_bytes_counts_each_storage_once_and_whole():
    weights = torch.zeros(10, 4)
    assert stored_bytes([weights, weights[:2], weights.t()]) == 160  # views share its storage
    assert stored_bytes([weights[:2].clone()]) == 32


@pytest.fixture(scope="module")
def sharded_on_two():
    """The storages after a momentum step and the sharded build, in one launch of 2 workers
    (each job builds its own model from the seed): the start-up is paid once."""
    import workers

    jobs = [(momentum_step_bytes, (), {}), (workers.build_sharded_weights, (), {})]
    return launch(several, 2, jobs)


def test_each_fsdp2_worker_stores_half_of_every_part_after_a_momentum_step(sharded_on_two):
    """Notebook 08's exercise 1 grades against these storages: on 2 workers every part, the
    momentum included, is split evenly (the reference MLP's rows are even)."""
    whole = momentum_step_bytes()
    assert whole == dict.fromkeys(("parameters", "gradients", "optimizer_state"), PARAM_BYTES)
    launched = [r[0] for r in sharded_on_two]
    assert launched == [{k: v // 2 for k, v in whole.items()}] * 2
    # a fake process group in this process shards as the real workers did
    assert unlaunched_step_bytes(2) == launched[0]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_the_rss_is_not_compared_where_huge_pages_or_one_worker_would_blur_it(tmp_path):
    thp = tmp_path / "enabled"
    thp.write_text("always [madvise] never\n")
    assert why_rss_not_comparable(2, 0, thp) is None
    assert "2 workers" in why_rss_not_comparable(1, 0, thp)
    assert "AnonHugePages" in why_rss_not_comparable(2, 4 << 20, thp)
    thp.write_text("[always] madvise never\n")
    assert "always on" in why_rss_not_comparable(2, 0, thp)


def test_ring_bytes_per_worker():
    assert wire_bytes("all-reduce", 1000, 4) == 1500
    assert wire_bytes("all-gather", 1000, 4) == wire_bytes("reduce-scatter", 1000, 4) == 750
    assert wire_bytes("all-reduce", 1000, 1) == 0


def test_the_mlp_grows_in_width_and_depth_and_defaults_to_the_reference():
    assert count_parameters(make_mlp()) == 1_631_238 and gradient_bytes(make_mlp()) == PARAM_BYTES
    with torch.device("meta"):
        wide = make_mlp(hidden=64, hidden_layers=3)
    assert count_parameters(wide) == (561 * 64 + 64) + 2 * (64 * 64 + 64) + (64 * 6 + 6)
    with pytest.raises(ValueError, match="hidden layer"):
        make_mlp(hidden_layers=0)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"sync": "zero3"}, "sync must be"),
        ({"max_steps": 0}, "max_steps must be"),
    ],
)
def test_bad_settings_are_refused_in_one_line(change, words):
    with pytest.raises(ValueError, match=words):
        validate(replace(CONFIG, **change), 2, 7352)
    with pytest.raises(ValueError, match="optimizer must be"):
        make_optimizer(make_mlp(), replace(CONFIG, optimizer="lamb"))


def test_fsdp2_models_are_built_sharded_with_make_mlps_weights(sharded_on_two):
    """No rank builds the whole model: each holds half the parameters from the start, and
    together they hold exactly the weights make_mlp draws under the seed."""
    built = [r[1] for r in sharded_on_two]
    torch.manual_seed(0)
    reference = [p.detach() for p in make_mlp().parameters()]
    assert [b["held"] for b in built] == [count_parameters(make_mlp()) // 2] * 2
    for b in built:
        assert all(torch.equal(w, r) for w, r in zip(b["whole"], reference, strict=True))
