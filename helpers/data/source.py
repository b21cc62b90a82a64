"""Choosing the data: the argument, $HAR_DATA or auto, and falling back with a notice.

auto: UCI HAR if it is here or can be downloaded, else the recordings if their package is
installed, else the stand-in; each step down says why in a one-line notice.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from helpers.data.compare import compare
from helpers.data.har import HARData, HARDataError, HARSpec, notice, resolve_root
from helpers.data.recordings import RECORDINGS_NAME, load_recordings
from helpers.data.standin import load_standin
from helpers.data.uci import load_uci

SOURCES = ("auto", "uci", "recordings", "standin")


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


def load_har(
    source: str | None = None,
    root: str | Path | None = None,
    download: bool = True,
    *,
    spec: HARSpec = HARSpec(),
) -> HARData:
    """Load UCI HAR, the recordings or the stand-in, as source says.

    "auto" uses verified UCI HAR in root, else downloads it, else the recordings (UCI HAR's
    features recomputed from the installed HAPT package), else the stand-in, with a notice at
    each step down; "uci" gives UCI HAR or a HARDataError; "recordings" and "standin" never
    touch the network. Cheap once cached, since every worker process calls it. A failed
    download is tried once per process under "auto"; "uci" (or download_har) tries again.
    """
    source = resolve_source(source)
    root = resolve_root(root)
    if source == "standin":
        return load_standin(root)
    if source == "recordings":
        return load_recordings(root)
    try:
        return load_uci(root, spec, download, retry=source == "uci")
    except HARDataError as err:
        if source == "uci":
            raise
        why = err
    try:
        data = load_recordings(root)
    except HARDataError as err:
        notice(f"notice: using the synthetic HAR-shaped stand-in, not UCI HAR: {why}; {err}")
        return load_standin(root)
    notice(f"notice: using the {RECORDINGS_NAME}, not UCI HAR's published files: {why}")
    return data


def main(argv: list[str] | None = None) -> None:
    """Get the data (downloading and verifying UCI HAR if needed) and say which was used."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "--data", choices=SOURCES, default=None, help="data source (default: $HAR_DATA or auto)"
    )
    parser.add_argument("--root", default=None, help="data folder (default: $HAR_ROOT or har/)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="load the recordings and compare them with UCI HAR's published figures",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        data = load_har("recordings" if args.compare else args.data, args.root)
    except (ValueError, HARDataError) as err:  # a bad $HAR_DATA, or data the user must fetch
        parser.exit(1, f"error: {err}\n")
    seconds = time.perf_counter() - started
    print(data.banner)
    print(f"train {data.X_train.shape}, test {data.X_test.shape}; loaded in {seconds:.2f} s")
    if args.compare:
        print()
        print(compare(args.root))
