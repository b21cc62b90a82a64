"""Notebook 09's stacked-bar figures (bytes sent, held, saved) draw the tables they are given:
read back from the axes."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers.notebook.parallelism_plots import (  # noqa: E402
    plot_bytes_sent,
    plot_link_sweeps,
    plot_stacked_bars,
)


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {"all-reduce": [6.525, 0.0, 1.049], "all-gather": [0.0, 6.525, 0.0],
         "reduce-scatter": [0.0, 3.262, 0.0], "send": [0.0, 0.0, 0.0]},
        index=["DDP", "FSDP2", "TP"],
    )  # fmt: skip


def test_bars_are_the_tables_mb_stacked_by_collective():
    table = _table()
    fig = plot_bytes_sent(table, "bytes per step", "test data")
    (ax,) = fig.axes
    bars = [p for p in ax.patches if p.get_width() > 0]
    # one segment per non-zero cell, in the rows' order within each collective
    expected = [(row, value) for kind in table.columns for row, value in
                enumerate(table[kind]) if value > 0]  # fmt: skip
    assert len(bars) == len(expected)
    rows = {label.get_text(): i for i, label in enumerate(ax.get_yticklabels())}
    assert list(rows) == list(table.index)
    left = {row: 0.0 for row in range(len(table))}
    for bar, (row, value) in zip(bars, expected, strict=True):
        assert bar.get_width() == pytest.approx(value)
        assert bar.get_x() == pytest.approx(left[row])  # stacked on what the row already has
        centre = bar.get_y() + bar.get_height() / 2
        assert centre == pytest.approx(row)
        left[row] += value
    # each row's total written at its bar's end, and only the collectives sent in the legend
    totals = [float(t.get_text()) for t in ax.texts]
    np.testing.assert_allclose(totals, table.sum(axis=1), atol=0.0005 + 1e-9)  # 3 decimals
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "all-reduce", "all-gather", "reduce-scatter"]
    assert "test data" in ax.get_title()


def test_negative_or_empty_tables_are_refused():
    with pytest.raises(ValueError, match="values >= 0"):
        plot_bytes_sent(-_table(), "t", "s")
    with pytest.raises(ValueError, match="one row per set-up"):
        plot_bytes_sent(_table().iloc[:0], "t", "s")


def test_held_bytes_stack_by_kind_with_their_unit_and_source():
    # notebook 09's bytes per parameter: 16 in float32 and mixed, 8 for the mistake row
    table = pd.DataFrame(
        {"parameters": [4.0, 2.0, 2.0], "gradients": [4.0, 2.0, 2.0],
         "master weights": [0.0, 4.0, 0.0], "optimizer": [8.0, 8.0, 4.0]},
        index=["float32", "mixed bf16", "mixed, Adam on bf16"],
    )  # fmt: skip
    fig = plot_stacked_bars(table, "bytes per parameter", "bytes per parameter, Adam",
                            "read from the tensors", decimals=0)  # fmt: skip
    (ax,) = fig.axes
    assert ax.get_xlabel() == "bytes per parameter, Adam"
    assert [t.get_text() for t in ax.texts] == ["16", "16", "8"]
    # the master weights: one segment only (a zero cell draws none), starting after 2 + 2 bytes
    master = [p for p in ax.patches if p.get_width() > 0][6]
    assert master.get_width() == pytest.approx(4.0) and master.get_x() == pytest.approx(4.0)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(table.columns)
    assert "read from the tensors" in ax.get_title()


def test_link_marks_are_drawn_only_on_their_own_panel():
    index = pd.Index(np.geomspace(1e8, 1e12, 5))
    sweep = pd.DataFrame({"data (DDP)": np.linspace(10, 1, 5)}, index=index)
    sweeps = {"small": sweep, "big": sweep}
    fig = plot_link_sweeps(sweeps, "test data", {"small": {"loopback": 1.3e9}})
    texts = [[t.get_text().strip() for t in ax.texts] for ax in fig.axes]
    assert texts == [["loopback"], []]  # a link that exists for one workload only
    # the legends below the panels and the source in a caption, where no curve or label hides them
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
        assert legend.y1 <= ax.get_window_extent().y0
    assert fig.get_supxlabel() == "test data"
    with pytest.raises(ValueError, match="key them by title"):
        plot_link_sweeps(sweeps, "test data", {"loopback": {"x": 1e9}})
