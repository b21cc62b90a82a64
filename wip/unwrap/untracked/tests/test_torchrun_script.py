"""``run_torchrun(script=...)``: a plain script under torchrun, as notebook 10 runs the scripts its
cells write; and a script that hangs is stopped, workers included, instead of hanging the caller."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers.dist.cluster import run_torchrun, shown
from helpers.dist.loopback import loopback_interface

SCRIPT = """
import os
import sys

import torch
import torch.distributed as dist

from helpers.dist.loopback import loopback_store

rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
port = int(os.environ["MASTER_PORT"])
store = (loopback_store(world_size, 60, port=port) if rank == 0 else
         dist.TCPStore("127.0.0.1", port, world_size, is_master=False))  # fmt: skip
dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"sum {t.item():g} args {sys.argv[1:]}")
dist.barrier()
dist.destroy_process_group()
"""

HANGS = """
import os
import time

open(os.path.join({folder!r}, f"worker-{{os.getpid()}}"), "w").close()
time.sleep(600)
"""

LOOPBACK = {"GLOO_SOCKET_IFNAME": loopback_interface()}


def test_a_script_runs_under_torchrun_in_its_folder(tmp_path: Path):
    (tmp_path / "plain.py").write_text(SCRIPT)
    run = run_torchrun(["--x", "1"], nproc_per_node=2, script="plain.py", cwd=tmp_path,
                       env=LOOPBACK)  # fmt: skip
    assert run.returncodes == [0], run.stderr[0][-2000:]
    assert run.stdout.strip() == "sum 3 args ['--x', '1']"  # 1 + 2, from rank 0 only
    assert run.report is None
    assert shown(run.commands[0]).endswith("plain.py --x 1")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc: Linux only")
def test_a_script_that_hangs_is_stopped_with_its_workers(tmp_path: Path):
    (tmp_path / "hangs.py").write_text(HANGS.format(folder=str(tmp_path)))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run_torchrun([], nproc_per_node=2, script="hangs.py", cwd=tmp_path, timeout=20)
    assert time.monotonic() - started < 60
    pids = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
    assert len(pids) == 2, "the workers did not start within the timeout"
    alive = [pid for pid in pids if _running(pid)]
    for pid in alive:  # leave nothing behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived the timeout"


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, about to be reaped by init, does not)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
