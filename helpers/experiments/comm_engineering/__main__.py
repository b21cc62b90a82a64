"""Notebook 07's longer measurements, which the notebook leaves out: more timing rounds, more seeds
for PowerSGD's accuracy. ``python -m helpers.experiments.comm_engineering --help``."""


from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

# --------------------------------------------------------------------------- memory and compression
from helpers.experiments.comm_engineering.compression import train_hooks
from helpers.experiments.comm_engineering.timing import speedup_table, speedup_text, time_variants
from helpers.experiments.comm_engineering.variants import (
    ACCUMULATION_VARIANTS,
    BUCKET_VARIANTS,
    HOOK_VARIANTS,
    ONE_BUCKET_MB,
    Variant,
)
from helpers.training import (
    TrainConfig,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timing rounds (default 7)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds of the accuracy runs"
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs of each accuracy run")
    parser.add_argument("--data", default=None, help="auto | uci | recordings | standin")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 1:
        parser.error("--repeats and --epochs must be at least 1")
    print(f"load average {os.getloadavg()}")
    timed, one = time_variants(
        BUCKET_VARIANTS + HOOK_VARIANTS + ACCUMULATION_VARIANTS,
        repeats=args.repeats,
        data=args.data,
    )
    print(speedup_text(speedup_table(timed, one)))
    print(f"load average {os.getloadavg()}")
    reference = Variant(f"one bucket (cap {ONE_BUCKET_MB} MiB)", bucket_cap_mb=ONE_BUCKET_MB)
    variants = (reference,) + HOOK_VARIANTS
    for seed in args.seeds:
        runs = train_hooks(variants, TrainConfig(epochs=args.epochs, seed=seed, data=args.data))
        line = ", ".join(
            f"{v.name} {r.accuracy:.2%}{'' if r.replicas_identical else ' (replicas differ!)'}"
            for v, r in zip(variants, runs, strict=True)
        )
        print(f"seed {seed}, {args.epochs} epochs at 256: {line}", flush=True)


if __name__ == "__main__":
    main()
