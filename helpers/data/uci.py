"""UCI HAR itself: download the archive, verify it, keep its text files under har/ and a binary
cache beside them. Run ``python -m helpers.data --data uci`` to do it by hand."""

from __future__ import annotations

import contextlib
import filecmp
import http.client
import json
import lzma
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from helpers.data.files import atomic_write, hash_key, locked, remove_stale
from helpers.data.har import (
    ARRAYS,
    OFFLINE_HINT,
    SPLITS,
    HARData,
    HARDataError,
    HARSpec,
    notice,
    resolve_root,
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
UCI_BANNER = "data: UCI HAR (verified, {where})"


class _Unverified(ValueError):
    """Files that are not a genuine UCI HAR copy; the message says what is wrong."""


_download_failed: dict[Path, str] = {}  # root -> why, so that "auto" tries the network once


# What a killed run leaves behind: the download, the staging folder, half-written cache files.
_STALE = (".download-*.tmp", ".staging-*", "cache/.uci*.tmp")


def _uci_lock(root: Path) -> contextlib.AbstractContextManager[bool]:
    """The lock every writer of UCI HAR files in root holds (see files.locked)."""
    return locked(root / ".uci.lock")


def load_uci(root: Path, spec: HARSpec, download: bool, retry: bool = True) -> HARData:
    """UCI HAR from root: the binary cache if it matches the text files, else the text parsed
    and verified (downloaded first if absent and ``download``). A second process building the
    same copy waits for the first."""
    arrays = _read_cache(root, spec)  # the common case, without waiting for any lock
    if arrays is not None:
        return HARData(**arrays, source="uci", banner=UCI_BANNER.format(where=where(root)))
    if not download and not root.is_dir():
        raise HARDataError(
            f"UCI HAR is not in {where(root)} and downloading is off; {_download_advice(root)}"
        )
    with _uci_lock(root):
        remove_stale(root, _STALE)
        return _load_uci_locked(root, spec, download, retry)


def _load_uci_locked(root: Path, spec: HARSpec, download: bool, retry: bool) -> HARData:
    at = where(root)
    present = [rel for rel in FILES if (root / rel).is_file()]
    if not present:
        if not download:
            raise HARDataError(
                f"UCI HAR is not in {at} and downloading is off; download {UCI_URL} by hand "
                f"and unzip it into {at}, or use {OFFLINE_HINT}"
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
            f"{at} holds an incomplete UCI HAR copy (missing {missing}); delete its UCI HAR "
            f"files to download a fresh copy, or unzip the whole archive there, or use "
            f"{OFFLINE_HINT}"
        )
    arrays = _read_cache(root, spec)
    if arrays is None:
        try:
            arrays, parsed = _verify_dir(root, spec)
        except _Unverified as err:
            raise HARDataError(
                f"{at} holds UCI HAR files that do not verify ({err}); delete them to download "
                f"a fresh copy, or use {OFFLINE_HINT}"
            ) from None
        _write_cache(root, spec, arrays, parsed)
    return HARData(**arrays, source="uci", banner=UCI_BANNER.format(where=at))


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
        raise _Unverified(f"{rel} has {len(rows)} rows, expected {shape[0]} rows of {cols}")
    bad = next((i for i, row in enumerate(rows) if len(row) != cols), None)
    if bad is not None:
        raise _Unverified(
            f"{rel} row {bad + 1} has {len(rows[bad])} values, expected {shape[0]} rows of {cols}"
        )
    try:
        values = np.array(rows, dtype=dtype)
    except ValueError as err:
        raise _Unverified(f"{rel} is not a table of numbers: {err}") from None
    return values.reshape(shape)


def _verify_dir(root: Path, spec: HARSpec) -> tuple[dict[str, np.ndarray], dict[str, list]]:
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
            raise _Unverified(
                f"{split}/X_{split}.txt has values outside [-1, 1] (min {np.nanmin(X):g}, "
                f"max {np.nanmax(X):g}, NaN {int(np.isnan(X).sum())})"
            )
        expected = np.array(spec.first_row(split))
        if not np.allclose(X[0, : len(expected)], expected, rtol=0, atol=spec.atol):
            got = " ".join(f"{v:.8g}" for v in X[0, : len(expected)])
            raise _Unverified(f"{split}/X_{split}.txt's first row starts {got}, not as UCI HAR's")
        rel = f"{split}/y_{split}.txt"
        y = _parse(_read(root, rel, parsed), rel, np.int64, (n,))
        if y.min() < 1 or y.max() > n_classes:
            raise _Unverified(f"{split}/y_{split}.txt has labels outside 1..{n_classes}")
        counts = tuple(int(c) for c in np.bincount(y, minlength=n_classes + 1)[1:])
        if counts != spec.counts(split):
            raise _Unverified(
                f"{split}/y_{split}.txt has class counts {counts}, expected {spec.counts(split)}"
            )
        rel = f"{split}/subject_{split}.txt"
        subject = _parse(_read(root, rel, parsed), rel, np.int64, (n,))
        if subject.min() < 1 or subject.max() > spec.n_subjects:
            raise _Unverified(f"{rel} has subject ids outside 1..{spec.n_subjects}")
        arrays[f"X_{split}"] = X.astype(np.float32)
        arrays[f"y_{split}"] = y - 1
        arrays[f"subject_{split}"] = subject
    names = _read(root, "features.txt", parsed).decode(errors="replace")
    n_names = sum(1 for line in names.splitlines() if line.strip())
    if n_names != spec.n_features:
        raise _Unverified(f"features.txt names {n_names} features, expected {spec.n_features}")
    labels = _read(root, "activity_labels.txt", parsed).decode(errors="replace").split()
    expected_labels = [w for i, name in enumerate(spec.activities, 1) for w in (str(i), name)]
    if labels != expected_labels:
        raise _Unverified("activity_labels.txt does not list UCI HAR's six activities")
    return {name: arrays[name] for name in ARRAYS}, parsed


# ----------------------------------------------------------------------------- binary cache


def _cache_key(spec: HARSpec, parsed: dict[str, list]) -> dict:
    """What the cache was built from: each text file's size and mtime before it was read and
    the SHA-256 of the bytes parsed, and the rules they met."""
    return {"format": CACHE_FORMAT, "spec": repr(spec), "files": parsed}


def _read_cache(root: Path, spec: HARSpec) -> dict[str, np.ndarray] | None:
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


def _write_cache(
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


# ----------------------------------------------------------------------------- download


def _download_advice(root: Path) -> str:
    return f"download {UCI_URL} by hand and unzip it into {where(root)}, or use {OFFLINE_HINT}"


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
    root.mkdir(parents=True, exist_ok=True)
    with _uci_lock(root):  # a second download into root waits, then finds this one's copy
        remove_stale(root, _STALE)
        if any((root / rel).exists() for rel in FILES):
            load_uci(root, spec, download=False)  # verifies what is there, or says what's wrong
            return root
        fd, tmp = tempfile.mkstemp(prefix=".download-", suffix=".tmp", dir=root)
        try:
            with os.fdopen(fd, "wb") as f:
                _fetch(url, f, timeout, progress, root)
            extract_and_verify(Path(tmp), root, spec)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return root


MAX_DOWNLOAD_BYTES = 200_000_000  # the UCI archive is about 60 MB
MAX_MEMBER_BYTES = 200_000_000  # its largest file, train/X_train.txt, about 66 MB


class _RefuseDowngrade(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never from https to plain http."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201
        if req.full_url.startswith("https:") and not newurl.startswith("https:"):
            raise urllib.error.URLError(f"refused a redirect from https to {newurl}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str, timeout: float) -> IO[bytes]:
    """Open url, following redirects but never from https down to http."""
    return urllib.request.build_opener(_RefuseDowngrade).open(url, timeout=timeout)


def _fetch(url: str, out: IO[bytes], timeout: float, progress: bool, root: Path) -> None:
    """Stream url into out, with a percentage line on stderr."""
    done = total = 0
    try:
        with _open(url, timeout) as response:
            total = int(response.headers.get("Content-Length") or 0)
            if total > MAX_DOWNLOAD_BYTES:
                raise ValueError(
                    f"it is {total} bytes, more than the {MAX_DOWNLOAD_BYTES} bytes allowed"
                )
            shown = ""
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if done > MAX_DOWNLOAD_BYTES:
                    raise ValueError(f"it passed the {MAX_DOWNLOAD_BYTES} bytes allowed")
                if total:
                    status = f"{100 * done // total:3d}% of {total / 1e6:.1f} MB"
                else:
                    status = f"{done / 1e6:.0f} MB"
                if progress and status != shown:
                    shown = status
                    print(f"\rdownloading UCI HAR: {status}", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr, flush=True)
    # URLError, HTTPError and timeouts are OSErrors; IncompleteRead an HTTPException
    except (OSError, ValueError, http.client.HTTPException) as err:
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
    with _uci_lock(root):
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
        try:
            _extract(archive, staging, root)
            try:
                arrays, parsed = _verify_dir(staging, spec)
            except _Unverified as err:
                raise HARDataError(
                    f"{archive.name} is not a genuine UCI HAR copy ({err}); "
                    f"{_download_advice(root)}"
                ) from None
            _move_into_place(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _write_cache(root, spec, arrays, parsed)


def _check_member(name: str, root: Path) -> None:
    """Refuse a member whose path would land outside the folder it is extracted into."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        raise HARDataError(
            f"refusing archive member {name!r}, whose path leads outside {where(root)} (nothing "
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
                _copy_member(zf, nested[0], inner, root)
                _extract(inner, staging, root, depth + 1)
                inner.unlink()
                return
            for rel, name in members.items():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                _copy_member(zf, name, staging / rel, root)
    except HARDataError:
        raise
    # What a broken or unusual zip raises: bad data, an unsupported compression method
    # (NotImplementedError), encryption (RuntimeError), a zip64 limit, a truncated stream.
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        lzma.LZMAError,
        EOFError,
        NotImplementedError,
        RuntimeError,
        ValueError,
    ) as err:
        raise HARDataError(
            f"{archive.name} is not a readable zip archive ({err}); {_download_advice(root)}"
        ) from None


def _copy_member(zf: zipfile.ZipFile, name: str, dst: Path, root: Path) -> None:
    """Copy one member out, refusing more than MAX_MEMBER_BYTES whatever its header claims: a
    hostile or broken archive must not fill the disk."""
    declared = zf.getinfo(name).file_size
    copied = 0
    with zf.open(name) as src, open(dst, "wb") as out:
        while declared <= MAX_MEMBER_BYTES and (chunk := src.read(1 << 20)):
            copied += len(chunk)
            if copied > MAX_MEMBER_BYTES:
                break
            out.write(chunk)
    if declared > MAX_MEMBER_BYTES or copied > MAX_MEMBER_BYTES:
        raise HARDataError(
            f"archive member {name!r} is larger than {MAX_MEMBER_BYTES} bytes, so this is not a "
            f"genuine UCI HAR archive; {_download_advice(root)}"
        )


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
                    f"{where(root)}{rel} already exists and differs from the verified download; "
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
