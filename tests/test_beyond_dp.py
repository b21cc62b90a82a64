"""Tensor, pipeline and mixed-precision parallelism (notebook 09): each split does one worker's
training to rounding, and sends and holds the bytes the arithmetic says; a wrong split is caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from helpers.data import load_har
from helpers.dist.comm_model import AlphaBeta
from helpers.dist.counting import CollectiveCounter, per_step_traffic, wire_bytes
from helpers.dist.launch import WorkerError, launch
from helpers.experiments import mixed_precision
from helpers.experiments.mesh2d import mesh2d_worker
from helpers.experiments.mixed_precision import (
    bf16_ratios,
    bytes_per_parameter,
    cpu_features,
    fsdp_mp_worker,
    held_per_parameter,
    paired_seconds,
    train_precision,
)
from helpers.experiments.parallelism_costs import Workload, costs, tensor_messages
from helpers.experiments.pipeline import (
    assemble,
    imbalance_floor,
    pipeline_worker,
    replay,
    stage_module,
    textbook_bubble,
    textbook_order,
)
from helpers.experiments.saved_activations import SavedActivations
from helpers.experiments.split_training import SAME_STEPS_ATOL, Steps, gaps, one_worker, several
from helpers.experiments.tensor_parallel import describe, held_worker, megatron_plan, tp_worker
from helpers.training.model import GRADIENT_BYTES, make_mlp

SPEC = Steps(steps=3, data="standin")
COURSE = Workload((561, 1024, 1024, 6), 256, 0.0)
ACTIVATION = 256 * 1024 * 4  # one batch of the hidden layer's float32 activations


@pytest.fixture(scope="module")
def reference():
    return one_worker(SPEC)


@pytest.fixture(scope="module")
def two_workers():
    """The 2-worker jobs of this module's default tests in one launch: the start-up
    (processes, imports, data) is paid once. Each job builds its own model from the seed."""
    trainings = [("GPipe", 4, True), ("1F1B", 4, True), ("1F1B", 4, False)]
    jobs = [
        (tp_worker, (SPEC,), {}),
        (held_worker, (SPEC, (256,)), {}),
        (pipeline_worker, (SPEC, 2, trainings, [2, 4], 1), {}),
    ]
    return launch(several, 2, jobs)


@pytest.fixture(scope="module")
def tensor_parallel(two_workers):
    return [r[0] for r in two_workers], two_workers[0][1]


@pytest.fixture(scope="module")
def pipelined(two_workers):
    return [r[2] for r in two_workers]


def _close(record: dict, reference: dict) -> bool:
    return max(gaps(record, reference).values()) < SAME_STEPS_ATOL


def test_tensor_parallel_training_is_one_workers(tensor_parallel, reference):
    records, _ = tensor_parallel
    for record in records:
        assert _close(record, reference), gaps(record, reference)
        assert record["grad_is_dtensor"] == [True] * 4 + [False] * 2
    assert records[0]["layouts"]["0.weight"] == "S(0) (512, 561) of (1024, 561)"
    assert records[0]["layouts"]["2.weight"] == "S(1) (1024, 512) of (1024, 1024)"


def test_tensor_parallel_sends_one_activation_all_reduce_per_step(tensor_parallel):
    records, held = tensor_parallel
    assert records[0]["calls"] == [("all-reduce", ACTIVATION)]  # as the dispatcher saw it
    assert records[0]["debug_counts"] == {"all_reduce": 1}  # as DTensor's CommDebugMode did
    assert tensor_messages(COURSE) == [ACTIVATION]
    sent = {name: per_step_traffic(r["calls"][256], 2) for name, r in held.items()}
    modelled = costs(COURSE, 2, AlphaBeta(0, 1), 1e12)["sent MB"] * 1e6
    assert sent["TP"]["all-reduce"]["wire_bytes"] == modelled["tensor"] == ACTIVATION
    assert sent["DDP"]["all-reduce"]["wire_bytes"] == modelled["data (DDP)"] == GRADIENT_BYTES
    fsdp = sent["FSDP2"]["all-gather"]["wire_bytes"] + sent["FSDP2"]["reduce-scatter"]["wire_bytes"]
    assert fsdp == pytest.approx(modelled["FSDP"]) and fsdp == 1.5 * GRADIENT_BYTES


def test_tensor_parallel_holds_what_the_plan_leaves_whole(tensor_parallel):
    _, held = tensor_parallel
    whole = 1024 + 6 * 1024 + 6  # the row-parallel bias and the output layer
    halves = (561 * 1024 + 1024 + 1024 * 1024) // 2
    assert held["TP"]["held"]["parameters"] == 4 * (whole + halves)
    assert held["DDP"]["held"]["parameters"] == GRADIENT_BYTES
    assert held["FSDP2"]["held"]["parameters"] == GRADIENT_BYTES // 2
    modelled = costs(COURSE, 2, AlphaBeta(0, 1), 1e12).loc["tensor", "held MB"] * 1e6
    assert 4 * held["TP"]["held"]["parameters"] == pytest.approx(modelled, abs=1)


def test_megatron_plan_pairs_the_hidden_layers():
    plan = megatron_plan(make_mlp(hidden_layers=4))
    assert [(k, type(v)) for k, v in plan.items()] == [
        ("0", ColwiseParallel), ("2", RowwiseParallel), ("4", ColwiseParallel),
        ("6", RowwiseParallel)]  # fmt: skip
    deep = Workload((561,) + (1024,) * 4 + (6,), 256, 0.0)
    assert tensor_messages(deep) == [ACTIVATION] * 3  # 2 forward, 1 backward


def test_pipelines_train_as_one_worker_and_unscaled_gradients_are_caught(pipelined, reference):
    for key in (("GPipe", 4, True), ("1F1B", 4, True)):
        assert _close(assemble([r["trained"][key] for r in pipelined]), reference), key
    wrong = gaps(assemble([r["trained"]["1F1B", 4, False] for r in pipelined]), reference)
    assert wrong["logits"] < SAME_STEPS_ATOL  # the same first forward...
    assert wrong["grads"] > 100 * SAME_STEPS_ATOL  # ...and gradients 4 times too large


def test_pipeline_stages_run_the_papers_orders(pipelined):
    for stage, report in enumerate(pipelined):
        for name, m, scale in report["trained"]:
            assert report["trained"][name, m, scale]["order"] == textbook_order(name, stage, 2, m)
    assert textbook_order("1F1B", 0, 2, 4) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert textbook_order("1F1B", 1, 2, 4) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


def test_pytorch_plans_1f1b_last_stage_forwards_from_micro_batch_one(pipelined):
    # Upstream behaviour, not ours: PyTorch 2.13's Schedule1F1B.pipeline_order (what its
    # schedule visualiser draws) numbers the last stage's forwards from 1, F1 ... F4 for m = 4,
    # where there is no micro-batch 4, while the schedule that runs does F0 B0 F1 B1 ... (the
    # test above). Notebook 09's paragraph after its pipeline orders describes this slip: when a
    # release fixes the plan, this fails, and that paragraph must change with it.
    first, last = (report["trained"]["1F1B", 4, True]["planned_order"] for report in pipelined)
    assert first == textbook_order("1F1B", 0, 2, 4)
    assert last == ["F1", "B0", "F2", "B1", "F3", "B2", "F4", "B3"]
    assert pipelined[1]["trained"]["1F1B", 4, True]["order"] == textbook_order("1F1B", 1, 2, 4)


def test_gpipe_keeps_every_micro_batch_and_1f1b_at_most_p_minus_s(pipelined):
    inputs = {0: 256 * (561 + 1024) * 4, 1: 256 * 2048 * 4}  # what each stage saves per batch
    peaks = [r for report in pipelined for r in report["timed"] if r["repeat"] == 0]
    assert len(peaks) == 2 * 2 * 2  # 2 stages x 2 schedules x m in (2, 4)
    for row in peaks:
        alive = row["m"] if row["schedule"] == "GPipe" else 2 - row["stage"]
        assert row["peak_micro_batches"] == alive, row
        assert row["peak_bytes"] == inputs[row["stage"]] * alive // row["m"], row


def test_each_stage_sends_one_batch_of_activations_or_gradients(pipelined):
    for report in pipelined:
        calls = report["trained"]["1F1B", 4, True]["calls"]
        traffic = per_step_traffic(calls, 2)
        assert traffic["send"] == {"calls": 4, "message_bytes": ACTIVATION,
                                   "wire_bytes": ACTIVATION}  # fmt: skip
        assert traffic["receive"]["wire_bytes"] == 0  # counted by its sender


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_replay_of_equal_stages_gives_the_textbook_bubble(stages, m, schedule):
    ops = {s: [(op, 1.0 if op[0] == "F" else 2.0) for op in textbook_order(schedule, s, stages, m)]
           for s in range(stages)}  # fmt: skip
    assert replay(ops)["pipeline idle"] == pytest.approx(textbook_bubble(stages, m))


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_replay_of_unequal_stages_tends_to_the_imbalance_floor(schedule):
    # stage 1 twice as slow as stage 0 in its forwards and its backwards: a quarter idle at most m
    per_stage = {0: (1.0, 2.0), 1: (2.0, 4.0)}
    floor = imbalance_floor([sum(per_stage[0]), sum(per_stage[1])])
    assert floor == pytest.approx(0.25)
    idle = []
    for m in (2, 8, 64):
        ops = {s: [(op, per_stage[s][op[0] == "B"]) for op in textbook_order(schedule, s, 2, m)]
               for s in (0, 1)}  # fmt: skip
        idle.append(replay(ops)["pipeline idle"])
        assert floor <= idle[-1] <= floor + textbook_bubble(2, m)
    assert idle == sorted(idle, reverse=True) and idle[-1] == pytest.approx(floor, abs=0.01)


def test_describe_tells_styles_of_one_class_apart_by_their_layouts():
    from torch.distributed.tensor import Shard

    plain, sharded_output = ColwiseParallel(), ColwiseParallel(output_layouts=Shard(0))
    assert describe({"0": plain}) == ["0: ColwiseParallel, input R, output S(-1)"]
    assert describe({"0": plain}) != describe({"0": sharded_output})


def test_replay_refuses_orders_that_wait_on_each_other():
    ops = {0: [("B0", 1.0), ("F0", 1.0)], 1: [("F0", 1.0), ("B0", 1.0)]}
    with pytest.raises(ValueError, match="not a pipeline schedule"):
        replay(ops)


def test_a_split_outside_the_model_says_what_to_choose():
    with pytest.raises(ValueError, match="1 to 4, got 5"):
        stage_module(make_mlp(), 5, 0)


def test_too_many_steps_for_the_data_says_so():
    with pytest.raises(ValueError, match="take fewer steps"):
        Steps(steps=100, global_batch=256).batches(7415)


def test_autocast_halves_the_saved_activations_and_keeps_weight_copies():
    torch.manual_seed(0)
    model = make_mlp()
    saved = {}
    for bf16 in (False, True):
        meter = SavedActivations(list(model.parameters()))
        with meter.hooks(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(torch.randn(256, 561))
        saved[bf16] = (meter.peak_bytes, meter.peak_copy_bytes)
    assert saved[False] == (256 * (561 + 1024 + 1024) * 4, 0)
    assert saved[True] == (saved[False][0] // 2, (1024 * 1024 + 6 * 1024) * 2)


@pytest.mark.slow
def test_fsdp2_mixed_precision_runs_on_gloo_and_halves_the_gathers():
    report = launch(fsdp_mp_worker, 2, SPEC)[0]
    assert {name: r["error"] for name, r in report.items()} == dict.fromkeys(report)
    sent = {name: per_step_traffic(r["calls"], 2) for name, r in report.items()}
    full, mixed = sent["FSDP2 fp32"], sent["FSDP2 bf16 params, fp32 reduce"]
    assert 2 * mixed["all-gather"]["message_bytes"] == full["all-gather"]["message_bytes"]
    assert mixed["reduce-scatter"] == full["reduce-scatter"]
    assert sent["DDP autocast bf16"] == sent["DDP fp32"]
    assert report["FSDP2 fp32"]["gap"] < SAME_STEPS_ATOL
    assert SAME_STEPS_ATOL < report["FSDP2 bf16 params, fp32 reduce"]["gap"] < 1e-3


def test_mixed_precision_keeps_sixteen_bytes_per_parameter_with_adam():
    # read from the tensors of a real step; Adam's step counts (4 bytes per tensor) aside
    for mixed in (False, True):
        held = held_per_parameter(mixed)
        assert held == pytest.approx(bytes_per_parameter(mixed), abs=1e-3), (mixed, held)
    assert sum(held_per_parameter(True).values()) == pytest.approx(16, abs=1e-3)
    # Adam given the bf16 model itself keeps bf16 moments: the mistake the master copy avoids
    assert held_per_parameter(True, adam_on_bf16=True)["optimizer"] == pytest.approx(4, abs=1e-3)


def test_precision_training_records_which_test_samples_it_got_right(monkeypatch):
    # the per-sample record McNemar's test pairs (notebook 09) is the accuracy's own evaluation;
    # 3 steps of 256 (the first 768 training samples) train enough to tell bf16 from float32,
    # and the whole test split is still evaluated
    def first_768(*args, **kwargs):
        har = load_har(*args, **kwargs)
        return dataclasses.replace(har, X_train=har.X_train[:768], y_train=har.y_train[:768])

    monkeypatch.setattr(mixed_precision, "load_har", first_768)
    runs = {bf16: train_precision(0, bf16, 1, 256, 0.05, "standin") for bf16 in (False, True)}
    for run in runs.values():
        correct = run["correct"]
        assert correct.dtype == bool and correct.ndim == 1 and 0 < correct.sum() < correct.size
        assert correct.size == len(load_har("standin", download=False).y_test)
        assert correct.mean() == pytest.approx(run["accuracy"], abs=1e-6)
        assert len(run["losses"]) == 3
    # autocast did act: the same seed and batches, losses apart by bf16's rounding, not more
    assert runs[True]["losses"] != runs[False]["losses"]
    np.testing.assert_allclose(runs[True]["losses"], runs[False]["losses"], rtol=2e-2)


def test_cpu_features_read_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_features(str(info)) == {"amx_bf16": False, "avx512_bf16": True,
                                       "avx512f": True, "avx2": True}  # fmt: skip
    assert cpu_features(str(tmp_path / "missing")) == {}


def test_paired_seconds_time_float32_and_bf16_in_turn_and_ratios_summarise_them():
    torch.set_num_threads(1)
    rows = paired_seconds(pairs=3, batch=8)
    assert [r["pair"] for r in rows] == [0, 1, 2]
    keys = ("matmul_f32_cpu_s", "matmul_bf16_cpu_s", "step_f32_cpu_s", "step_bf16_cpu_s")
    assert all(r[k] > 0 for r in rows for k in keys)
    product_only = paired_seconds(pairs=2, batch=8, step=False, warmup=0)
    assert all("step_f32_cpu_s" not in r for r in product_only)
    table = bf16_ratios([{"cap": "", "onednn_bf16": True, **r} for r in rows]
                        + [{"cap": "AVX2", "onednn_bf16": False, **r} for r in product_only])
    assert list(table.index) == [("this processor, uncapped", "product"),
                                 ("this processor, uncapped", "training step"),
                                 ("AVX2 (Haswell to Zen 3)", "product")]  # fmt: skip
    ratios = [r["matmul_bf16_cpu_s"] / r["matmul_f32_cpu_s"] for r in rows]
    product = table.loc[("this processor, uncapped", "product")]
    assert product["pairs"] == 3 and product["bf16/float32"] == pytest.approx(sorted(ratios)[1])
    assert (product["min"], product["max"]) == (min(ratios), max(ratios))
    with pytest.raises(ValueError, match="pairs must be at least 1"):
        paired_seconds(pairs=0)


def test_sends_count_once_and_functional_collectives_are_seen():
    assert wire_bytes("receive", 100, 2) == 0.0 and wire_bytes("send", 100, 2) == 100.0
    with CollectiveCounter() as counter:
        torch.ones(2) + 1  # no collective: nothing counted
    assert counter.calls == []


@pytest.mark.slow
def test_a_two_dimensional_mesh_trains_as_one_worker(reference):
    ranks = launch(mesh2d_worker, 4, SPEC)
    for record in ranks:
        assert _close(record, reference), gaps(record, reference)
        assert record["held"]["parameters"] < 0.26 * GRADIENT_BYTES


@pytest.mark.slow
def test_a_mesh_that_does_not_divide_the_workers_is_refused():
    with pytest.raises(WorkerError, match="do not make a mesh with 2 rows"):
        launch(mesh2d_worker, 3, SPEC)
