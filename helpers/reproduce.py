"""Reproduce the reference experiment from the command line: ``python -m helpers.reproduce``.
``DESCRIPTION`` (its ``--help``) says what the two experiments are."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time

from helpers.cli import (
    REFERENCE,
    OneLineParser,
    Setting,
    add_run_options,
    check_run_options,
    check_writable,
    print_table,
    rerun_command,
    threads_for,
    write_report,
)
from helpers.data import HARDataError, HARSpec, load_har
from helpers.dist.cores import WorldPlan, plan_world_sizes
from helpers.dist.launch import WorkerError
from helpers.training import TrainConfig, run_training, validate
from helpers.training.measure import machine_facts

EXPERIMENT_1 = [REFERENCE]
EXPERIMENT_2 = [(256, 10), (2048, 40)]

DESCRIPTION = "\n\n".join(
    textwrap.fill(paragraph, 79)
    for paragraph in (
        "Reproduce the reference experiment: a 561-1024-1024-6 MLP trained on HAR with DDP.",
        f"Experiment 1: the same training (global batch {REFERENCE[0]}, {REFERENCE[1]} epochs, "
        f"SGD lr {TrainConfig.lr:g}) split across 1, 2 and 4 workers: are the replicas "
        "identical, and is the test accuracy the same for every world size?",
        "Experiment 2: speed-up over one worker at global batch "
        + " and ".join(f"{b} ({e} epochs)" for b, e in EXPERIMENT_2)
        + ", with scaling efficiency (speed-up / workers) beside it.",
        "World sizes that would run more threads than there are cores are skipped with the "
        "reason, unless --oversubscribe is given. --global-batch / --epochs replace both "
        "experiments by one run of your own settings. Every run prints a rerun: line, the "
        "command that repeats it exactly.",
    )
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m helpers.reproduce",
        description=DESCRIPTION,
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


def settings_from(args: argparse.Namespace) -> list[Setting]:
    if args.global_batch:
        epochs = args.epochs * len(args.global_batch) if len(args.epochs) == 1 else args.epochs
        return [Setting("Your run", b, e) for b, e in zip(args.global_batch, epochs, strict=True)]
    return [
        Setting("Experiment 1: the same training split across workers", b, e)
        for b, e in EXPERIMENT_1
    ] + [Setting("Experiment 2: speed-up over one worker", b, e) for b, e in EXPERIMENT_2]


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


def rerun_line(args: argparse.Namespace, source: str, threads: int) -> str:
    """The command that repeats this run exactly (``helpers.cli.rerun_command``)."""
    launcher = ["python", "-m", "helpers.reproduce", "--workers", *map(str, args.workers)]
    return rerun_command(launcher, args, source, threads)


def prepare(args: argparse.Namespace, settings: list[Setting]) -> tuple:
    """Everything checked before the first run, each failure a ValueError or HARDataError in one
    line: the cores, the thread counts, the settings, the --json path, then the data."""
    worlds = sorted(set(args.workers) | {1})
    threads = threads_for(args)
    check_settings(settings, worlds, HARSpec().n_rows("train"))  # before any download
    plans = plan_world_sizes(worlds, threads, oversubscribe=args.oversubscribe)
    check_plans(plans)
    if args.json:
        check_writable(args.json)  # before the runs, not after them
    data = load_har(args.data)
    check_settings(settings, worlds, len(data.y_train))  # the recordings have their own count
    return threads, plans, data


def run_setting(
    setting: Setting, plans: list[WorldPlan], threads: int, args: argparse.Namespace, source: str
) -> tuple[list, list[str]]:
    """Every world size of one setting that fits, and the reasons for those skipped."""
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
            data=source,
            show_progress=sys.stderr.isatty(),
        )
        runs.append(run_training(plan.world_size, config, threads, plan.oversubscribed))
    return runs, skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    try:
        threads, plans, data = prepare(args, settings)
    except (ValueError, HARDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    facts = machine_facts()
    print(data.banner)
    print(f"machine: {facts['cores']} cores, {facts['cpu']}; torch {facts['torch']}")
    print(f"threads: {threads} per worker ({facts['thread_policy']})")
    rerun = rerun_line(args, data.source, threads)
    print(f"rerun: {rerun}")
    records = []
    started = time.perf_counter()
    try:
        for setting in settings:
            runs, skipped = run_setting(setting, plans, threads, args, data.source)
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


if __name__ == "__main__":
    sys.exit(main())
