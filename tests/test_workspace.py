"""The notebooks' workspace: a module a cell writes there is imported by the notebook and by the
workers ``launch`` spawns, as the file reads when it is loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.dist.launch import launch
from helpers.notebook.workspace import MARKER, Workspace, remove_orphans

WORKER = """
import torch
import torch.distributed as dist


def total(rank, world_size):
    t = torch.tensor([float(rank + {add})])
    dist.all_reduce(t)
    return t.item()
"""


@pytest.fixture
def workspace():
    ws = Workspace("test-workspace")
    yield ws
    ws.remove()
    for name in ("ws_worker", "ws_other"):
        sys.modules.pop(name, None)


def test_spawned_workers_import_what_a_cell_wrote(workspace: Workspace):
    (workspace / "ws_worker.py").write_text(WORKER.format(add=1))
    module = workspace.load("ws_worker")
    assert launch(module.total, 2) == [3.0, 3.0]  # (0 + 1) + (1 + 1), on every rank


def test_load_reads_the_file_again_after_a_cell_rewrote_it(workspace: Workspace):
    (workspace / "ws_worker.py").write_text(WORKER.format(add=1))
    first = workspace.load("ws_worker")
    (workspace / "ws_worker.py").write_text(WORKER.format(add=10) + "\nSECOND = True\n")
    second = workspace.load("ws_worker")
    assert second is first and getattr(second, "SECOND", False)


def test_a_missing_or_foreign_module_is_refused_with_what_to_do(workspace: Workspace):
    with pytest.raises(FileNotFoundError, match="run the cell that writes it"):
        workspace.load("ws_other")
    (workspace / "json.py").write_text("X = 1\n")  # a name taken by an imported module
    with pytest.raises(ValueError, match="give the file another name"):
        workspace.load("json")


def test_remove_deletes_the_folder_and_takes_it_off_the_path():
    ws = Workspace("test-workspace")
    assert str(ws.path) in sys.path and ws.path.is_dir()
    ws.remove()
    assert str(ws.path) not in sys.path and not ws.path.exists()


def test_a_killed_kernels_workspace_is_removed_by_the_next_one_and_a_live_ones_kept(tmp_path):
    """nbval ends its kernel with SIGKILL, so no exit handler runs: the next workspace sweeps."""
    made = subprocess.run(
        [sys.executable, "-c", "import os, tempfile\n"
         "from helpers.notebook.workspace import Workspace\n"
         f"tempfile.tempdir = {str(tmp_path)!r}\n"
         "print(Workspace('killed').path, flush=True)\n"
         "os.kill(os.getpid(), 9)"],
        capture_output=True, text=True,
    )
    killed = tmp_path / made.stdout.strip().rsplit("/", 1)[-1]
    assert made.returncode == -9 and (killed / MARKER).exists()
    alive = tmp_path / "alive"
    alive.mkdir()
    live = Workspace("test-workspace")  # this process's
    (alive / MARKER).write_text((live / MARKER).read_text())
    live.remove()
    foreign = tmp_path / "not-a-workspace"
    foreign.mkdir()
    assert remove_orphans(tmp_path) == [killed]
    assert alive.is_dir() and foreign.is_dir() and not killed.exists()
