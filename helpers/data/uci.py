"""UCI HAR itself: download the archive, verify it, keep its text files under har/ and a binary
cache beside them. Run ``python -m helpers.data --data uci`` to do it by hand."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from helpers.data.files import remove_stale
from helpers.data.har import (
    OFFLINE_HINT,
    HARData,
    HARDataError,
    HARSpec,
    resolve_root,
    where,
)
from helpers.data.uci_fetch import extract_and_verify, fetch
from helpers.data.uci_verify import (
    FILES,
    STALE,
    UCI_URL,
    Unverified,
    download_advice,
    read_cache,
    uci_lock,
    unwritable,
    verify_dir,
    write_cache,
)

UCI_BANNER = "data: UCI HAR (verified, {where})"


_download_failed: dict[Path, str] = {}  # root -> why, so that "auto" tries the network once


def load_uci(root: Path, spec: HARSpec, download: bool, retry: bool = True) -> HARData:
    """UCI HAR from root: the binary cache if it matches the text files, else the text parsed
    and verified (downloaded first if absent and ``download``). A second process building the
    same copy waits for the first."""
    arrays = read_cache(root, spec)  # the common case, without waiting for any lock
    if arrays is not None:
        return HARData(**arrays, source="uci", banner=UCI_BANNER.format(where=where(root)))
    if not download and not root.is_dir():
        raise HARDataError(
            f"UCI HAR is not in {where(root)} and downloading is off; {download_advice(root)}"
        )
    with uci_lock(root):
        remove_stale(root, STALE)
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
    arrays = read_cache(root, spec)
    if arrays is None:
        try:
            arrays, parsed = verify_dir(root, spec)
        except Unverified as err:
            raise HARDataError(
                f"{at} holds UCI HAR files that do not verify ({err}); delete them to download "
                f"a fresh copy, or use {OFFLINE_HINT}"
            ) from None
        write_cache(root, spec, arrays, parsed)
    return HARData(**arrays, source="uci", banner=UCI_BANNER.format(where=at))


# ----------------------------------------------------------------------------- binary cache


# ----------------------------------------------------------------------------- download


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
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise unwritable(root, err) from None
    with uci_lock(root):  # a second download into root waits, then finds this one's copy
        remove_stale(root, STALE)
        if any((root / rel).exists() for rel in FILES):
            load_uci(root, spec, download=False)  # verifies what is there, or says what's wrong
            return root
        try:
            fd, tmp = tempfile.mkstemp(prefix=".download-", suffix=".tmp", dir=root)
        except OSError as err:  # a read-only root, before any byte is downloaded
            raise unwritable(root, err) from None
        try:
            with os.fdopen(fd, "wb") as f:
                fetch(url, f, timeout, progress, root)
            extract_and_verify(Path(tmp), root, spec)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return root


