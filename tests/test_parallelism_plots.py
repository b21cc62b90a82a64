"""Notebook 09's bytes-sent figure draws the table it is given: read back from the axes."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers.notebook.parallelism_plots import plot_bytes_sent  # noqa: E402


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
    with pytest.raises(ValueError, match="MB >= 0"):
        plot_bytes_sent(-_table(), "t", "s")
    with pytest.raises(ValueError, match="one row per set-up"):
        plot_bytes_sent(_table().iloc[:0], "t", "s")
