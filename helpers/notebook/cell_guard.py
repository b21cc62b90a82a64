"""After every cell of a notebook, check that it left no process running and no port open.

Notebook 11 makes runs fail on purpose; a failure that left a worker, a torchrun agent or a
store behind would go unnoticed until it held a port or a core in a later cell. ``watch_cells``
registers an IPython ``post_run_cell`` callback that compares what the kernel's descendants run
and listen on after each cell with what they did when it was called
(``helpers.experiments.leftovers``), and records every cell that left something. A callback
cannot fail its cell (IPython prints its exception and goes on), so the guard prints what it
found and keeps it in ``found``, and the notebook asserts at its end that nothing was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from typing import Any

from helpers.experiments import leftovers


@dataclass
class CellGuard:
    """What ``watch_cells`` checks against, and what it has found so far."""

    shell: Any  # the IPython shell whose cells are watched
    before: leftovers.Snapshot
    wait: float = 5.0  # seconds a process or socket may take to go after its cell
    cells: int = 0  # cells checked
    found: list[dict] = field(default_factory=list)  # one entry per cell that left something

    def __call__(self, result: Any) -> None:
        """IPython's ``post_run_cell`` callback: check the cell that just ran."""
        self.cells += 1
        left = leftovers.left_behind(self.before, wait=self.wait)
        if any(left.values()):
            number = getattr(result, "execution_count", None)
            self.found.append({"cell": number, **left})
            print(f"cell [{number}] left behind: {left}")

    def stop(self) -> None:
        """Stop watching (what was found stays in ``found``)."""
        self.shell.events.unregister("post_run_cell", self)


def watch_cells(shell: Any = None, wait: float = 5.0) -> CellGuard:
    """Check every cell run from now on in ``shell`` (default: the running IPython's).

    multiprocessing's resource tracker, which the first spawned worker would start and which
    lives as long as the kernel by design, is started first, so that it is part of the
    baseline rather than something a cell left behind."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("watch_cells needs IPython: run it in a notebook or IPython")
    resource_tracker.ensure_running()
    guard = CellGuard(shell, leftovers.snapshot(), wait)
    shell.events.register("post_run_cell", guard)
    return guard
