"""Notebooks 03 and 04's figures of rounding: the loss curves with their difference, and each
run's weight gaps tensor by tensor (``tensor_gaps``) against the grader's tolerance."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.experiments.ddp_script import ScriptRun, tensor_gaps  # noqa: E402
from helpers.notebook.rounding_plots import plot_loss_curves, plot_weight_gaps  # noqa: E402
from helpers.training import final_weights  # noqa: E402
from helpers.training.model import make_mlp  # noqa: E402


def saved_run(folder: Path, model: torch.nn.Module) -> ScriptRun:
    folder.mkdir()
    torch.save({"model": model.state_dict()}, folder / "checkpoint.pt")
    return ScriptRun(["python", "x.py"], 1, folder, 0, [""], [""], "")


def test_tensor_gaps_find_the_tensor_that_changed(tmp_path: Path):
    torch.manual_seed(0)
    model = make_mlp()
    one = final_weights(model)
    same = saved_run(tmp_path / "same", model)
    names = [name for name, _ in model.named_parameters()]
    with torch.no_grad():
        dict(model.named_parameters())[names[2]][0, 0] += 0.25
    changed = saved_run(tmp_path / "changed", model)
    gaps = tensor_gaps({"same": same, "changed": changed}, one)
    assert list(gaps.columns) == names and list(gaps.index) == ["same", "changed"]
    assert (gaps.loc["same"] == 0).all()
    assert gaps.loc["changed", names[2]] == pytest.approx(0.25, rel=1e-6)
    assert (gaps.loc["changed"].drop(names[2]) == 0).all()  # the other tensors untouched

    fig = plot_weight_gaps(gaps, 2e-3, "data: test banner")
    ax = fig.axes[0]
    assert "data: test banner" in ax.get_title() and ax.get_yscale() == "log"
    plotted = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    assert plotted.max() == pytest.approx(0.25, rel=1e-6) and plotted.min() > 0
    # the zeros sit on the tick labelled 0, inside the axis: every tensor of "same" and 5 of
    # "changed"
    assert ax.get_yticklabels()[0].get_text() == "0 (same bits)"
    zero = ax.get_yticks()[0]
    assert np.count_nonzero(plotted == zero) == 2 * len(names) - 1 and ax.get_ylim()[0] < zero
    plt.close(fig)


def test_loss_curves_show_the_difference_and_mark_equal_steps_as_zero():
    one = [2.0, 1.5, 1.0, 0.5]
    two = [2.0, 1.5 + 1e-6, 1.0 - 1e-5, 0.5]
    fig = plot_loss_curves({1: one, 2: two}, "data: test banner")
    top, bottom = fig.axes
    assert "data: test banner" in top.get_title() and bottom.get_yscale() == "log"
    gap, same = bottom.get_lines()[:2]
    assert list(gap.get_xdata()) == [1, 2]
    assert gap.get_ydata() == pytest.approx([1e-6, 1e-5], rel=1e-6)
    # steps 0 and 3 have the same bits: drawn, at the tick labelled 0, and counted
    assert list(same.get_xdata()) == [0, 3] and "(2 steps)" in same.get_label()
    assert bottom.get_yticklabels()[0].get_text() == "0 (same bits)"
    assert list(same.get_ydata()) == [bottom.get_yticks()[0]] * 2
    assert bottom.get_ylim()[0] < bottom.get_yticks()[0] < min(gap.get_ydata())  # on the axis
    plt.close(fig)
