"""Timing the notebooks for the instructor's guide: a core count the machine cannot play is
refused, and a notebook is timed without touching the committed file."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.dist.cores import machine_cores
from helpers.notebook import timings


def test_more_cores_than_the_machine_has_are_refused_with_what_to_do(capsys):
    too_many = machine_cores() + 1
    assert timings.main(["--cores", str(too_many), "x.ipynb"]) == 2
    error = capsys.readouterr().err
    assert f"this machine has {machine_cores()} core(s)" in error
    assert f"on a machine with at least {too_many}" in error


@pytest.mark.slow
def test_a_notebook_is_timed_in_a_copy_with_the_cores_it_plans_for(tmp_path: Path):
    path = tmp_path / "00_tiny.ipynb"
    cells = [nbformat.v4.new_code_cell("import os\nassert os.environ['DDP_COURSE_CORES'] == '1'")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    before = path.read_bytes()
    timing = timings.time_notebook(path, 1, "standin", tmp_path / "out")
    assert timing.ok and timing.seconds > 0
    assert path.read_bytes() == before  # executed into out/, not in place
    assert (tmp_path / "out" / path.name).exists()
    failing = tmp_path / "00_fails.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")]), failing)
    bad = timings.time_notebook(failing, 1, "standin", tmp_path / "out")
    assert not bad.ok
    assert "FAILED" in timings.markdown_rows([timing, bad]).splitlines()[1]


@pytest.mark.parametrize("cores", [0, -1])
def test_no_cores_is_refused(cores: int):
    with pytest.raises(ValueError, match="core"):
        timings.check_cores(cores)


@pytest.mark.slow
def test_peak_memory_is_summed_over_the_kernel_and_the_processes_it_starts(tmp_path: Path):
    """A notebook whose cell starts a child holding 200 MB: the peak counts the child's too."""
    if not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("peak memory is read from /proc (Linux)")
    hold = (
        "import subprocess, sys\n"
        "child = 'b = bytearray(200 * 2**20); import time; time.sleep(2)'\n"
        "subprocess.run([sys.executable, '-c', child], check=True)"
    )
    path = tmp_path / "00_memory.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(hold)]), path)
    timing = timings.time_notebook(path, 1, "standin", tmp_path / "out")
    assert timing.ok
    assert timing.peak_rss >= timing.peak_pss > 200 * 2**20, "the child's 200 MB are in the sum"
    assert "GiB PSS" in timings.markdown_rows([timing])
