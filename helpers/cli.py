"""What the two command lines share (``python -m helpers.reproduce``, and ``python -m
helpers.train``, torchrun's entry point): the options of a run, errors in one line, the
``rerun:`` command, the table of results and the ``--json`` report."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers.data import SOURCES, HARData
from helpers.data.files import atomic_write
from helpers.dist.cores import CORES_ENV, available_cores, default_threads_per_worker
from helpers.training import RunResult, TrainConfig
from helpers.training.measure import efficiency, speedup

REFERENCE = (256, 5)  # experiment 1's global batch and epochs: a run's default


@dataclass(frozen=True)
class Setting:
    title: str
    global_batch: int
    epochs: int


class OneLineParser(argparse.ArgumentParser):
    """Bad command lines end with one line saying what to fix, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a run, shared by both command lines."""
    p.add_argument(
        "--global-batch",
        type=int,
        nargs="+",
        metavar="B",
        help="global batch size(s) of your own run, instead of the two experiments",
    )
    p.add_argument(
        "--epochs",
        type=int,
        nargs="+",
        metavar="E",
        help="epochs of your own run: one value, or one per global batch",
    )
    p.add_argument(
        "--threads-per-worker",
        type=int,
        metavar="T",
        help="threads per worker (default: 2 as in the article where the cores allow, "
        "else fewer so that 2 workers fit)",
    )
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="run world sizes that need more threads than there are cores (flagged)",
    )
    p.add_argument(
        "--data", choices=SOURCES, default=None, help="data source (default: $HAR_DATA or auto)"
    )
    p.add_argument(
        "--lr", type=float, default=TrainConfig.lr, help="SGD learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=TrainConfig.seed,
        help="seed of the initial weights (default: %(default)s)",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write machine facts, the data source and every run to PATH",
    )


def check_run_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill in and check the options of ``add_run_options``; a bad one ends in one line."""
    if args.epochs and not args.global_batch:
        args.global_batch = [REFERENCE[0]]
    if args.global_batch and not args.epochs:
        args.epochs = [REFERENCE[1]]
    if args.epochs and len(args.epochs) not in (1, len(args.global_batch)):
        p.error("give one --epochs value, or one per --global-batch value")
    if args.threads_per_worker is not None and args.threads_per_worker < 1:
        p.error(f"--threads-per-worker must be at least 1, got {args.threads_per_worker}")
    if not args.lr > 0:
        p.error(f"--lr must be above 0, got {args.lr}")
    return args


def threads_for(args: argparse.Namespace) -> int:
    """The threads per worker: ``--threads-per-worker``, else the default for the cores the
    course may use. Raises ValueError, in one line, on a bad ``$DDP_COURSE_CORES``."""
    available_cores()  # checks the cap even where --threads-per-worker makes it moot here
    return args.threads_per_worker or default_threads_per_worker()


def rerun_command(
    launcher: Sequence[str],
    args: argparse.Namespace,
    source: str,
    threads: int,
    own: Sequence[str] = (),
) -> str:
    """The command line that repeats a run exactly: ``launcher`` (the words up to the options),
    then every choice that was left to a default or to the environment ($HAR_DATA, the cores)
    written out, then the command's ``own`` options."""
    words = list(launcher)
    if args.global_batch:
        words += ["--global-batch", *map(str, args.global_batch)]
        words += ["--epochs", *map(str, args.epochs)]
    words += ["--lr", repr(args.lr), "--seed", str(args.seed), "--data", source]
    words += ["--threads-per-worker", str(threads)]
    if args.oversubscribe:
        words.append("--oversubscribe")
    command = shlex.join([*words, *own])
    cores = os.environ.get(CORES_ENV)
    return command if cores is None else f"{CORES_ENV}={shlex.quote(cores)} {command}"


def print_table(
    setting: Setting,
    runs: list[RunResult],
    skipped: list[str],
    banner: str,
    lr: float = TrainConfig.lr,
) -> None:
    """The runs of one setting as a table, under a title naming the data (its ``banner``)."""
    base = next((r for r in runs if r.world == 1), None)
    print(
        f"\n{setting.title} -- global batch {setting.global_batch}, {setting.epochs} epochs, "
        f"SGD lr {lr:g}, {banner}"
    )
    print(
        f"{'workers':>7} {'threads':>7} {'train s':>8} {'start-up s':>10} {'speed-up':>8} "
        f"{'efficiency':>10} {'test acc':>8}  replicas identical  checksum"
    )
    for r in runs:
        s = speedup(base.seconds, r.seconds) if base else float("nan")
        flag = "  OVERSUBSCRIBED" if r.oversubscribed else ""
        print(
            f"{r.world:>7} {r.threads_per_worker:>7} {r.seconds:>8.2f} {r.startup_seconds:>10.2f} "
            + (f"{s:>7.2f}x {efficiency(s, r.world):>10.0%} " if base else f"{'-':>8} {'-':>10} ")
            + f"{r.accuracy:>8.2%}  "
            f"{'yes' if r.replicas_identical else 'NO':<18}  {r.checksums[0]:.6f}{flag}"
        )
    for reason in skipped:
        print(f"{'':>7} {reason}")


def check_writable(path: Path) -> None:
    """Make sure the --json report can be written, by creating (and removing) a file beside it."""
    if path.is_dir():
        raise ValueError(f"--json {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as err:
        raise ValueError(
            f"cannot write --json {path} ({err.strerror or err}); choose a writable path"
        ) from None


def write_report(
    path: Path, facts: dict, data: HARData, threads: int, rerun: str, records: list[dict]
) -> None:
    """The ``--json`` report of a run, written whole or not at all."""
    report = {
        "machine": facts,
        "data_source": data.source,
        "data": data.banner,
        "threads_per_worker": threads,
        "rerun": rerun,
        "runs": records,
    }
    atomic_write(path, lambda f: f.write(json.dumps(report, indent=2).encode()))
    print(f"wrote {path}")
