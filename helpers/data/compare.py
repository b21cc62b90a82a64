"""The recomputed features measured against UCI HAR's published figures: window counts per
volunteer and activity, and, where UCI HAR's reference files are kept, the features themselves
(``python -m helpers.data --compare``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.data import features
from helpers.data.har import (
    ACTIVITIES,
    HARDataError,
    HARSpec,
    resolve_root,
    where,
)
from helpers.data.recordings import load_arrays
from helpers.data.uci import load_uci

# UCI HAR's label, volunteer and feature-name files, committed with the repository (about 90 KB;
# har/reference/README.md); never the downloaded data set, whose root HAR_ROOT may move
REFERENCE = Path(__file__).resolve().parents[2] / "har" / "reference"


def _per_volunteer(arrays: dict[str, np.ndarray]) -> list[str]:
    """Windows per volunteer and activity, recomputed minus UCI HAR's, from the reference files."""
    if not (REFERENCE / "y_train.txt").is_file():  # a copy of helpers/ without the repository
        return [
            f"\nUCI HAR's reference files are not in {REFERENCE}: they come with the "
            "repository (har/reference/), which holds the per-volunteer comparison."
        ]
    out = [
        "\nWindows per volunteer and activity, recomputed minus UCI HAR (from UCI HAR's "
        "label and volunteer files):\n",
        "| activity | volunteers with equal counts | differences |",
        "| --- | ---: | --- |",
    ]
    diffs = []
    for split in ("train", "test"):
        ys = np.loadtxt(REFERENCE / f"y_{split}.txt", dtype=np.int64) - 1
        ss = np.loadtxt(REFERENCE / f"subject_{split}.txt", dtype=np.int64)
        for sid in np.unique(ss):
            mine = np.bincount(arrays[f"y_{split}"][arrays[f"subject_{split}"] == sid], minlength=6)
            diffs.append(mine - np.bincount(ys[ss == sid], minlength=6))
    d = np.array(diffs)
    for k, act in enumerate(ACTIVITIES):
        col = d[:, k]
        spread = (
            "none" if not col.any() else f"{col.min():+d} to {col.max():+d}, total {col.sum():+d}"
        )
        out.append(f"| {act} | {np.sum(col == 0)} of {len(col)} | {spread} |")
    return out


def _against_uci_features(root: Path, spec: HARSpec, med: np.ndarray, names: list[str]) -> str:
    """Every feature's median against UCI HAR's, where UCI HAR is in root (never downloads)."""
    try:
        uci = load_uci(root, spec, download=False)
    except HARDataError:
        return (
            f"\nUCI HAR's feature files are not in {where(root)}; with them there "
            "(python -m helpers.data --data uci) this also compares every feature's median."
        )
    theirs = np.median(np.concatenate([uci.X_train, uci.X_test]), axis=0)
    diff = np.abs(med - theirs)
    worst = np.argsort(diff)[::-1][:10]
    lines = [
        f"\nPer-feature medians against UCI HAR's: {np.mean(diff < 0.05):.0%} of the 561 within "
        f"0.05, {np.mean(diff < 0.2):.0%} within 0.2; median difference {np.median(diff):.3f}. "
        "The ten furthest:\n",
        "| feature | recomputed median | UCI HAR median |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {names[j]} | {med[j]:.3f} | {theirs[j]:.3f} |" for j in worst]
    return "\n".join(lines)

def compare(root: str | Path | None = None, spec: HARSpec = HARSpec()) -> str:
    """The comparison with UCI HAR's published figures, as Markdown tables (har/README.md)."""
    arrays = load_arrays(resolve_root(root))
    names = features.feature_names()
    out = []
    out.append("Windows per class and split (recomputed / UCI HAR published):\n")
    out.append("| activity | train | UCI train | test | UCI test |")
    out.append("| --- | ---: | ---: | ---: | ---: |")
    mine = {s: np.bincount(arrays[f"y_{s}"], minlength=6) for s in ("train", "test")}
    for k, act in enumerate(ACTIVITIES):
        out.append(
            f"| {act} | {mine['train'][k]} | {spec.train_counts[k]} | {mine['test'][k]} | "
            f"{spec.test_counts[k]} |"
        )
    out.append(
        f"| total | {mine['train'].sum()} | {spec.n_rows('train')} | {mine['test'].sum()} | "
        f"{spec.n_rows('test')} |"
    )
    out += _per_volunteer(arrays)
    for split in ("train", "test"):
        # UCI HAR's first row of each split is the first window of the first volunteer's first
        # activity (train: volunteer 1, STANDING; test: volunteer 2, STANDING)
        row = 0
        first = spec.first_row(split)
        out.append(
            f"\nFirst {split} row: volunteer {arrays[f'subject_{split}'][row]}, "
            f"{ACTIVITIES[arrays[f'y_{split}'][row]]}, window starting at sample "
            f"{arrays[f'start_{split}'][row]} of its experiment:\n"
        )
        out.append("| feature | recomputed | UCI HAR | difference |")
        out.append("| --- | ---: | ---: | ---: |")
        for j, theirs in enumerate(first):
            v = float(arrays[f"X_{split}"][row, j])
            out.append(f"| {names[j]} | {v:.4f} | {theirs:.4f} | {v - theirs:+.4f} |")
    out.append(
        "\nUnscaled ranges of some features (the values min-max scaling maps to -1 and 1):\n"
    )
    out.append("| feature | min | max |")
    out.append("| --- | ---: | ---: |")
    for name in (
        "tBodyAcc-mean()-X", "tBodyAcc-std()-X", "tGravityAcc-mean()-X", "tGravityAcc-mean()-Y",
        "tBodyAccJerk-std()-X", "tBodyGyro-mean()-X", "tBodyGyro-std()-X", "tBodyAccMag-mean()",
        "tBodyAcc-entropy()-X", "tBodyAcc-arCoeff()-X,1", "fBodyAcc-maxInds-X",
        "fBodyAcc-meanFreq()-X", "angle(X,gravityMean)",
    ):  # fmt: skip
        j = names.index(name)
        out.append(f"| {name} | {arrays['lo'][j]:.4g} | {arrays['hi'][j]:.4g} |")
    X = np.concatenate([arrays["X_train"], arrays["X_test"]])
    med = np.median(X, axis=0)
    out.append(
        f"\nScaled features: median of the per-feature medians {np.median(med):.3f}; "
        f"{np.mean(med < -0.9):.0%} of the features have a median below -0.9; "
        f"{np.mean(np.ptp(arrays['X_test'], axis=0) > 1.0):.0%} span more than 1 on the test split."
    )
    out.append(_against_uci_features(resolve_root(root), spec, med, names))
    return "\n".join(out)
