"""A folder for code that a notebook's cells write and worker processes run.

Workers are fresh Python processes (``spawn``, or torchrun's): they cannot see a function defined
in a notebook, only one they can import. So a cell writes a module into the workspace, with
IPython's ``%%writefile {workspace}/name.py``, and the notebook imports it with
``workspace.load("name")``. The folder is on ``sys.path``, which ``multiprocessing``'s spawned
processes start with as well, so ``helpers.dist.launch.launch(name.worker, 2)`` finds it in every
worker; a script in it runs under torchrun as any script does. The folder is temporary: a new one
for every kernel, removed when the kernel exits. A kernel killed outright (nbval ends its kernel
with SIGKILL; so does "Restart kernel" on a hung one) cannot remove it: the next workspace made on
the machine removes every folder whose kernel has gone, which a marker file in it records.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from helpers.dist.cpu_time import process_stat

MARKER = ".ddp-course-workspace"  # in each folder: its kernel's process id and start time


def _identity(pid: int) -> str:
    """``pid`` and, on Linux, its start time: a later process given the same id differs."""
    fields = process_stat(pid)
    started = fields[19] if fields else ""  # no /proc (macOS): the id alone
    return f"{pid} {started}"


def _gone(identity: str) -> bool:
    pid = int(identity.split()[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # another user's live process
    return _identity(pid) != identity.strip()


def remove_orphans(root: Path | None = None) -> list[Path]:
    """Remove the workspaces under ``root`` (the temporary folder) whose kernel has gone."""
    removed = []
    for marker in Path(root or tempfile.gettempdir()).glob(f"*/{MARKER}"):
        try:
            identity = marker.read_text()
            if not _gone(identity):
                continue
        except (OSError, ValueError, IndexError):
            continue  # being written, or not ours to judge
        shutil.rmtree(marker.parent, ignore_errors=True)
        removed.append(marker.parent)
    return removed


class Workspace:
    """A temporary folder on ``sys.path`` (``str(workspace)`` is its path, for ``%%writefile``)."""

    def __init__(self, prefix: str = "workspace") -> None:
        remove_orphans()
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        (self.path / MARKER).write_text(_identity(os.getpid()))
        sys.path.insert(0, str(self.path))
        atexit.register(self.remove)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def load(self, name: str) -> ModuleType:
        """The module ``name`` as its file reads now: imported, or re-imported if a cell has
        rewritten it since (the workers, being new processes, always read the file afresh)."""
        if not (self.path / f"{name}.py").exists():
            raise FileNotFoundError(
                f"no {name}.py in the workspace: run the cell that writes it "
                f"(%%writefile {{workspace}}/{name}.py) first"
            )
        shutil.rmtree(self.path / "__pycache__", ignore_errors=True)  # no stale byte code
        importlib.invalidate_caches()
        module = sys.modules.get(name)
        if module is None:
            return importlib.import_module(name)
        if Path(getattr(module, "__file__", None) or "").parent != self.path:
            raise ValueError(
                f"a module named {name} is already imported from elsewhere "
                f"({getattr(module, '__file__', None)}): give the file another name"
            )
        return importlib.reload(module)

    def remove(self) -> None:
        """Delete the folder and take it off ``sys.path`` (done when the kernel exits)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if str(self.path) in sys.path:
            sys.path.remove(str(self.path))
