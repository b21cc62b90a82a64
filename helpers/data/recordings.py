"""UCI HAR's features recomputed from the volunteers' own recordings (UCI HAPT: the raw 50 Hz
accelerometer and gyroscope signals of the same 30 volunteers and phone), installable offline,
built once and cached.

The pickle comes from a PyPI package (``helpers.data.hapt_pickle``), the windows and features are
computed as UCI HAR's ``features_info.txt`` describes (``helpers.data.windows``), and the result is
cached under ``har/cache/`` keyed on a hash of the pickle and of that code, so later loads only
read one .npz.

    python -m helpers.data --compare   # build or load them, measured against UCI HAR's figures
"""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path

import numpy as np

from helpers.data import features, hapt_pickle, windows
from helpers.data.files import atomic_write, hash_key, locked, remove_stale
from helpers.data.hapt_pickle import find_pickle
from helpers.data.har import (
    ARRAYS,
    HARData,
    HARSpec,
    resolve_root,
    where,
)
from helpers.data.windows import build

RECORDINGS_NAME = "UCI HAPT recordings, UCI HAR features recomputed by this course"
RECORDINGS_BANNER = "data: " + RECORDINGS_NAME + " ({where})"
CACHE_FORMAT = 1


# ----------------------------------------------------------------------------- finding the file


# ----------------------------------------------------------------------------- reading it safely


# ----------------------------------------------------------------------------- the experiments


# ----------------------------------------------------------------------------- building


def cache_key(path: Path) -> str:
    """A hash of the pickle's bytes and of the code that turns it into features."""
    code = (features.__file__, windows.__file__, hapt_pickle.__file__)
    sources = (Path(module).read_bytes() for module in code)
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


