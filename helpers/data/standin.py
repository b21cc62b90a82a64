"""The HAR-shaped stand-in: synthetic data for when no real data can be had. Not UCI HAR."""

from __future__ import annotations

import contextlib
import inspect
import zipfile
from pathlib import Path

import numpy as np

from helpers.data.files import atomic_write, hash_key, locked, remove_stale
from helpers.data.har import ARRAYS, TEST_SUBJECTS, TRAIN_SUBJECTS, HARData, HARSpec

STANDIN_BANNER = "data: HAR-shaped stand-in (synthetic; not UCI HAR results)"
_STALE = ("cache/.standin-*.tmp",)  # what a killed run's atomic_write leaves behind


def standin_key(seed: int = 0) -> str:
    """The stand-in cache's key: a hash of the generator's code and of every input it reads,
    so that changing any of them can never feed an old cache to the tests or nbval."""
    code = [inspect.getsource(f) for f in (make_standin, _standin_labels)]
    spec = HARSpec()
    return hash_key(
        *code, seed, TRAIN_SUBJECTS, TEST_SUBJECTS, spec.train_counts, spec.test_counts,
        np.__version__,
    )  # fmt: skip


def load_standin(root: Path) -> HARData:
    """The stand-in, from its cache if there (generated and cached otherwise)."""
    path = root / "cache" / f"standin-{standin_key()[:16]}.npz"
    data = _read_standin(path)
    if data is not None:
        return data
    with locked(root / ".standin.lock"):  # a second process waits, then reads the cache
        remove_stale(root, _STALE)
        data = _read_standin(path)
        if data is not None:
            return data
        data = make_standin()
        arrays = {name: getattr(data, name) for name in ARRAYS}
        with contextlib.suppress(OSError):  # a read-only root only costs regenerating each time
            atomic_write(path, lambda f: np.savez(f, **arrays))
    return data


def _read_standin(path: Path) -> HARData | None:
    try:
        with np.load(path) as saved:
            arrays = {name: saved[name] for name in ARRAYS}
        if arrays["X_train"].shape == (7352, 561) and arrays["X_test"].shape == (2947, 561):
            return HARData(**arrays, source="standin", banner=STANDIN_BANNER)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass
    return None


def _standin_labels(
    rng: np.random.Generator, subjects: tuple[tuple[int, int], ...], counts: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Labels with exactly `counts` per class, in contiguous subject blocks of the given sizes.

    Within a block, activities come in runs, twice through the protocol (standing, sitting,
    laying, walking, downstairs, upstairs), as the volunteers recorded them.
    """
    sizes = [n for _, n in subjects]
    pool = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    protocol = (4, 3, 5, 0, 2, 1)
    y = []
    for block in np.split(pool, np.cumsum(sizes)[:-1]):
        per_class = np.bincount(block, minlength=len(counts))
        first = rng.binomial(per_class, 0.5)
        y += [np.full(first[k], k) for k in protocol]
        y += [np.full(per_class[k] - first[k], k) for k in protocol]
    subject = np.repeat([sid for sid, _ in subjects], sizes)
    return np.concatenate(y).astype(np.int64), subject.astype(np.int64)


def make_standin(seed: int = 0) -> HARData:
    """A deterministic, synthetic, HAR-shaped data set for when UCI HAR is absent.

    Same shapes, class counts per split and subject blocks as UCI HAR; float32 in [-1, 1],
    with many features near -1. It is not HAR: each window is a point in a 12-d latent
    space (a class prototype, moved and scaled per volunteer, plus noise), mapped to the 561
    features by one fixed random linear map and a tanh. The three dynamic activities form one
    cluster and the three static ones another, far apart; sitting and standing are mirror
    images close together; test volunteers have their own offsets, so they are unseen people.

    Figures from it are NOT UCI HAR results. It is tuned so that the reference run is only
    part-way there: with the reference loop (make_mlp after torch.manual_seed(0), plain SGD
    without momentum, global batch 256, epoch e shuffled with seed e, last partial batch
    dropped; torch 2.13, CPU, 2 threads) the test accuracy is 80.1% after 5 epochs at lr 0.05 (the
    reference; 80.29% with 1 thread per worker), 92.9% after 40 epochs at lr 0.05, and 87.6%
    after 5 epochs at lr 0.2.
    Mostly walking is taken for the stairs and sitting for standing. The 5-epoch figure
    depends on the seed (61-72% with torch seeds 1 and 2), as the close classes are still
    being pulled apart then.
    """
    rng = np.random.default_rng(seed)
    latent, features = 12, 561
    axis = rng.normal(size=latent)
    axis /= np.linalg.norm(axis)
    shape = rng.normal(size=(6, latent))
    protos = np.empty((6, latent))
    protos[:3] = 2.0 * axis + 0.13 * shape[:3]  # walking, upstairs, downstairs
    protos[3] = -2.0 * axis + 0.065 * shape[3]  # sitting ...
    protos[4] = -2.0 * axis - 0.065 * shape[3]  # ... and standing: close together
    protos[5] = -2.0 * axis + 0.45 * shape[5]  # laying
    weights = rng.normal(size=(latent, features)) / np.sqrt(latent)
    bias = rng.uniform(-2.5, 0.5, size=features)  # most features sit low, many near -1
    arrays = {}
    for split, subjects in (("train", TRAIN_SUBJECTS), ("test", TEST_SUBJECTS)):
        y, subject = _standin_labels(rng, subjects, HARSpec().counts(split))
        block = np.repeat(np.arange(len(subjects)), [n for _, n in subjects])
        offset = 0.11 * rng.normal(size=(len(subjects), latent))
        scale = np.exp(0.15 * rng.normal(size=(len(subjects), latent)))
        z = (protos[y] + offset[block]) * scale[block] + 0.13 * rng.normal(size=(len(y), latent))
        X = np.tanh(z @ weights + bias) + 0.03 * rng.normal(size=(len(y), features))
        arrays[f"X_{split}"] = np.clip(X, -1, 1).astype(np.float32)
        arrays[f"y_{split}"] = y
        arrays[f"subject_{split}"] = subject
    return HARData(**arrays, source="standin", banner=STANDIN_BANNER)
