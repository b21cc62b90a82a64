"""Notebook 08's communication figures draw the numbers they are given: read back from the axes."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from fakes import run_result  # noqa: E402

from helpers.experiments.sharding import (  # noqa: E402
    _step_quartiles,
    step_ranking,
    traffic_table,
)
from helpers.notebook.sharding_plots import (  # noqa: E402
    plot_step_against_collectives,
    plot_wire_bytes,
)
from helpers.training.runs import RunResult  # noqa: E402


def _run(sync: str, calls: list[tuple[str, int]], step_s: float, replay_s: float) -> RunResult:
    probe = {"calls": calls, "step_seconds": step_s, "step_q1_seconds": step_s - 0.005,
             "step_q3_seconds": step_s + 0.010, "replay_seconds": replay_s}
    return run_result(sync=sync, probes=[probe])


def test_the_wire_figure_draws_measured_and_ring_bars_in_the_given_order():
    sent = {"all_reduce": 1.01, "reduce_scatter": 0.98, "all_gather": 0.52}
    ring = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5}
    fig = plot_wire_bytes(sent, ring, "test source")
    (ax,) = fig.axes
    bars = ax.patches
    measured, rings = bars[:3], bars[3:]
    np.testing.assert_allclose([b.get_height() for b in measured], list(sent.values()))
    np.testing.assert_allclose([b.get_height() for b in rings], list(ring.values()))
    assert all(b.get_fill() for b in measured) and not any(b.get_fill() for b in rings)
    # each measured bar stands left of its ring bar, at its collective's tick
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["all-reduce", "reduce-scatter", "all-gather"]
    for m, r in zip(measured, rings, strict=True):
        assert m.get_x() < r.get_x() < m.get_x() + 2 * m.get_width()
    assert "test source" in ax.get_title()


def test_the_wire_figure_refuses_a_collective_without_a_ring_figure():
    with pytest.raises(ValueError, match="all_to_all"):
        plot_wire_bytes({"all_to_all": 1.0}, {"all_reduce": 1.0}, "test source")


def test_the_step_figure_draws_each_runs_step_and_collectives_with_their_calls():
    megabyte = 1_000_000
    runs = [
        _run("ddp", [("all-reduce", 4 * megabyte), ("all-reduce", 2 * megabyte)], 0.120, 0.012),
        _run(
            "fsdp2",
            [("all-gather", megabyte)] * 6 + [("reduce-scatter", 2 * megabyte)] * 3,
            0.119,
            0.029,
        ),
    ]
    table = traffic_table(runs)
    fig = plot_step_against_collectives(table, "test data")
    (ax,) = fig.axes
    steps, alone = ax.patches[:2], ax.patches[2:]
    np.testing.assert_allclose([b.get_width() for b in steps], [120.0, 119.0])
    np.testing.assert_allclose([b.get_width() for b in alone], [12.0, 29.0])
    # the first run on top, each run's two bars side by side at its tick
    assert steps[0].get_y() > steps[1].get_y()
    labels = {
        round(t, 6): s.get_text()
        for t, s in zip(ax.get_yticks(), ax.get_yticklabels(), strict=True)
    }
    top, bottom = labels[max(labels)], labels[min(labels)]
    assert top.startswith("DDP, 2 workers") and "2 all-reduces" in top
    assert bottom.startswith("FSDP2, 2 workers")
    assert "6 all-gathers" in bottom and "3 reduce-scatters" in bottom
    assert "all-reduce" not in bottom
    assert "test data" in ax.get_title()
    # each step bar's whisker spans its quartiles: 5 ms below the median, 10 above
    (whiskers,) = [c for c in ax.collections if len(c.get_segments()) == 2]
    spans = sorted((min(x for x, _ in s), max(x for x, _ in s)) for s in whiskers.get_segments())
    np.testing.assert_allclose(spans, [(114.0, 129.0), (115.0, 130.0)])


def test_the_step_quartiles_leave_out_the_first_step_and_bracket_the_median():
    times = [0.0, 5.0, 6.0, 7.0, 8.0, 9.5, 11.0]  # the first step took 5 s: left out
    quartiles = _step_quartiles(times)
    assert quartiles["step_seconds"] == 1.0
    assert quartiles["step_q1_seconds"] == 1.0 and quartiles["step_q3_seconds"] == 1.5
    assert _step_quartiles([0.0, 1.0])["step_seconds"] is None  # one step: nothing to time


def test_steps_rank_only_where_their_middle_halves_do_not_overlap():
    megabyte = 1_000_000
    calls = [("all-reduce", megabyte)]
    close = traffic_table([_run("ddp", calls, 0.120, 0.01), _run("fsdp2", calls, 0.125, 0.01)])
    (line,) = step_ranking(close)  # 115-130 against 120-135 ms: they overlap
    assert line.startswith("DDP, 2 workers and FSDP2, 2 workers tie")
    apart = traffic_table([_run("ddp", calls, 0.150, 0.01), _run("fsdp2", calls, 0.120, 0.01)])
    (line,) = step_ranking(apart)  # 145-160 against 115-130 ms
    assert line.startswith("FSDP2, 2 workers faster than DDP, 2 workers")


def test_replay_by_kind_sums_each_kinds_calls_and_refuses_a_run_not_replayed():
    from helpers.experiments.sharding import label, replay_by_kind

    calls = [("all-gather", 2_000_000), ("reduce-scatter", 4_000_000), ("all-gather", 2_000_000)]
    probe = {"calls": calls, "replay_call_seconds": [0.001, 0.008, 0.003]}
    run = run_result(sync="fsdp2", probes=[probe])
    table = replay_by_kind([run])
    gathers = table.loc[(label(run), "all-gather")]
    scatter = table.loc[(label(run), "reduce-scatter")]
    assert gathers["calls"] == 2 and gathers["message MB"] == pytest.approx(4.0)
    assert gathers["alone ms"] == pytest.approx(4.0) and gathers["ms per MB"] == pytest.approx(1.0)
    assert scatter["calls"] == 1 and scatter["ms per MB"] == pytest.approx(2.0)
    assert gathers["ms per call"] == pytest.approx(2.0)
    assert (label(run), "all-reduce") not in table.index  # no call of that kind, no row
    with pytest.raises(ValueError, match="replay_repeats"):
        replay_by_kind([run_result(sync="ddp", probes=[{**probe, "replay_call_seconds": None}])])


def test_the_split_figure_stacks_compute_collectives_and_the_rest_of_each_step():
    import pandas as pd

    from helpers.notebook.sharding_plots import plot_step_split

    index = pd.MultiIndex.from_tuples([("quiet", "DDP, 2 workers"), ("quiet", "FSDP2, 2 workers")],
                                      names=["launch", "run"])  # fmt: skip
    table = pd.DataFrame({"step ms": [30.0, 40.0], "compute ms": [20.0, 20.0],
                          "collectives alone ms": [12.0, 15.0], "left ms": [-2.0, 5.0],
                          "faults per step, fewest rank": [0, 10],
                          "faults per step, most": [0, 12]}, index=index)  # fmt: skip
    fig = plot_step_split(table, "test data")
    (ax,) = fig.axes
    compute, alone, left = ax.patches[:2], ax.patches[2:4], ax.patches[4:]
    np.testing.assert_allclose([b.get_width() for b in compute], [20.0, 20.0])
    np.testing.assert_allclose([b.get_width() for b in alone], [12.0, 15.0])
    np.testing.assert_allclose([b.get_x() for b in alone], [20.0, 20.0])  # after the compute
    # what is left starts where the collectives end, and a negative rest reaches back over them
    np.testing.assert_allclose([b.get_x() for b in left], [32.0, 35.0])
    np.testing.assert_allclose([b.get_x() + b.get_width() for b in left], [30.0, 40.0])
    assert compute[0].get_y() > compute[1].get_y()  # the first row on top
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["30 ms, 0 faults", "40 ms, 12 faults"]
    ticks = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()), strict=True))
    assert ticks[max(ticks)] == "quiet: DDP, 2 workers"
    assert ticks[min(ticks)] == "quiet: FSDP2, 2 workers"
    assert "test data" in ax.get_title()
