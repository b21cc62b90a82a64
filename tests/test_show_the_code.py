"""Show the code: the PyTorch calls the helpers stand for appear, written out, in the notebooks'
code cells, where students see them run (and write some of them in the exercises)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.notebook.tools import read

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CALLS = [
    "init_process_group",
    "DDP(",
    "DistributedSampler",
    "no_sync(",
    "register_comm_hook(",
    "fully_shard(",
    "dcp.save",
]
# the call that only notebook 04 (your own DDP script, written on another branch) shows
NOTEBOOK_04_CALLS = {"DistributedSampler"}


def code_cells(pattern: str = "[0-9][0-9]_*.ipynb") -> dict[str, list[str]]:
    """Every notebook's code cells' sources, by notebook file name."""
    return {
        path.name: [c.source for c in read(path).cells if c.cell_type == "code"]
        for path in sorted(NOTEBOOKS.glob(pattern))
    }


def notebooks_calling(call: str, cells: dict[str, list[str]]) -> list[str]:
    return [name for name, sources in cells.items() if any(call in s for s in sources)]


@pytest.mark.parametrize("call", CALLS)
def test_a_code_cell_shows_the_call(call: str):
    if call in NOTEBOOK_04_CALLS and not list(NOTEBOOKS.glob("04_*.ipynb")):
        pytest.skip(f"{call} is notebook 04's (your own DDP script), which has not landed yet")
    found = notebooks_calling(call, code_cells())
    assert found, f"no notebook's code cell calls {call}"


def test_the_grep_reads_code_cells_only():
    """The check above can fail: a call named only in prose, or in no cell, is not found."""
    cells = {"a.ipynb": ["x = 1", "model = DDP(net)"], "b.ipynb": ["print('no_sync')"]}
    assert notebooks_calling("DDP(", cells) == ["a.ipynb"]
    assert notebooks_calling("no_sync(", cells) == []
    prose = [c.source for c in read(NOTEBOOKS / "03_ddp_on_har.ipynb").cells
             if c.cell_type == "markdown"]  # fmt: skip
    assert any("SyncBatchNorm" in s for s in prose)  # named in 03's prose, not its code
    assert not notebooks_calling("SyncBatchNorm", code_cells("03_*.ipynb"))
