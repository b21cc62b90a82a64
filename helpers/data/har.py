"""What UCI HAR looks like: its activities, subjects and shapes, the arrays every source returns,
and where the data lives. Shared by every data source (uci, recordings, standin)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ACTIVITIES = (
    "WALKING",
    "WALKING_UPSTAIRS",
    "WALKING_DOWNSTAIRS",
    "SITTING",
    "STANDING",
    "LAYING",
)
SPLITS = ("train", "test")
ARRAYS = ("X_train", "y_train", "subject_train", "X_test", "y_test", "subject_test")
STANDIN_HINT = "HAR_DATA=standin (--data standin)"
# where UCI HAR itself cannot be had: the real data that installs offline first, then the stand-in
OFFLINE_HINT = "HAR_DATA=recordings (real data, offline) or " + STANDIN_HINT

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
    n_subjects: int = 30  # volunteer ids run 1..30

    def counts(self, split: str) -> tuple[int, ...]:
        return self.train_counts if split == "train" else self.test_counts

    def first_row(self, split: str) -> tuple[float, ...]:
        return self.train_first_row if split == "train" else self.test_first_row

    def n_rows(self, split: str) -> int:
        return sum(self.counts(split))


@dataclass(frozen=True, eq=False)
class HARData:
    """Both splits as arrays ready for torch.from_numpy, and which data they are."""

    X_train: np.ndarray  # float32 (n, 561), values in [-1, 1]; n = 7352 for UCI HAR, the stand-in
    y_train: np.ndarray  # int64 (n,), class index 0..5 (file label minus 1)
    subject_train: np.ndarray  # int64 (n,), volunteer id 1..30
    X_test: np.ndarray
    y_test: np.ndarray
    subject_test: np.ndarray
    source: str  # "uci", "recordings" or "standin"
    banner: str  # one line to print beside every result made from this data

    def __repr__(self) -> str:
        return (
            f"HARData(source={self.source!r}, train={self.X_train.shape}, "
            f"test={self.X_test.shape}, banner={self.banner!r})"
        )


def _default_root() -> tuple[Path, bool]:
    """The data folder when neither the caller nor $HAR_ROOT names one, and whether it is a
    source tree's: the checkout's har/ when this package runs from one, else (an installed copy,
    which has no har/ beside it) the user's cache, $XDG_CACHE_HOME/ddp-course/har or
    ~/.cache/ddp-course/har."""
    tree = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]  # above helpers/
    if (tree / "pyproject.toml").is_file() and (tree / "har").is_dir():
        return tree / "har", True
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return (base / "ddp-course" / "har").resolve(), False


DEFAULT_ROOT, IN_SOURCE_TREE = _default_root()


def resolve_root(root: str | Path | None = None) -> Path:
    """Where the data lives: the argument, else $HAR_ROOT, else DEFAULT_ROOT (the checkout's
    har/, or the user's cache for an installed package)."""
    if root is None:
        root = os.environ.get("HAR_ROOT") or DEFAULT_ROOT
    return Path(root).expanduser()


def where(root: Path) -> str:
    """How messages name the data folder: "har/" for a checkout's own, else its path."""
    return "har/" if IN_SOURCE_TREE and root.resolve() == DEFAULT_ROOT else f"{root}/"


_noticed: set[str] = set()  # the notices printed so far (each is printed once per process)


def notice(message: str) -> None:
    """Print a one-line notice to stderr, once per process."""
    if message not in _noticed:
        _noticed.add(message)
        print(message, file=sys.stderr, flush=True)
