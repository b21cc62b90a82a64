"""helpers.experiments.parallelism_costs without workers: the pipeline's stages, the bytes of
bf16 activations, and Gloo's reduce-scatter, each against arithmetic done here by hand."""

from __future__ import annotations

import pytest

from helpers.dist.comm_model import AlphaBeta
from helpers.experiments.parallelism_costs import Workload, costs, pipeline_split, tensor_messages

COURSE = (561, 1024, 1024, 6)
FIRST, SECOND, OUTPUT = 561 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 6 + 6
FREE = AlphaBeta(0, 1e-12)  # communication that costs nothing: the compute alone


def test_the_course_mlp_splits_after_its_first_layer():
    # after the first layer: 575k against 1.06M; after the second: 1.63M against 6k
    widths, stages = pipeline_split(Workload(COURSE, 256, 0.0), 2)
    assert widths == [1024] and stages == [FIRST, SECOND + OUTPUT]


def test_the_split_minimises_the_largest_stage():
    work = Workload((10, 100, 10, 10, 10, 10), 1, 0.0)  # layers of 1100, 1010, 110, 110, 110
    widths, stages = pipeline_split(work, 2)
    assert stages == [1100, 1340] and widths == [100]
    _, three = pipeline_split(work, 3)
    assert three == [1100, 1010, 330]


def test_more_stages_than_layers_keeps_one_layer_per_stage():
    widths, stages = pipeline_split(Workload(COURSE, 256, 0.0), 4)
    assert stages == [FIRST, SECOND, OUTPUT] and widths == [1024, 1024, 1024]


def test_the_pipeline_computes_at_its_largest_stages_pace():
    rate, m = 1e-12, 8
    work = Workload(COURSE, 256, rate)
    table = costs(work, 2, FREE, 1e12, m)
    whole = rate * 256 * work.parameters
    bubble = 1 / (m + 1)
    assert table.loc["pipeline", "compute ms"] == pytest.approx(
        1e3 * rate * 256 * (SECOND + OUTPUT) / (1 - bubble))
    # slower than balanced stages would be, which is what the old model charged
    assert table.loc["pipeline", "compute ms"] > 1e3 * whole / 2 / (1 - bubble) * 1.2
    assert table.loc["pipeline", "held MB"] == pytest.approx(16 * (SECOND + OUTPUT) / 1e6)
    # 4 layers of 100 x 100 in 2 stages are balanced: compute / 2, stretched by the bubble
    even = Workload((100,) * 5, 256, rate)
    assert costs(even, 2, FREE, 1e12, m).loc["pipeline", "compute ms"] == pytest.approx(
        1e3 * rate * 256 * even.parameters / 2 / (1 - bubble))


def test_bf16_activations_halve_what_tensor_and_pipeline_send_only():
    fp32 = Workload(COURSE, 256, 0.0)
    bf16 = Workload(COURSE, 256, 0.0, activation_bytes=2)
    assert tensor_messages(fp32) == [256 * 1024 * 4] and tensor_messages(bf16) == [256 * 1024 * 2]
    a, b = (costs(w, 2, FREE, 1e12)["sent MB"] for w in (fp32, bf16))
    assert b["tensor"] == a["tensor"] / 2 and b["pipeline"] == a["pipeline"] / 2
    assert b["data (DDP)"] == a["data (DDP)"] and b["FSDP"] == a["FSDP"]  # float32 gradients
    assert (costs(bf16, 2, FREE, 1e12)["held MB"] == costs(fp32, 2, FREE, 1e12)["held MB"]).all()


def test_gloos_reduce_scatter_makes_fsdp_twice_ddps_bytes():
    work = Workload(COURSE, 256, 0.0)
    ring, gloo = (costs(work, 2, FREE, 1e12, gloo=g)["sent MB"] for g in (False, True))
    assert ring["FSDP"] == pytest.approx(1.5 * ring["data (DDP)"])
    assert gloo["FSDP"] == pytest.approx(2 * gloo["data (DDP)"])
    assert gloo.drop("FSDP").equals(ring.drop("FSDP"))
