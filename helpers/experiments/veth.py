"""The all-reduce across two network namespaces joined by a veth pair (``helpers.dist.netns``),
unlimited and at 10 and 1 Gbit/s, with ``t = alpha + beta * bytes`` fitted to each (notebook 02's
model) and the reference MLP's gradient timed by each fit::

    sudo .venv/bin/python -m helpers.experiments.veth            # about a minute
"""

from __future__ import annotations

import argparse
import os
import sys

from helpers.dist.comm_model import fit_alpha_beta
from helpers.dist.netns import RATES, measure
from helpers.training.model import GRADIENT_BYTES


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.experiments.veth", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--repeats", type=int, default=7, help="timed calls per size (median)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("error: network namespaces need root: run it with sudo", file=sys.stderr)
        return 2
    sizes = [4096 * 4**k for k in range(7)]  # 4 KiB to 16 MiB
    results = {}
    for name, rate in RATES.items():
        print(f"  measuring across the veth pair, {name} ...", file=sys.stderr, flush=True)
        rows = measure(rate, sizes, args.repeats)
        fit = fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
        results[name] = fit
        print(
            f"{name:>10}: {fit}; the MLP's {GRADIENT_BYTES:,} gradient bytes all-reduced in "
            f"{fit.predict(GRADIENT_BYTES) * 1e3:.1f} ms"
        )
        for r in rows:
            print(f"{'':>12}{r['bytes']:>10,} bytes  {r['seconds'] * 1e3:8.3f} ms")
    return 0




if __name__ == "__main__":
    sys.exit(main())
