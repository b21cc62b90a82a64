"""``run_together`` past its deadline stops torchrun's workers too: torchrun starts each worker in a
session of its own, out of reach of a signal to the agent's process group."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers.dist.processes import run_together

HANGS = """
import os
import sys
import time

open(os.path.join(sys.argv[1], f"worker-{os.getpid()}"), "w").close()
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, about to be reaped by init, does not)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc: Linux only")
def test_workers_of_a_torchrun_past_its_deadline_are_stopped(tmp_path: Path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(script), str(tmp_path)]  # fmt: skip
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run_together([torchrun], timeout=20)
    assert time.monotonic() - started < 60
    pids = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
    assert len(pids) == 2, "the workers did not start within the deadline"
    alive = [pid for pid in pids if _running(pid)]
    for pid in alive:  # leave nothing behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived the deadline"
