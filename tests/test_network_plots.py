"""Notebook 10's break-even figure draws what notebook 05's model says: read back from the axes."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from helpers.dist.comm_model import AlphaBeta  # noqa: E402
from helpers.experiments.scaling import GRADIENT_BYTES, ComputeModel  # noqa: E402
from helpers.notebook.network_plots import plot_break_even  # noqa: E402


def test_break_even_scales_with_the_compute_and_the_link():
    compute = ComputeModel(0.005, 100e-6)
    links = {"fast": AlphaBeta(0.0, 8 / 10e9), "slow": AlphaBeta(100e-6, 8 / 1e9)}
    fig = plot_break_even(compute, links, "test data", speedups=(1, 10, 100))
    left, right = fig.axes
    fast, slow = [line for line in right.get_lines() if line.get_label() in links]
    # break-even of 2 workers: c0 + c1 B = c0 + c1 B / 2 + a, so B = 2 a / c1
    for line, link in ((fast, links["fast"]), (slow, links["slow"])):
        a = link.alpha + link.beta * GRADIENT_BYTES
        expected = [2 * a / (compute.c1 / k) for k in (1, 10, 100)]
        np.testing.assert_allclose(line.get_ydata(), expected)
    # on the left, each link's curve crosses 1x at its dot
    curves = [line for line in left.get_lines() if line.get_label() in links]
    dots = [line for line in left.get_lines() if line.get_marker() == "o"]
    assert len(curves) == len(dots) == 2
    for curve, dot in zip(curves, dots, strict=True):
        x, y = curve.get_xdata(), curve.get_ydata()
        crossing = np.interp(1.0, y, x)  # the speed-up rises with the batch
        assert abs(np.log(crossing / dot.get_xdata()[0])) < 0.05
