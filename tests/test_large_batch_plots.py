"""Notebook 06's runs-to-target figure draws what the runs recorded: each batch's loss along its
best-rate run, the counted step on it, the target, and the steps per rate; its rules-of-thumb
figure, the best rates beside what two rules ask for."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from helpers.experiments.large_batch import best_per_batch  # noqa: E402
from helpers.notebook.large_batch_plots import (  # noqa: E402
    plot_rules_of_thumb,
    plot_runs_to_target,
)


def run(batch: int, lr: float, seed: int, reached: bool, steps: int) -> dict:
    marks = list(range(1, int(1.25 * steps) + 1))
    losses = [1.8 - 1.5 * m / steps for m in marks]  # crosses 0.4 just before `steps`
    return {"global_batch": batch, "lr": lr, "seed": seed, "reached": reached, "target": 0.4,
            "steps": steps if reached else marks[-1], "steps_run": marks[-1],
            "checkpoints": marks, "losses": losses}  # fmt: skip


def test_the_figure_draws_each_batchs_best_run_its_count_and_the_steps_per_rate():
    runs = pd.DataFrame([
        run(8, 0.1, 0, True, 40), run(8, 0.1, 1, True, 44), run(8, 0.2, 0, False, 60),
        run(32, 0.1, 0, True, 20), run(32, 0.1, 1, True, 24),
    ])  # fmt: skip
    fig = plot_runs_to_target(runs, best_per_batch(runs), "data: test")
    left, right = fig.axes
    assert "data: test" in fig.get_suptitle()
    curves = [line for line in left.get_lines() if line.get_linestyle() == "-"]
    assert len(curves) == 2  # one loss line per batch (its best rate, seed 0)
    np.testing.assert_allclose(curves[0].get_xdata(), np.arange(1, 51) * 8)  # samples seen
    dots = [line for line in left.get_lines() if line.get_marker() == "o"]
    marks = [line for line in dots if len(line.get_xdata())]  # the legend's entry is empty
    assert [m.get_xdata()[0] for m in marks] == [40 * 8, 20 * 32]  # the counted steps, in samples
    assert any(line.get_ydata()[0] == 0.4 for line in left.get_lines())  # the target
    medians = [line for line in right.get_lines() if line.get_linestyle() == "-"]
    assert medians[0].get_ydata().tolist() == [42]  # batch 8 at 0.1: median of 40 and 44
    crosses = [line for line in right.get_lines() if line.get_marker() == "x"]
    assert crosses[0].get_xdata().tolist() == [0.2] and crosses[0].get_ydata().tolist() == [75]


def test_the_rules_figure_anchors_both_rules_at_the_smallest_batchs_best_rate():
    best = pd.DataFrame({"global_batch": [32, 8, 128], "best_lr": [0.1, 0.05, 0.1]})
    rates = {8: [0.05, 0.1], 32: [0.05, 0.1, 0.2], 128: [0.1, 0.2]}
    fig = plot_rules_of_thumb(best, rates, 8.0, "data: test")
    (ax,) = fig.axes
    assert "data: test" in ax.get_title()
    lines = {line.get_label(): line for line in ax.get_lines()}
    measured = lines["the best rate measured (section 1)"]
    assert measured.get_xdata().tolist() == [8, 32, 128]  # sorted by batch
    assert measured.get_ydata().tolist() == [0.05, 0.1, 0.1]
    linear = lines["linear scaling: lr in proportion to B"]
    np.testing.assert_allclose(linear.get_ydata()[[0, -1]], [0.05, 0.05 * 16])
    (greedy,) = [line for label, line in lines.items() if label.startswith("McCandlish")]
    # lr(B) / lr(8) = (B / (B + 8)) / (8 / 16): at 128, 0.05 * (128 / 136) * 2
    np.testing.assert_allclose(greedy.get_ydata()[[0, -1]], [0.05, 0.05 * 2 * 128 / 136])
    tried = [line for line in ax.get_lines() if line.get_marker() == "_"]
    assert sum(len(line.get_xdata()) for line in tried) == 7  # every rate tried, at its batch
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 4  # the rates tried once, the two rules, the measured best
