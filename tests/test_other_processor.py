"""`make test-other-processor` checks the notebooks again, on a simulated other processor.

The second pass is only worth its minutes if the simulation really changes the float rounding
of a training. This test trains the same short run in two fresh processes, natively and with the
environment the Makefile uses for the second pass, and fails if the checksums agree: then the
pass would no longer simulate anything (a torch or MKL release that ignores the variables, say).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"
TRAIN = """
import json
from helpers.training import TrainConfig, train_in_process
# the recordings, as the notebooks' second pass (HAR_DATA=recordings), named: never "auto"
run = train_in_process(TrainConfig(global_batch=256, epochs=1, data="recordings"), threads=1)
print(json.dumps(run.checksums[0]))
"""


def other_processor_env() -> dict[str, str]:
    """The variables of the Makefile's OTHER_PROCESSOR line, the second pass's environment."""
    line = re.search(r"^OTHER_PROCESSOR\s*:?=\s*(.+)$", MAKEFILE.read_text(), re.MULTILINE)
    assert line, "the Makefile defines OTHER_PROCESSOR for the second notebook pass"
    pairs = dict(item.split("=", 1) for item in line.group(1).split())
    assert pairs, "OTHER_PROCESSOR sets at least one variable"
    return pairs


def checksum(extra_env: dict[str, str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in other_processor_env()}
    out = subprocess.run(
        [sys.executable, "-c", TRAIN],
        env={**env, **extra_env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_makefile_runs_a_second_notebook_pass_under_the_other_processor():
    text = MAKEFILE.read_text()
    assert re.search(r"\$\(OTHER_PROCESSOR\)[^\n]*pytest[^\n]*\$\(NBVAL\)", text)


@pytest.mark.slow
@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the simulated processor selects x86 kernels (ATen's CPU capability, MKL's code path)",
)
def test_the_simulated_processor_changes_a_trainings_rounding():
    native, simulated = checksum({}), checksum(other_processor_env())
    assert native != simulated, (
        f"checksum {native!r} both natively and under {other_processor_env()}: the second "
        "notebook pass no longer simulates another processor"
    )
    assert math.isfinite(native) and math.isfinite(simulated)
