"""helpers.dist.checkpoint: a resumed training ends with the weights of one never stopped, bit for
bit, and a save killed half-way leaves the previous checkpoint to resume from."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import workers

from helpers.data import load_har
from helpers.dist import checkpoint as ck
from helpers.dist.launch import WorkerError, launch
from helpers.training import TrainConfig, run_identity, train_steps, weights_digest
from helpers.training.model import make_mlp

# 7,415 recordings / 2048 = 3 steps per epoch, 6 in all; a checkpoint every 2 steps. The MLP is
# the reference one narrowed to 256 units (8 times less arithmetic): saving, killing and resuming
# do not depend on its width, and the checks are bit for bit at any width.
CONFIG = TrainConfig(global_batch=2048, epochs=2, data="recordings", record_loss=True, hidden=256)
EVERY = 2


class Killed(Exception):
    """Stands for SIGKILL, which would end this test process too."""


@pytest.fixture(scope="module")
def data():
    har = load_har("recordings")
    return torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)


@pytest.fixture(autouse=True)
def _raise_instead_of_sigkill(monkeypatch):
    def kill():
        raise Killed

    monkeypatch.setattr(ck, "_kill", kill)


def train(data, root: Path | None = None, fault: ck.Fault | None = None, config=CONFIG):
    """One training in this process (one thread, so that the sums are always added alike)."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    model = make_mlp(hidden=config.hidden)
    saver = None
    if root is not None:
        saver = ck.Checkpointer(
            ck.CheckpointSpec(str(root), EVERY, fault=fault), run_identity(config)
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loop = train_steps(model, *data, config, checkpoint=saver)
    return weights_digest(model), loop.losses, saver


@pytest.fixture(scope="module")
def uninterrupted(data):
    digest, losses, _ = train(data)
    return digest, losses


def test_resuming_after_a_kill_gives_the_same_weights_bit_for_bit(data, uninterrupted, tmp_path):
    with pytest.raises(Killed):
        train(data, tmp_path, ck.Fault(0, 5))  # killed after step 5, mid epoch 2
    assert ck.latest(tmp_path).name == "step-000004"
    digest, losses, saver = train(data, tmp_path)
    assert saver.resumed_from == 4  # epoch 1, step 1 within it: the data order is restored
    assert digest == uninterrupted[0]
    assert torch.equal(losses, uninterrupted[1])  # the losses before the kill were saved too
    assert ck.saved_steps(tmp_path) == [4, 6]  # keep=2: the oldest were removed


def test_a_kill_during_a_save_loses_nothing(data, uninterrupted, tmp_path):
    with pytest.raises(Killed):
        train(data, tmp_path, ck.Fault(0, 4, during_save=True))
    partial = tmp_path / ".step-000004.partial"
    assert any(partial.glob("*.distcp")), "the killed save had written its files"
    assert ck.latest(tmp_path).name == "step-000002"  # still the previous, complete one
    digest, _, saver = train(data, tmp_path)
    assert saver.resumed_from == 2
    assert not partial.exists(), "the next start removes what the killed save left"
    assert digest == uninterrupted[0]


def test_a_checkpoint_holds_model_optimizer_epoch_and_step(data, tmp_path):
    with pytest.raises(Killed):
        train(data, tmp_path, ck.Fault(0, 3))
    meta = dcp.FileSystemReader(ck.latest(tmp_path)).read_metadata()
    keys = set(meta.state_dict_metadata)
    assert {"model.0.weight", "model.4.bias", "losses"} <= keys
    assert {"progress.epoch", "progress.step_in_epoch", "progress.step"} <= keys
    assert any(k.startswith("optimizer.param_groups") for k in keys)


def test_another_runs_checkpoints_are_refused_in_one_line(data, tmp_path):
    with pytest.raises(Killed):
        train(data, tmp_path, ck.Fault(0, 2))
    with pytest.raises(ck.CheckpointError, match="differs in lr") as err:
        train(
            data,
            tmp_path,
            config=TrainConfig(global_batch=2048, epochs=2, lr=0.1, data="recordings", hidden=256),
        )
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["1", "a:3", "1:0x", "1:3:now", "1:2:3:save"])
def test_bad_fault_drills_are_refused(text):
    with pytest.raises(ValueError, match="RANK:STEP"):
        ck.Fault.parse(text)
    with pytest.raises(ValueError, match="counts from 1"):
        ck.Fault.parse("1:0")


def test_fault_drills_parse():
    assert ck.Fault.parse("1:30") == ck.Fault(1, 30)
    assert ck.Fault.parse("0:8:save") == ck.Fault(0, 8, during_save=True)


def test_latest_must_name_a_step_folder_inside_the_root(data, tmp_path):
    root = tmp_path / "root"
    with pytest.raises(Killed):
        train(data, root, ck.Fault(0, 3))
    outside = tmp_path / "elsewhere" / "step-000002"
    shutil.copytree(root / "step-000002", outside)  # a complete checkpoint, but not root's
    (root / ck.LATEST).write_text("../elsewhere/step-000002")
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint in"):
        ck.latest(root)


def test_what_a_killed_pointer_write_left_is_removed_at_the_next_start(data, tmp_path):
    with pytest.raises(Killed):
        train(data, tmp_path, ck.Fault(0, 3))
    leftovers = [tmp_path / ".LATEST.123.0a1b2c3d.tmp", tmp_path / ".run.json.123.0a1b2c3d.tmp"]
    for path in leftovers:  # what atomic_write leaves when SIGKILL comes before its rename
        path.write_text("step-0")
    train(data, tmp_path)
    assert [p for p in leftovers if p.exists()] == []


@pytest.mark.slow
def test_a_rank_that_cannot_see_rank_0s_checkpoint_stops_every_rank(data, tmp_path):
    """Nodes without a shared folder: rank 0's folder holds a checkpoint, rank 1's is empty.
    Rank 1 must not start at step 0 while rank 0 resumes."""
    with pytest.raises(Killed):
        train(data, tmp_path / "rank0", ck.Fault(0, 3))
    with pytest.raises(WorkerError, match=r"which rank\(s\) 1 cannot see") as err:
        launch(workers.resume_from_own_folder, 2, str(tmp_path), collective_timeout=30)
    assert "every rank must see the same checkpoint folder" in str(err.value)
    shutil.copytree(tmp_path / "rank0", tmp_path / "rank1")  # a copy: now both can
    assert launch(workers.resume_from_own_folder, 2, str(tmp_path), collective_timeout=30) == [2, 2]


def test_a_resumed_rank_gets_the_mean_of_every_ranks_losses(tmp_path):
    """Each rank records its own local loss (here rank + 1). DCP keeps one rank's copy of a tensor
    saved by every rank under one key, so the checkpoint must hold their mean, or every resumed
    rank gets rank 0's losses."""
    restored = launch(workers.save_and_restore_losses, 2, str(tmp_path), collective_timeout=30)
    assert restored == [[1.5, 1.5, 1.5], [1.5, 1.5, 1.5]]


def test_youngs_lost_share_is_smallest_at_the_square_root_interval():
    from helpers.notebook.recovery_plots import young_lost_share

    intervals = np.geomspace(1, 1e6, 20_001)
    for save_s, mtbf_s in ((20.0, 86_400.0), (300.0, 3_600.0)):
        best = intervals[np.argmin(young_lost_share(intervals, save_s, mtbf_s))]
        assert best == pytest.approx(np.sqrt(2 * save_s * mtbf_s), rel=1e-3)


def test_the_recovery_figure_says_which_saves_were_inferred_and_that_youngs_is_a_model():
    from helpers.notebook.recovery_plots import plot_recovery

    fig = plot_recovery(18, 15, 28, [5, 10, 15], [20, 25, 28], "test data")
    left, right = fig.axes
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "checkpoint saved (inferred)" in labels and "checkpoint saved (reported)" in labels
    assert "not measured" in right.get_title()
