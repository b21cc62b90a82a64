"""Notebook 11's slowdown figure draws straggler.slowdown_table and the models it names."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from helpers.experiments import straggler  # noqa: E402
from helpers.notebook.failure_plots import plot_slowdown  # noqa: E402


def test_the_slowdown_figure_draws_the_table_the_ceiling_and_the_any_straggler_model():
    samples = np.random.default_rng(0).gamma(4.0, 0.004, size=60)
    slow = straggler.slowdown_table(samples, [1, 2, 8, 64])
    left, right = plot_slowdown(slow, samples, "test data", probabilities=(0.01,)).axes
    drawn, gauss, ceiling = left.get_lines()
    np.testing.assert_allclose(drawn.get_ydata(), slow["slowdown"])
    assert gauss.get_ydata()[0] == 1.0  # one worker waits for no one
    np.testing.assert_allclose(ceiling.get_ydata(), samples.max() / samples.mean())
    (line,) = right.get_lines()
    table = straggler.any_straggler(0.01, [int(x) for x in line.get_xdata()])
    np.testing.assert_allclose(line.get_ydata(), table["step_slowed"])
