"""Reproduce the reference experiment from the command line: ``python -m helpers.reproduce``.

Experiment 1: the same training (global batch 256, 5 epochs, SGD lr 0.05) split across 1, 2 and
4 workers: are the replicas identical, and is the test accuracy the same for every world size?
Experiment 2: speed-up over one worker at global batch 256 (10 epochs) and 2048 (40 epochs), with
scaling efficiency (speed-up / workers) beside it.

World sizes that would run more threads than there are cores are skipped with the reason, unless
``--oversubscribe`` is given. ``--global-batch`` / ``--epochs`` replace both experiments by one run
of your own settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.data import SOURCES, HARData, HARDataError, HARSpec, load_har
from helpers.data.files import atomic_write
from helpers.dist.cores import CORES_ENV, WorldPlan, default_threads_per_worker, plan_world_sizes
from helpers.dist.launch import WorkerError
from helpers.training import RunResult, TrainConfig, run_training, validate
from helpers.training.measure import efficiency, machine_facts, speedup

EXPERIMENT_1 = [(256, 5)]
EXPERIMENT_2 = [(256, 10), (2048, 40)]


@dataclass(frozen=True)
class Setting:
    title: str
    global_batch: int
    epochs: int


class OneLineParser(argparse.ArgumentParser):
    """Bad command lines end with one line saying what to fix, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m helpers.reproduce",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        metavar="N",
        help="world sizes to run (default: 1 2 4; 1 is always the baseline)",
    )
    add_run_options(p)
    args = p.parse_args(argv)
    if min(args.workers) < 1:
        p.error(f"--workers must be at least 1, got {min(args.workers)}")
    return check_run_options(p, args)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a run, shared with ``python -m helpers.train`` (torchrun's entry point)."""
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
        args.global_batch = [256]
    if args.global_batch and not args.epochs:
        args.epochs = [5]
    if args.epochs and len(args.epochs) not in (1, len(args.global_batch)):
        p.error("give one --epochs value, or one per --global-batch value")
    if args.threads_per_worker is not None and args.threads_per_worker < 1:
        p.error(f"--threads-per-worker must be at least 1, got {args.threads_per_worker}")
    if not args.lr > 0:
        p.error(f"--lr must be above 0, got {args.lr}")
    return args


def settings_from(args: argparse.Namespace) -> list[Setting]:
    if args.global_batch:
        epochs = args.epochs * len(args.global_batch) if len(args.epochs) == 1 else args.epochs
        return [Setting("Your run", b, e) for b, e in zip(args.global_batch, epochs, strict=True)]
    return [
        Setting("Experiment 1: the same training split across workers", b, e)
        for b, e in EXPERIMENT_1
    ] + [Setting("Experiment 2: speed-up over one worker", b, e) for b, e in EXPERIMENT_2]


def rerun_command(args: argparse.Namespace, source: str, threads: int) -> str:
    """The command line that repeats this run exactly: every choice that was left to a default
    or to the environment ($HAR_DATA, the cores) written out."""
    words = ["python", "-m", "helpers.reproduce", "--workers", *map(str, args.workers)]
    if args.global_batch:
        words += ["--global-batch", *map(str, args.global_batch)]
        words += ["--epochs", *map(str, args.epochs)]
    words += ["--lr", repr(args.lr), "--seed", str(args.seed), "--data", source]
    words += ["--threads-per-worker", str(threads)]
    if args.oversubscribe:
        words.append("--oversubscribe")
    cores = os.environ.get(CORES_ENV)
    command = shlex.join(words)
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


def check_settings(settings: list[Setting], worlds: list[int], n_train: int) -> None:
    for s in settings:
        for world in worlds:
            validate(TrainConfig(global_batch=s.global_batch, epochs=s.epochs), world, n_train)


def check_plans(plans: list[WorldPlan]) -> None:
    """Refuse thread counts that leave no world size to run, 1 included, saying what fits."""
    if not any(plan.runs for plan in plans):
        cores = plans[0].cores
        raise ValueError(
            f"--threads-per-worker {plans[0].threads_per_worker} does not fit even 1 worker on "
            f"{cores} cores: use at most {cores}, or pass --oversubscribe"
        )


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    worlds = sorted(set(args.workers) | {1})
    threads = args.threads_per_worker or default_threads_per_worker()
    try:
        check_settings(settings, worlds, HARSpec().n_rows("train"))  # before any download
        plans = plan_world_sizes(worlds, threads, oversubscribe=args.oversubscribe)
        check_plans(plans)
        if args.json:
            check_writable(args.json)  # before the runs, not after them
        data = load_har(args.data)
        check_settings(settings, worlds, len(data.y_train))  # the recordings have their own count
    except (ValueError, HARDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    facts = machine_facts()
    print(data.banner)
    print(f"machine: {facts['cores']} cores, {facts['cpu']}; torch {facts['torch']}")
    print(f"threads: {threads} per worker ({facts['thread_policy']})")
    rerun = rerun_command(args, data.source, threads)
    print(f"rerun: {rerun}")
    records = []
    started = time.perf_counter()
    try:
        for setting in settings:
            runs, skipped = [], []
            for plan in plans:
                if not plan.runs:
                    skipped.append(f"{plan.world_size} workers {plan.reason}")
                    continue
                print(
                    f"  running {plan.world_size} worker(s) x {threads} thread(s), global batch "
                    f"{setting.global_batch}, {setting.epochs} epochs ...",
                    file=sys.stderr,
                    flush=True,
                )
                config = TrainConfig(
                    global_batch=setting.global_batch,
                    epochs=setting.epochs,
                    lr=args.lr,
                    seed=args.seed,
                    data=data.source,
                    show_progress=sys.stderr.isatty(),
                )
                runs.append(run_training(plan.world_size, config, threads, plan.oversubscribed))
            print_table(setting, runs, skipped, data.banner, args.lr)
            records += [{"experiment": setting.title, **r.to_record()} for r in runs]
    except WorkerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: all workers stopped", file=sys.stderr)
        return 130
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        write_report(args.json, facts, data, threads, rerun, records)
    return 0


def write_report(
    path: Path, facts: dict, data: HARData, threads: int, rerun: str, records: list[dict]
) -> None:
    """The ``--json`` report of a run (also ``helpers.train``'s), written whole or not at all."""
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


if __name__ == "__main__":
    sys.exit(main())
