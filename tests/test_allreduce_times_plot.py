"""Notebook 02's histogram of all-reduce times: read back from the axes."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from helpers.notebook.plotting import plot_allreduce_times  # noqa: E402


def _probed(hz: int | None) -> pd.DataFrame:
    """A probe_wakeups table as it comes back: two conditions, times in seconds."""
    table = pd.DataFrame({"cores": ["any", "one each"], "competitor": ["none", "spinning"]})
    table.attrs.update(hz=hz, times=[[0.0005, 0.003, 0.016, 0.040, 1.5], [0.001, 0.0159]])
    return table


def test_calls_beyond_the_axis_count_in_a_labelled_last_bin():
    ax = plot_allreduce_times(_probed(250), "test data").axes[0]
    outlines = [p for p in ax.patches if hasattr(p, "get_data")]  # the stairs, not the shading
    counts = [p.get_data().values for p in outlines]
    assert [c.sum() for c in counts] == [5, 2]  # every call drawn, none dropped
    edges = outlines[0].get_data().edges
    assert edges[-2] == 16.0
    assert [c[-1] for c in counts] == [3, 0]  # 16, 40 and 1,500 ms; 15.9 ms is not among them
    labels = {t.get_text(): t.get_position()[0] for t in ax.get_xticklabels()}
    assert edges[-2] < labels["≥16"] < edges[-1]
    ticks = [line.get_xdata()[0] for line in ax.get_lines()]
    np.testing.assert_allclose(ticks, [4, 8, 12, 16])  # HZ = 250: a tick every 4 ms


def test_without_the_tick_no_tick_lines_are_drawn():
    ax = plot_allreduce_times(_probed(None), "test data").axes[0]
    assert not ax.get_lines()
