"""UCI HAR data: download and verify the real data set, cache it, or stand in for it offline.

Every worker process calls :func:`load_har` itself, so once the data is on disk a load only
reads small binary caches. Which data was used is never silent: every result carries
``.source`` and a ``.banner`` to print next to any figure or table made from it.

    data = load_har()            # HAR_DATA=auto|uci|standin, default auto
    print(data.banner)           # "data: UCI HAR (verified, har/)" or the stand-in's banner

Run ``python -m helpers.data --data uci`` to download and verify the real data by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

UCI_URL = (
    "https://archive.ics.uci.edu/static/public/240/human+activity+recognition+using+smartphones.zip"
)
SOURCES = ("auto", "uci", "standin")
ACTIVITIES = (
    "WALKING",
    "WALKING_UPSTAIRS",
    "WALKING_DOWNSTAIRS",
    "SITTING",
    "STANDING",
    "LAYING",
)
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "har"
SPLITS = ("train", "test")
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
ARRAYS = ("X_train", "y_train", "subject_train", "X_test", "y_test", "subject_test")
CACHE_FORMAT = 1
STANDIN_VERSION = 1  # bump whenever make_standin changes, so old caches are not reused
UCI_BANNER = "data: UCI HAR (verified, {where})"
STANDIN_BANNER = "data: HAR-shaped stand-in (synthetic; not UCI HAR results)"
STANDIN_HINT = "HAR_DATA=standin (--data standin)"

# The real files hold subjects in contiguous blocks: (subject id, windows), in file order.
TRAIN_SUBJECTS = (
    (1, 347), (3, 341), (5, 302), (6, 325), (7, 308), (8, 281), (11, 316),
    (14, 323), (15, 328), (16, 366), (17, 368), (19, 360), (21, 408), (22, 321),
    (23, 372), (25, 409), (26, 392), (27, 376), (28, 382), (29, 344), (30, 383),
)  # fmt: skip
TEST_SUBJECTS = (
    (2, 302), (4, 317), (9, 288), (10, 294), (12, 320), (13, 327), (18, 364), (20, 354), (24, 381),
)  # fmt: skip


class HARDataError(RuntimeError):
    """A data problem the user must act on; the message is one line saying what to do."""


class _Unverified(ValueError):
    """Files that are not a genuine UCI HAR copy; the message says what is wrong."""


@dataclass(frozen=True)
class HARSpec:
    """What a genuine copy of UCI HAR looks like. Tests check the same logic with a tiny one."""

    n_features: int = 561
    train_counts: tuple[int, ...] = (1226, 1073, 986, 1286, 1374, 1407)  # windows of labels 1..6
    test_counts: tuple[int, ...] = (496, 471, 420, 491, 532, 537)
    train_first_row: tuple[float, ...] = (
        0.28858451, -0.020294171, -0.13290514, -0.9952786, -0.98311061, -0.91352645,
    )  # fmt: skip
    test_first_row: tuple[float, ...] = (0.25717778, -0.02328523, -0.014653762, -0.938404)
    activities: tuple[str, ...] = ACTIVITIES
    atol: float = 1e-6

    def counts(self, split: str) -> tuple[int, ...]:
        return self.train_counts if split == "train" else self.test_counts

    def first_row(self, split: str) -> tuple[float, ...]:
        return self.train_first_row if split == "train" else self.test_first_row

    def n_rows(self, split: str) -> int:
        return sum(self.counts(split))


@dataclass(frozen=True, eq=False)
class HARData:
    """Both splits as arrays ready for torch.from_numpy, and which data they are."""

    X_train: np.ndarray  # float32 (7352, 561), values in [-1, 1]
    y_train: np.ndarray  # int64 (7352,), class index 0..5 (file label minus 1)
    subject_train: np.ndarray  # int64 (7352,), volunteer id 1..30
    X_test: np.ndarray
    y_test: np.ndarray
    subject_test: np.ndarray
    source: str  # "uci" or "standin"
    banner: str  # one line to print beside every result made from this data

    def __repr__(self) -> str:
        return (
            f"HARData(source={self.source!r}, train={self.X_train.shape}, "
            f"test={self.X_test.shape}, banner={self.banner!r})"
        )


# ----------------------------------------------------------------------------- choosing


def resolve_source(source: str | None = None) -> str:
    """The data source to use: the argument, else $HAR_DATA, else "auto"."""
    origin = "source"
    if source is None:
        source, origin = os.environ.get("HAR_DATA") or "auto", "HAR_DATA"
    value = source.strip().lower()
    if value not in SOURCES:
        valid = ", ".join(SOURCES)
        raise ValueError(f"{origin}={source!r} is not a data source; use one of {valid}")
    return value


def resolve_root(root: str | Path | None = None) -> Path:
    """Where the data lives: the argument, else $HAR_ROOT, else the repository's har/."""
    if root is None:
        root = os.environ.get("HAR_ROOT") or DEFAULT_ROOT
    return Path(root).expanduser()


def _where(root: Path) -> str:
    """How messages name the data folder: "har/" for the default one."""
    return "har/" if root.resolve() == DEFAULT_ROOT else f"{root}/"


_noticed: set[str] = set()
_download_failed: dict[Path, str] = {}  # root -> why, so that "auto" tries the network once


def _notice(message: str) -> None:
    """Print a one-line notice to stderr, once per process."""
    if message not in _noticed:
        _noticed.add(message)
        print(message, file=sys.stderr, flush=True)


def load_har(
    source: str | None = None,
    root: str | Path | None = None,
    download: bool = True,
    *,
    spec: HARSpec = HARSpec(),
) -> HARData:
    """Load UCI HAR, or the stand-in where the real data is absent and source is "auto".

    "auto" uses verified real data in root, else downloads it, else falls back to the stand-in
    with a notice; "uci" gives the real data or a HARDataError; "standin" never touches the
    network. Cheap once cached, since every worker process calls it. A failed download is
    tried once per process under "auto"; "uci" (or download_har) tries again.
    """
    source = resolve_source(source)
    root = resolve_root(root)
    if source == "standin":
        return _load_standin(root)
    try:
        return _load_uci(root, spec, download, retry=source == "uci")
    except HARDataError as err:
        if source == "uci":
            raise
        _notice(f"notice: using the synthetic HAR-shaped stand-in, not UCI HAR: {err}")
        return _load_standin(root)


# ----------------------------------------------------------------------------- real data


def _load_uci(root: Path, spec: HARSpec, download: bool, retry: bool = True) -> HARData:
    where = _where(root)
    present = [rel for rel in FILES if (root / rel).is_file()]
    if not present:
        if not download:
            raise HARDataError(
                f"UCI HAR is not in {where} and downloading is off; download {UCI_URL} by hand "
                f"and unzip it into {where}, or use {STANDIN_HINT}"
            )
        if not retry and root in _download_failed:
            raise HARDataError(_download_failed[root])
        try:
            download_har(root, spec=spec)
        except HARDataError as err:
            _download_failed[root] = str(err)
            raise
    elif len(present) < len(FILES):
        missing = ", ".join(rel for rel in FILES if rel not in present)
        raise HARDataError(
            f"{where} holds an incomplete UCI HAR copy (missing {missing}); delete its UCI HAR "
            f"files to download a fresh copy, or unzip the whole archive there, or use "
            f"{STANDIN_HINT}"
        )
    arrays = _read_cache(root, spec)
    if arrays is None:
        try:
            arrays = _verify_dir(root, spec)
        except _Unverified as err:
            raise HARDataError(
                f"{where} holds UCI HAR files that do not verify ({err}); delete them to download "
                f"a fresh copy, or use {STANDIN_HINT}"
            ) from None
        _write_cache(root, spec, arrays)
    return HARData(**arrays, source="uci", banner=UCI_BANNER.format(where=where))


def _parse(root: Path, rel: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Parse a whitespace-separated table (a plain split: far faster than np.loadtxt), check its
    shape."""
    text = (root / rel).read_bytes()
    rows = sum(1 for line in text.splitlines() if line.strip())
    try:
        values = np.array(text.split(), dtype=dtype)
    except ValueError as err:
        raise _Unverified(f"{rel} is not a table of numbers: {err}") from None
    cols = shape[1] if len(shape) == 2 else 1
    if rows != shape[0] or values.size != rows * cols:
        per_row = f"{values.size / rows:g}" if rows else "0"
        found = f"{rows} rows of {per_row} values"
        raise _Unverified(f"{rel} has {found}, expected {shape[0]} rows of {cols}")
    return values.reshape(shape)


def _verify_dir(root: Path, spec: HARSpec) -> dict[str, np.ndarray]:
    """Parse the text files under root and check them against spec; return HARData's arrays."""
    arrays: dict[str, np.ndarray] = {}
    n_classes = len(spec.activities)
    for split in SPLITS:
        n = spec.n_rows(split)
        X = _parse(root, f"{split}/X_{split}.txt", np.float64, (n, spec.n_features))
        if not np.all((X >= -1) & (X <= 1)):
            raise _Unverified(
                f"{split}/X_{split}.txt has values outside [-1, 1] (min {np.nanmin(X):g}, "
                f"max {np.nanmax(X):g}, NaN {int(np.isnan(X).sum())})"
            )
        expected = np.array(spec.first_row(split))
        if not np.allclose(X[0, : len(expected)], expected, rtol=0, atol=spec.atol):
            got = " ".join(f"{v:.8g}" for v in X[0, : len(expected)])
            raise _Unverified(f"{split}/X_{split}.txt's first row starts {got}, not as UCI HAR's")
        y = _parse(root, f"{split}/y_{split}.txt", np.int64, (n,))
        if y.min() < 1 or y.max() > n_classes:
            raise _Unverified(f"{split}/y_{split}.txt has labels outside 1..{n_classes}")
        counts = tuple(int(c) for c in np.bincount(y, minlength=n_classes + 1)[1:])
        if counts != spec.counts(split):
            raise _Unverified(
                f"{split}/y_{split}.txt has class counts {counts}, expected {spec.counts(split)}"
            )
        subject = _parse(root, f"{split}/subject_{split}.txt", np.int64, (n,))
        arrays[f"X_{split}"] = X.astype(np.float32)
        arrays[f"y_{split}"] = y - 1
        arrays[f"subject_{split}"] = subject
    n_names = sum(1 for line in (root / "features.txt").read_text().splitlines() if line.strip())
    if n_names != spec.n_features:
        raise _Unverified(f"features.txt names {n_names} features, expected {spec.n_features}")
    labels = (root / "activity_labels.txt").read_text().split()
    expected_labels = [w for i, name in enumerate(spec.activities, 1) for w in (str(i), name)]
    if labels != expected_labels:
        raise _Unverified("activity_labels.txt does not list UCI HAR's six activities")
    return {name: arrays[name] for name in ARRAYS}


# ----------------------------------------------------------------------------- binary cache


def _atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write via a temporary file and os.replace, so readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "xb") as f:  # unlike mkstemp, keeps the usual permissions
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _cache_key(root: Path, spec: HARSpec) -> dict:
    """What the cache was built from: the text files' size and mtime, and the rules they met."""
    stats = {rel: (root / rel).stat() for rel in FILES}
    return {
        "format": CACHE_FORMAT,
        "spec": repr(spec),
        "files": {rel: [st.st_size, st.st_mtime_ns] for rel, st in stats.items()},
    }


def _read_cache(root: Path, spec: HARSpec) -> dict[str, np.ndarray] | None:
    """The cached arrays if they were built from the text files as they are now, else None."""
    cache = root / "cache"
    try:
        if json.loads((cache / "uci.json").read_text()) != _cache_key(root, spec):
            return None
        arrays = {name: np.load(cache / f"uci-{name}.npy") for name in ARRAYS}
    except (OSError, ValueError, EOFError):
        return None
    for split in SPLITS:
        n = spec.n_rows(split)
        if arrays[f"X_{split}"].shape != (n, spec.n_features) or arrays[f"y_{split}"].shape != (n,):
            return None
    return arrays


def _write_cache(root: Path, spec: HARSpec, arrays: dict[str, np.ndarray]) -> None:
    """Cache the parsed arrays beside the text; the JSON key goes last, so it vouches for them."""
    cache = root / "cache"
    key = _cache_key(root, spec)
    try:
        for name in ARRAYS:
            _atomic_write(cache / f"uci-{name}.npy", lambda f, a=arrays[name]: np.save(f, a))
        _atomic_write(cache / "uci.json", lambda f: f.write(json.dumps(key, indent=1).encode()))
    except OSError as err:  # a read-only har/ still works, only slower
        _notice(f"notice: could not cache UCI HAR in {cache} ({err}); every load will parse text")


# ----------------------------------------------------------------------------- download


def _download_advice(root: Path) -> str:
    return f"download {UCI_URL} by hand and unzip it into {_where(root)}, or use {STANDIN_HINT}"


def download_har(
    root: str | Path | None = None,
    url: str = UCI_URL,
    *,
    timeout: float = 60.0,
    spec: HARSpec = HARSpec(),
    progress: bool = True,
) -> Path:
    """Download UCI HAR into root, verify it, and return root.

    Files already in root are never overwritten: a verified copy is kept (nothing downloaded),
    anything else is reported. The archive goes to a temporary file inside root, removed
    afterwards whatever happens.
    """
    root = resolve_root(root)
    if any((root / rel).exists() for rel in FILES):
        _load_uci(root, spec, download=False)  # verifies what is there, or says what is wrong
        return root
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".download-", suffix=".tmp", dir=root)
    try:
        with os.fdopen(fd, "wb") as f:
            _fetch(url, f, timeout, progress, root)
        extract_and_verify(Path(tmp), root, spec)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return root


def _fetch(url: str, out: IO[bytes], timeout: float, progress: bool, root: Path) -> None:
    """Stream url into out, with a percentage line on stderr."""
    done = total = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0)
            shown = ""
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if total:
                    status = f"{100 * done // total:3d}% of {total / 1e6:.1f} MB"
                else:
                    status = f"{done / 1e6:.0f} MB"
                if progress and status != shown:
                    shown = status
                    print(f"\rdownloading UCI HAR: {status}", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr, flush=True)
    except (OSError, ValueError) as err:  # URLError, HTTPError and timeouts are OSErrors
        if progress and done:
            print(file=sys.stderr, flush=True)
        if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
            err = err.reason  # the socket error itself, say "Name or service not known"
        reason = " ".join(str(err).split())
        origin = "" if url == UCI_URL else f" from {url}"
        raise HARDataError(
            f"could not download UCI HAR{origin} ({reason}); {_download_advice(root)}"
        ) from None
    if total and done != total:
        raise HARDataError(
            f"the download of {url} stopped at {done} of {total} bytes; {_download_advice(root)}"
        )


def extract_and_verify(
    archive: str | Path, root: str | Path | None = None, spec: HARSpec = HARSpec()
) -> None:
    """Extract UCI HAR's files from archive into root, but only once they verify.

    The files are extracted into a staging folder inside root, verified there, then moved
    into place with os.replace; the staging folder is removed whatever happens. Accepts the
    UCI download (a zip holding "UCI HAR Dataset.zip") and flat zips of the data set folder.
    """
    archive, root = Path(archive), resolve_root(root)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        _extract(archive, staging, root)
        try:
            arrays = _verify_dir(staging, spec)
        except _Unverified as err:
            raise HARDataError(
                f"{archive.name} is not a genuine UCI HAR copy ({err}); {_download_advice(root)}"
            ) from None
        _move_into_place(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _write_cache(root, spec, arrays)


def _check_member(name: str, root: Path) -> None:
    """Refuse a member whose path would land outside the folder it is extracted into."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        raise HARDataError(
            f"refusing archive member {name!r}, whose path leads outside {_where(root)} (nothing "
            f"was extracted): this is not a genuine UCI HAR archive; {_download_advice(root)}"
        )


def _locate(names: list[str], root: Path) -> dict[str, str] | None:
    """Map each of FILES to its member, whatever folder the data set sits in; None if absent."""
    members = {n for n in names if not n.endswith("/") and not n.startswith("__MACOSX/")}
    first = FILES[0]
    prefixes = [n[: -len(first)] for n in members if n == first or n.endswith("/" + first)]
    if not prefixes:
        return None
    prefix = min(prefixes, key=len)
    missing = [rel for rel in FILES if prefix + rel not in members]
    if missing:
        raise HARDataError(
            f"the archive lacks {', '.join(missing)}, so it is not a complete UCI HAR copy; "
            f"{_download_advice(root)}"
        )
    return {rel: prefix + rel for rel in FILES}


def _extract(archive: Path, staging: Path, root: Path, depth: int = 0) -> None:
    """Copy the wanted members of archive (or of the zip nested in it) into staging."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            for name in names:
                _check_member(name, root)
            members = _locate(names, root)
            if members is None:
                zips = [n for n in names if n.lower().endswith(".zip")]
                nested = sorted(
                    (n for n in zips if not n.startswith("__MACOSX/")),
                    key=lambda n: (not n.endswith("UCI HAR Dataset.zip"), n),
                )
                if not nested or depth > 0:
                    raise HARDataError(
                        f"{archive.name} holds no UCI HAR data (no train/X_train.txt); "
                        f"{_download_advice(root)}"
                    )
                inner = staging / ".nested.zip"
                with zf.open(nested[0]) as src, open(inner, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                _extract(inner, staging, root, depth + 1)
                inner.unlink()
                return
            for rel, name in members.items():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                with zf.open(name) as src, open(staging / rel, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise HARDataError(
            f"{archive.name} is not a readable zip archive ({err}); {_download_advice(root)}"
        ) from None


def _move_into_place(staging: Path, root: Path) -> None:
    """Move the verified files from staging into root, never replacing different files there.

    An identical file already in place (say, from a worker that downloaded at the same time)
    is left as it is.
    """
    todo = []
    for rel in FILES:
        dst = root / rel
        if dst.exists():
            if not filecmp.cmp(staging / rel, dst, shallow=False):
                raise HARDataError(
                    f"{_where(root)}{rel} already exists and differs from the verified download; "
                    "it was left untouched: delete it and retry"
                )
        else:
            todo.append(rel)
    moved: list[Path] = []
    try:
        for rel in todo:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, root / rel)
            moved.append(root / rel)
    except BaseException:  # leave no half-installed copy behind
        for path in moved:
            path.unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- stand-in


def _load_standin(root: Path) -> HARData:
    """The stand-in, from its cache if there (generated and cached otherwise)."""
    path = root / "cache" / f"standin-v{STANDIN_VERSION}.npz"
    try:
        with np.load(path) as saved:
            arrays = {name: saved[name] for name in ARRAYS}
        if arrays["X_train"].shape == (7352, 561) and arrays["X_test"].shape == (2947, 561):
            return HARData(**arrays, source="standin", banner=STANDIN_BANNER)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass
    data = make_standin()
    arrays = {name: getattr(data, name) for name in ARRAYS}
    with contextlib.suppress(OSError):  # a read-only root only costs regenerating each time
        _atomic_write(path, lambda f: np.savez(f, **arrays))
    return data


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


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    """Get the data (downloading and verifying UCI HAR if needed) and say which was used."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "--data", choices=SOURCES, default=None, help="data source (default: $HAR_DATA or auto)"
    )
    parser.add_argument("--root", default=None, help="data folder (default: $HAR_ROOT or har/)")
    args = parser.parse_args(argv)
    try:
        data = load_har(args.data, args.root)
    except (ValueError, HARDataError) as err:  # a bad $HAR_DATA, or data the user must fetch
        parser.exit(1, f"error: {err}\n")
    print(data.banner)
    print(f"train {data.X_train.shape}, test {data.X_test.shape}")


if __name__ == "__main__":
    main()
