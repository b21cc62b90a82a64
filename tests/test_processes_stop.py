"""``run_together`` past its deadline stops torchrun's workers too: torchrun starts each worker in a
session of its own, out of reach of a signal to the agent's process group."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers.dist.processes import TimedOut, run_together

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


def test_a_failed_command_ends_the_others_after_the_grace(tmp_path: Path):
    """A node that died before its peers could reach it must not leave them waiting out their
    store timeouts (two minutes, then a retry): the failure ends the run, with everyone's output."""
    up = tmp_path / "up"
    waits = [sys.executable, "-c", "import sys, time; print('waiting', flush=True); "
             "open(sys.argv[1], 'w').close(); time.sleep(600)", str(up)]  # fmt: skip
    fails = [sys.executable, "-c", "import os, sys, time\n"
             "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
             "print('bad input'); sys.exit(3)", str(up)]  # fmt: skip
    done = run_together([waits, fails], timeout=300, failed_grace=1)
    assert done[1].returncode == 3 and done[1].stdout == "bad input\n"
    assert done[0].returncode in (-signal.SIGTERM, -signal.SIGKILL)
    assert done[0].stdout == "waiting\n"


def test_past_the_deadline_the_error_carries_what_each_command_printed():
    waits = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"]
    with pytest.raises(TimedOut) as stopped:
        run_together([waits], timeout=2)  # a Python start takes well under a second
    assert [f.stdout for f in stopped.value.finished] == ["started\n"]
