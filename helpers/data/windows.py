"""From the raw recordings to UCI HAR's windows: 2.56 s (128 samples at 50 Hz, 50% overlap) wholly
inside one of the six activities, each turned into UCI HAR's 561 features
(``helpers.data.features``), min-max scaled to [-1, 1] and split by UCI HAR's volunteers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.data import features
from helpers.data.hapt_pickle import read_pickle
from helpers.data.har import (
    ACTIVITIES,
    TEST_SUBJECTS,
    HARDataError,
)

COLUMNS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z", "sequence", "label")

TEST_VOLUNTEERS = frozenset(sid for sid, _ in TEST_SUBJECTS)  # UCI HAR's split

@dataclass(frozen=True)
class Experiment:
    """One recording session of one volunteer, as plain arrays."""

    user: int  # volunteer 1-30
    acc: np.ndarray  # float64 (3, n), g
    gyro: np.ndarray  # float64 (3, n), rad/s
    label: np.ndarray  # int64 (n,): -1 unlabelled, 1-6 UCI HAR's activities, 7-12 transitions

def _frame_arrays(frame: Any) -> tuple[np.ndarray, np.ndarray]:
    """A stub DataFrame's float block (6 signals) and int block (sequence, label), checked."""
    try:
        manager = frame.state["_data"]
        extra = manager.state[3]["0.14.1"]
        columns = list(extra["axes"][0].state["data"])
        blocks = {b["values"].dtype.kind: b for b in extra["blocks"]}
        signals, ints = blocks["f"], blocks["i"]
    except (AttributeError, KeyError, IndexError, TypeError) as err:
        raise HARDataError(f"HAPT.pkl.gz does not hold the expected DataFrames ({err!r})") from None
    if tuple(columns) != COLUMNS or signals["mgr_locs"] != slice(0, 6, 1):
        raise HARDataError(f"HAPT.pkl.gz has unexpected columns {columns}")
    if ints["mgr_locs"] != slice(6, 8, 1):
        raise HARDataError("HAPT.pkl.gz has sequence/label where they were not expected")
    return np.asarray(signals["values"], np.float64), np.asarray(ints["values"], np.int64)

def read_experiments(path: Path) -> list[Experiment]:
    """All 61 experiments of the 30 volunteers, in volunteer order, as plain arrays."""
    users = read_pickle(path)
    if not isinstance(users, dict) or not all(
        isinstance(user, int) and isinstance(frames, list) for user, frames in users.items()
    ):
        raise HARDataError("HAPT.pkl.gz is not a dict of volunteers to lists of DataFrames")
    out = []
    for user in sorted(users):
        for frame in users[user]:
            values, (sequence, label) = _frame_arrays(frame)
            # windows assume an unbroken 50 Hz recording: samples numbered 0, 1, 2, ...
            if (
                not np.array_equal(sequence, np.arange(len(sequence)))
                or not np.isfinite(values).all()
            ):
                raise HARDataError(f"HAPT.pkl.gz: volunteer {user} has a gap or a missing value")
            out.append(Experiment(int(user), values[:3], values[3:], label))
    return out

def activity_windows(label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and activities (1-6) of the windows wholly inside one run of an activity.

    A run of L samples of one activity gives floor((L - 128) / 64) + 1 windows, the first at
    the run's start; runs shorter than 128 samples, unlabelled samples and transitions give none.
    """
    edges = np.flatnonzero(np.diff(label)) + 1
    run_starts = np.r_[0, edges]
    run_ends = np.r_[edges, len(label)]
    starts, acts = [], []
    for s, e in zip(run_starts, run_ends, strict=True):
        activity = int(label[s])
        if 1 <= activity <= len(ACTIVITIES) and e - s >= features.WINDOW:
            n = (e - s - features.WINDOW) // features.STEP + 1
            starts.append(s + features.STEP * np.arange(n))
            acts.append(np.full(n, activity))
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(starts).astype(np.int64), np.concatenate(acts).astype(np.int64)

def build(path: Path) -> dict[str, np.ndarray]:
    """HARData's arrays, plus where every window came from, computed from the pickle at path.

    Min-max scaling uses the statistics of all windows, train and test together, as UCI HAR is
    understood to have done: the recomputed features then sit on the same scale as the published
    ones, so that the first rows can be compared. Only each feature's range is shared between the
    splits, no label; lo and hi are returned so that anyone can rescale (say, on train only).
    """
    rows, ys, users, exps, starts = [], [], [], [], []
    for i, exp in enumerate(read_experiments(path)):
        start, activity = activity_windows(exp.label)
        if len(start) == 0:
            continue
        rows.append(features.experiment_features(exp.acc, exp.gyro, start))
        ys.append(activity - 1)
        users.append(np.full(len(start), exp.user))
        exps.append(np.full(len(start), i))
        starts.append(start)
    raw = np.concatenate(rows)
    y, subject = np.concatenate(ys), np.concatenate(users)
    experiment, start = np.concatenate(exps), np.concatenate(starts)
    lo, hi = raw.min(axis=0), raw.max(axis=0)
    X = features.minmax_scale(raw, lo, hi).astype(np.float32)
    test = np.isin(subject, list(TEST_VOLUNTEERS))
    arrays = {}
    for split, mask in (("train", ~test), ("test", test)):
        arrays[f"X_{split}"] = X[mask]
        arrays[f"y_{split}"] = y[mask].astype(np.int64)
        arrays[f"subject_{split}"] = subject[mask].astype(np.int64)
        arrays[f"experiment_{split}"] = experiment[mask].astype(np.int64)
        arrays[f"start_{split}"] = start[mask].astype(np.int64)
    arrays["lo"], arrays["hi"] = lo, hi
    return arrays
