"""UCI HAR's archive downloaded and unpacked safely: https never downgraded to http, sizes capped,
members checked before they are written, and the files moved into place only once they verify."""

from __future__ import annotations

import filecmp
import http.client
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

from helpers.data.har import (
    HARDataError,
    HARSpec,
    resolve_root,
    where,
)
from helpers.data.uci_verify import (
    FILES,
    UCI_URL,
    Unverified,
    download_advice,
    uci_lock,
    unwritable,
    verify_dir,
    write_cache,
)

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

class _Progress:
    """The download's percentage line on stderr, redrawn in place; nothing when off."""

    def __init__(self, on: bool) -> None:
        self.on, self.shown = on, ""

    def update(self, done: int, total: int) -> None:
        status = f"{done / 1e6:.0f} MB"
        if total:
            status = f"{100 * done // total:3d}% of {total / 1e6:.1f} MB"
        if self.on and status != self.shown:
            self.shown = status
            print(f"\rdownloading UCI HAR: {status}", end="", file=sys.stderr, flush=True)

    def end(self) -> None:
        """End the line, if one was drawn, so that what follows starts on its own."""
        if self.shown:
            print(file=sys.stderr, flush=True)
            self.shown = ""

def _copy(response: IO[bytes], out: IO[bytes], progress: _Progress) -> tuple[int, int]:
    """Copy response into out, refusing more than MAX_DOWNLOAD_BYTES whatever the server
    announces; returns (bytes copied, bytes announced, 0 if none)."""
    total = int(response.headers.get("Content-Length") or 0)
    if total > MAX_DOWNLOAD_BYTES:
        raise ValueError(f"it is {total} bytes, more than the {MAX_DOWNLOAD_BYTES} bytes allowed")
    done = 0
    while chunk := response.read(1 << 20):
        out.write(chunk)
        done += len(chunk)
        if done > MAX_DOWNLOAD_BYTES:
            raise ValueError(f"it passed the {MAX_DOWNLOAD_BYTES} bytes allowed")
        progress.update(done, total)
    return done, total

def _reason(err: Exception) -> str:
    """A download error in one line: for a URLError, the socket error itself (say "Name or
    service not known"), not its wrapper."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        return " ".join(str(err.reason).split())
    return " ".join(str(err).split())

def fetch(url: str, out: IO[bytes], timeout: float, progress: bool, root: Path) -> None:
    """Stream url into out, with a percentage line on stderr."""
    shown = _Progress(progress)
    try:
        with _open(url, timeout) as response:
            done, total = _copy(response, out, shown)
    # URLError, HTTPError and timeouts are OSErrors; IncompleteRead an HTTPException
    except (OSError, ValueError, http.client.HTTPException) as err:
        origin = "" if url == UCI_URL else f" from {url}"
        raise HARDataError(
            f"could not download UCI HAR{origin} ({_reason(err)}); {download_advice(root)}"
        ) from None
    finally:
        shown.end()
    if total and done != total:
        raise HARDataError(
            f"the download of {url} stopped at {done} of {total} bytes; {download_advice(root)}"
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
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise unwritable(root, err) from None
    with uci_lock(root):
        try:
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
        except OSError as err:
            raise unwritable(root, err) from None
        try:
            _extract(archive, staging, root)
            try:
                arrays, parsed = verify_dir(staging, spec)
            except Unverified as err:
                raise HARDataError(
                    f"{archive.name} is not a genuine UCI HAR copy ({err}); "
                    f"{download_advice(root)}"
                ) from None
            _move_into_place(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_cache(root, spec, arrays, parsed)

def _check_member(name: str, root: Path) -> None:
    """Refuse a member whose path would land outside the folder it is extracted into."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        raise HARDataError(
            f"refusing archive member {name!r}, whose path leads outside {where(root)} (nothing "
            f"was extracted): this is not a genuine UCI HAR archive; {download_advice(root)}"
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
            f"{download_advice(root)}"
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
                        f"{download_advice(root)}"
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
            f"{archive.name} is not a readable zip archive ({err}); {download_advice(root)}"
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
            f"genuine UCI HAR archive; {download_advice(root)}"
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
