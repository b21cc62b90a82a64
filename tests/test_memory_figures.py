"""The figures that draw notebook 08's ZeRO arithmetic and notebook 09's activation peaks and
bf16 timing ratios: what they draw is their table's numbers, and each names its data source."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers.experiments.memory import MB, expected_bytes  # noqa: E402
from helpers.notebook.parallelism_plots import (  # noqa: E402
    plot_activation_peaks,
    plot_bf16_ratios,
)
from helpers.notebook.plotting import plot_zero_stages  # noqa: E402


def _stacked_tops(ax) -> list[float]:
    """Per bar position, the top of its highest stacked bar."""
    tops: dict[float, float] = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2, 6)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    return [tops[x] for x in sorted(tops)]


def test_zero_stages_stacks_each_stages_bytes_per_world_size():
    fig = plot_zero_stages(8e6, "adam", [1, 4], "model: X")
    for ax, n in zip(fig.axes, [1, 4], strict=True):
        expected = [sum(expected_bytes(8e6, "adam", n, s).values()) / MB for s in range(4)]
        assert np.allclose(_stacked_tops(ax), expected)
        assert len(ax.patches) == 12  # 4 stages x (parameters, gradients, optimizer state)
    assert np.isclose(_stacked_tops(fig.axes[1])[3], _stacked_tops(fig.axes[1])[0] / 4)
    assert "model: X" in fig._suptitle.get_text()
    plt.close(fig)


def test_zero_stages_draw_a_budget_across_every_panel_when_given():
    fig = plot_zero_stages(8e6, "adam", [1, 4], "model: X", budget=100.0)
    for ax in fig.axes:
        (line,) = ax.get_lines()
        assert list(line.get_ydata()) == [100.0, 100.0]
        assert ax.get_ylim()[1] > 100.0
    assert not plot_zero_stages(8e6, "adam", [1], "model: X").axes[0].get_lines()
    plt.close("all")


def test_activation_peaks_draw_one_line_per_schedule_and_stage():
    peaks = pd.DataFrame([
        {"schedule": s, "m": m, "stage": st, "activations MB": (st + 1) * m if s == "GPipe" else 1}
        for s in ("GPipe", "1F1B") for m in (2, 4, 8) for st in (0, 1)
    ])  # fmt: skip
    fig = plot_activation_peaks(peaks, "data: X")
    assert len(fig.axes) == 2
    for stage, ax in enumerate(fig.axes):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"GPipe", "1F1B"}
        assert list(lines["GPipe"].get_ydata()) == [(stage + 1) * m for m in (2, 4, 8)]
    assert "data: X" in fig._suptitle.get_text()
    plt.close(fig)


def test_bf16_ratios_draw_each_median_with_its_min_and_max():
    index = pd.MultiIndex.from_tuples([("a", "product"), ("b", "product")])
    table = pd.DataFrame({"pairs": [10, 3], "bf16/float32": [0.5, 60.0], "min": [0.4, 55.0],
                          "max": [0.7, 70.0]}, index=index)  # fmt: skip
    fig = plot_bf16_ratios(table, "data: X")
    ax = fig.axes[0]
    dots = ax.lines[0]  # the medians, one per row, top down
    assert list(dots.get_xdata()) == [0.5, 60.0] and list(dots.get_ydata()) == [0, 1]
    whiskers = ax.collections[0].get_segments()  # each from its min to its max
    assert [(w[0][0], w[1][0]) for w in whiskers] == [(0.4, 0.7), (55.0, 70.0)]
    assert ax.get_xscale() == "log" and "data: X" in ax.get_title()
    assert ax.get_xlim()[0] < 1.0 < ax.get_xlim()[1]  # the line at 1 is in view
    # the legend under the x label, where no dot (in any corner of the axes) can sit
    fig.canvas.draw()  # places the x label
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.y1 <= ax.xaxis.label.get_window_extent(renderer).y0
    assert legend.y0 >= 0  # and still on the figure
    plt.close(fig)
    with pytest.raises(ValueError, match="bf16_ratios"):
        plot_bf16_ratios(pd.DataFrame({"x": [1]}), "data: X")
