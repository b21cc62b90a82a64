"""How long each notebook takes to run top to bottom, for the instructor's guide (COURSE.md).

``python -m helpers.notebook.timings --cores 4 notebooks/*.ipynb`` (``make timings CORES=4``)
executes every notebook in a fresh kernel, one at a time, into a temporary folder (the committed
notebooks stay as they are), with the course planning for ``--cores`` cores, and prints one
Markdown table row per notebook with the load average beside it (a timing taken while other
programs share the cores measures them too) and, on Linux, the peak memory of the notebook's
kernel and its workers together (``helpers.notebook.tree_memory``), what a hub must give each
student.

``--cores`` sets ``DDP_COURSE_CORES``, which caps the cores the course plans with; it cannot add
any, so a column for N cores needs a machine with at least N.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers.dist.cores import CORES_ENV, machine_cores
from helpers.notebook.tree_memory import PeakSampler
from helpers.training.measure import cpu_model


@dataclass(frozen=True)
class NotebookTiming:
    """One notebook's run: wall seconds, whether it ran through, the 1-minute load average
    before and after it, and the peak summed RSS and PSS of its kernel and workers (0: not
    sampled)."""

    notebook: str
    seconds: float
    ok: bool
    load_before: float
    load_after: float
    peak_rss: int = 0
    peak_pss: int = 0


def check_cores(cores: int) -> None:
    """Refuse a core count this machine cannot play, saying what to do instead."""
    have = machine_cores()
    if cores < 1 or cores > have:
        raise ValueError(
            f"--cores {cores}: this machine has {have} core(s), and {CORES_ENV} can only cap the"
            f" cores a run plans for; time {cores} cores on a machine with at least {cores}"
        )


def time_notebook(path: Path, cores: int, data: str, out: Path) -> NotebookTiming:
    """Execute ``path`` into ``out`` with the course planning for ``cores`` cores on ``data``."""
    env = {**os.environ, CORES_ENV: str(cores), "HAR_DATA": data}
    command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
               "--ExecutePreprocessor.timeout=1800", "--output-dir", str(out), str(path)]
    before = os.getloadavg()[0]
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    with PeakSampler(process.pid) as peak:  # the kernel and its workers run below nbconvert
        process.wait()
    seconds = time.perf_counter() - start
    return NotebookTiming(path.stem, seconds, process.returncode == 0, before,
                          os.getloadavg()[0], peak.rss, peak.pss)  # fmt: skip


def markdown_rows(timings: Sequence[NotebookTiming]) -> str:
    """``| notebook | seconds (load before-after) |`` rows, FAILED where a notebook stopped."""
    rows = []
    for t in timings:
        result = "" if t.ok else ", FAILED"
        memory = (f" {t.peak_rss / 2**30:.1f} GiB RSS, {t.peak_pss / 2**30:.1f} GiB PSS |"
                  if t.peak_rss else "")  # fmt: skip
        rows.append(
            f"| `{t.notebook}` | {t.seconds:.0f} s (load {t.load_before:.1f}-{t.load_after:.1f}"
            f"{result}) |{memory}"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.notebook.timings", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--cores", type=int, default=2, help="cores the course plans for (default 2)")
    p.add_argument("--data", default="recordings", help="HAR_DATA (default recordings)")
    args = p.parse_args(argv)
    try:
        check_cores(args.cores)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{cpu_model()}, {machine_cores()} cores, planning for {args.cores}, data {args.data}")
    print(f"| notebook | {args.cores} cores | peak memory, kernel and workers |")
    print("| --- | ---: | ---: |")
    timings = []
    with tempfile.TemporaryDirectory() as out:
        for path in args.notebooks:
            timings.append(time_notebook(path, args.cores, args.data, Path(out)))
            print(markdown_rows(timings[-1:]), flush=True)
    return 0 if all(t.ok for t in timings) else 1


if __name__ == "__main__":
    sys.exit(main())
