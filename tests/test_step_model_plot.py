"""Notebook 05's figure of the step-time model: read back from the axes."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from helpers.dist.comm_model import AlphaBeta  # noqa: E402
from helpers.experiments.scaling import ComputeModel  # noqa: E402
from helpers.notebook.plotting import plot_step_model  # noqa: E402


def test_the_break_even_mark_sits_where_the_two_step_times_cross():
    compute = ComputeModel(0.004, 110e-6)
    comms = {2: AlphaBeta(700e-6, 0.7e-9)}
    batches = [64, 256, 1024, 4096]
    table = pd.DataFrame(
        [{"world": w, "global_batch": b, "step_seconds": 0.001 * w + 1e-4 * b / w}
         for w in (1, 2) for b in batches]  # fmt: skip
    )
    ax = plot_step_model(table, compute, comms, "test data").axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    measured = lines["2 workers with DDP, measured"]
    np.testing.assert_allclose(measured.get_ydata(), [2 + 0.05 * b for b in batches])
    one = lines["1 worker, fitted c0 + c1 B"]
    two = next(v for k, v in lines.items() if k.startswith("2 workers, model"))
    mark = next(v for k, v in lines.items() if "break even" in k)
    x = one.get_xdata()
    gap = np.log(two.get_ydata() / one.get_ydata())  # falls as the batch grows
    crossing = np.interp(0.0, gap[::-1], x[::-1])
    assert abs(np.log(crossing / mark.get_xdata()[0])) < 0.02
