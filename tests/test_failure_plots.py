"""Notebook 11's figures draw the tables they are given: straggler.slowdown_table and the models
it names; evaluation.padding_table under its bound; each run to the target, with its count."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from helpers.experiments import evaluation, straggler  # noqa: E402
from helpers.notebook.failure_plots import (  # noqa: E402
    plot_miscounted,
    plot_runs_to_target,
    plot_slowdown,
)


def test_the_slowdown_figure_draws_the_table_the_ceiling_and_the_any_straggler_model():
    samples = np.random.default_rng(0).gamma(4.0, 0.004, size=60)
    slow = straggler.slowdown_table(samples, [1, 2, 8, 64])
    left, right = plot_slowdown(slow, samples, "test data", probabilities=(0.01,)).axes
    drawn, gauss, ceiling = left.get_lines()
    np.testing.assert_allclose(drawn.get_ydata(), slow["slowdown"])
    # the table models compute alone (no all-reduce, no optimizer): the axis says so
    assert "compute" in left.get_ylabel() and "step" not in left.get_ylabel()
    assert gauss.get_ydata()[0] == 1.0  # one worker waits for no one
    np.testing.assert_allclose(ceiling.get_ydata(), samples.max() / samples.mean())
    (line,) = right.get_lines()
    table = straggler.any_straggler(0.01, [int(x) for x in line.get_xdata()])
    np.testing.assert_allclose(line.get_ydata(), table["step_slowed"])


def test_the_miscount_figure_draws_the_samplers_counts_under_workers_minus_one():
    rows = evaluation.padding_table(2996, list(range(2, 33)))
    (ax,) = plot_miscounted(rows, "test data").axes
    bound, twice, dropped = ax.get_lines()
    assert list(twice.get_ydata()) == [r["counted_twice"] for r in rows]
    assert list(dropped.get_ydata()) == [r["dropped_with_drop_last"] for r in rows]
    # DistributedSampler's own lengths: padding and dropping each stay under the bound drawn
    assert (twice.get_ydata() <= bound.get_ydata()).all()
    assert (dropped.get_ydata() <= bound.get_ydata()).all()
    assert "test data" in ax.get_title()


def test_the_runs_figure_draws_each_evaluation_its_moving_average_and_the_count():
    runs = pd.DataFrame([
        {"global_batch": 100, "seed": 0, "steps": 4, "marks": [1, 2, 3, 4, 5, 6],
         "accuracies": [0.5, 0.7, 0.9, 0.8, 0.8, 0.8]},
        {"global_batch": 100, "seed": 1, "steps": float("inf"), "marks": [1, 2, 3],
         "accuracies": [0.1, 0.2, 0.3]},
    ])  # fmt: skip
    fig = plot_runs_to_target(runs, 0.75, 200, "test data")
    (ax,) = fig.axes
    raw, smooth, count, raw_1, smooth_1, target = ax.get_lines()
    np.testing.assert_allclose(raw.get_xdata(), [0.5, 1, 1.5, 2, 2.5, 3])  # steps x 100 / 200
    np.testing.assert_allclose(smooth.get_ydata(), [0.7, 0.8, 2.5 / 3, 0.8])  # means of 3
    # the count: step 4, where the mean of the evaluations at steps 2, 3 and 4 is 0.8
    assert count.get_xdata()[0] == 2 and np.isclose(count.get_ydata()[0], 0.8)
    assert len(smooth_1.get_ydata()) == 1 and list(target.get_ydata()) == [0.75, 0.75]
    # one legend entry per seed, and one for each kind of line: evaluation, mean, count, target
    entries = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert entries[:2] == ["seed 0", "seed 1"] and len(entries) == 6
    assert entries[-1] == "target 75%" and "test data" in fig.texts[0].get_text()
