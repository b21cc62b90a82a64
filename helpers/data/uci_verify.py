"""UCI HAR's files verified before anything uses them (shapes, row widths, class counts, subject and
label ranges, value range, the first rows), and the binary cache of the verified arrays, keyed on
a hash of the bytes parsed."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from helpers.data.files import atomic_write, hash_key, locked
from helpers.data.har import (
    ARRAYS,
    OFFLINE_HINT,
    SPLITS,
    HARDataError,
    HARSpec,
    notice,
    where,
)

UCI_URL = (
    "https://archive.ics.uci.edu/static/public/240/human+activity+recognition+using+smartphones.zip"
)

# The files we keep, in the archive's own layout, so np.loadtxt("har/train/X_train.txt") works.
FILES = (
    "train/X_train.txt",
    "train/y_train.txt",
    "train/subject_train.txt",
    "test/X_test.txt",
    "test/y_test.txt",
    "test/subject_test.txt",
    "features.txt",
    "activity_labels.txt",
)

CACHE_FORMAT = 2  # 2: the key holds the SHA-256 of the bytes parsed

class Unverified(ValueError):
    """Files that are not a genuine UCI HAR copy; the message says what is wrong."""

# What a killed run leaves behind: the download, the staging folder, half-written cache files.
STALE = (".download-*.tmp", ".staging-*", "cache/.uci*.tmp")

def uci_lock(root: Path) -> contextlib.AbstractContextManager[bool]:
    """The lock every writer of UCI HAR files in root holds (see files.locked)."""
    return locked(root / ".uci.lock")

def _read(root: Path, rel: str, parsed: dict[str, list]) -> bytes:
    """A text file's bytes; records its size and mtime (taken before reading, so that any later
    change invalidates the cache) and the SHA-256 of exactly the bytes read, for the cache key."""
    st = (root / rel).stat()
    text = (root / rel).read_bytes()
    parsed[rel] = [st.st_size, st.st_mtime_ns, hash_key(text)]
    return text

def _parse(text: bytes, rel: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Parse a whitespace-separated table (a plain split: far faster than np.loadtxt), check
    its number of rows and the width of every row."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    cols = shape[1] if len(shape) == 2 else 1
    if len(rows) != shape[0]:
        raise Unverified(f"{rel} has {len(rows)} rows, expected {shape[0]} rows of {cols}")
    bad = next((i for i, row in enumerate(rows) if len(row) != cols), None)
    if bad is not None:
        raise Unverified(
            f"{rel} row {bad + 1} has {len(rows[bad])} values, expected {shape[0]} rows of {cols}"
        )
    try:
        values = np.array(rows, dtype=dtype)
    except ValueError as err:
        raise Unverified(f"{rel} is not a table of numbers: {err}") from None
    return values.reshape(shape)

def verify_dir(root: Path, spec: HARSpec) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """Parse the text files under root and check them against spec; return HARData's arrays
    and, for the cache key, what was parsed (see _read)."""
    arrays: dict[str, np.ndarray] = {}
    parsed: dict[str, list] = {}
    n_classes = len(spec.activities)
    for split in SPLITS:
        n = spec.n_rows(split)
        rel = f"{split}/X_{split}.txt"
        X = _parse(_read(root, rel, parsed), rel, np.float64, (n, spec.n_features))
        if not np.all((X >= -1) & (X <= 1)):
            raise Unverified(
                f"{split}/X_{split}.txt has values outside [-1, 1] (min {np.nanmin(X):g}, "
                f"max {np.nanmax(X):g}, NaN {int(np.isnan(X).sum())})"
            )
        expected = np.array(spec.first_row(split))
        if not np.allclose(X[0, : len(expected)], expected, rtol=0, atol=spec.atol):
            got = " ".join(f"{v:.8g}" for v in X[0, : len(expected)])
            raise Unverified(f"{split}/X_{split}.txt's first row starts {got}, not as UCI HAR's")
        rel = f"{split}/y_{split}.txt"
        y = _parse(_read(root, rel, parsed), rel, np.int64, (n,))
        if y.min() < 1 or y.max() > n_classes:
            raise Unverified(f"{split}/y_{split}.txt has labels outside 1..{n_classes}")
        counts = tuple(int(c) for c in np.bincount(y, minlength=n_classes + 1)[1:])
        if counts != spec.counts(split):
            raise Unverified(
                f"{split}/y_{split}.txt has class counts {counts}, expected {spec.counts(split)}"
            )
        rel = f"{split}/subject_{split}.txt"
        subject = _parse(_read(root, rel, parsed), rel, np.int64, (n,))
        if subject.min() < 1 or subject.max() > spec.n_subjects:
            raise Unverified(f"{rel} has subject ids outside 1..{spec.n_subjects}")
        arrays[f"X_{split}"] = X.astype(np.float32)
        arrays[f"y_{split}"] = y - 1
        arrays[f"subject_{split}"] = subject
    names = _read(root, "features.txt", parsed).decode(errors="replace")
    n_names = sum(1 for line in names.splitlines() if line.strip())
    if n_names != spec.n_features:
        raise Unverified(f"features.txt names {n_names} features, expected {spec.n_features}")
    labels = _read(root, "activity_labels.txt", parsed).decode(errors="replace").split()
    expected_labels = [w for i, name in enumerate(spec.activities, 1) for w in (str(i), name)]
    if labels != expected_labels:
        raise Unverified("activity_labels.txt does not list UCI HAR's six activities")
    return {name: arrays[name] for name in ARRAYS}, parsed

def _cache_key(spec: HARSpec, parsed: dict[str, list]) -> dict:
    """What the cache was built from: each text file's size and mtime before it was read and
    the SHA-256 of the bytes parsed, and the rules they met."""
    return {"format": CACHE_FORMAT, "spec": repr(spec), "files": parsed}

def read_cache(root: Path, spec: HARSpec) -> dict[str, np.ndarray] | None:
    """The cached arrays if they were built from the text files as they are now, else None."""
    cache = root / "cache"
    try:
        key = json.loads((cache / "uci.json").read_text())
        if key.get("format") != CACHE_FORMAT or key.get("spec") != repr(spec):
            return None
        for rel in FILES:
            st = (root / rel).stat()
            if key["files"][rel][:2] != [st.st_size, st.st_mtime_ns]:
                return None
        arrays = {name: np.load(cache / f"uci-{name}.npy") for name in ARRAYS}
    except (OSError, ValueError, EOFError, KeyError, TypeError, AttributeError):
        return None
    for split in SPLITS:
        n = spec.n_rows(split)
        if arrays[f"X_{split}"].shape != (n, spec.n_features) or arrays[f"y_{split}"].shape != (n,):
            return None
    return arrays

def write_cache(
    root: Path, spec: HARSpec, arrays: dict[str, np.ndarray], parsed: dict[str, list]
) -> None:
    """Cache the parsed arrays beside the text; the JSON key goes last, so it vouches for them."""
    cache = root / "cache"
    key = _cache_key(spec, parsed)
    try:
        for name in ARRAYS:
            atomic_write(cache / f"uci-{name}.npy", lambda f, a=arrays[name]: np.save(f, a))
        atomic_write(cache / "uci.json", lambda f: f.write(json.dumps(key, indent=1).encode()))
    except OSError as err:  # a read-only har/ still works, only slower
        notice(f"notice: could not cache UCI HAR in {cache} ({err}); every load will parse text")

def unwritable(root: Path, err: OSError) -> HARDataError:
    """The one-line error for a data folder this process may not write (shared read-only, say):
    under "auto", one more reason to fall back to the data that needs no download."""
    return HARDataError(
        f"cannot write into {where(root)} to download UCI HAR ({err.strerror or err}); set "
        f"HAR_ROOT to a folder you may write, or use {OFFLINE_HINT}"
    )

def download_advice(root: Path) -> str:
    return f"download {UCI_URL} by hand and unzip it into {where(root)}, or use {OFFLINE_HINT}"
