"""The browser tests' own machinery, without a browser (so `make test` runs it): what they
compare of a notebook's outputs, and how they find and stop the processes a server leaves."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import nbformat
import pytest
from lab_driver import LabServer, alive, compared_outputs, descendants, errors, nbval_compares

SANITIZE = Path(__file__).resolve().parents[2] / "notebooks" / "sanitize.cfg"
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def test_compared_outputs_are_what_nbval_compares():
    """Streams of one name joined, images left out, sanitised as notebooks/sanitize.cfg says."""
    from lab_driver import sanitize_patterns

    cell = nbformat.v4.new_code_cell(
        "x",
        outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="1 worker(s): done\n"),
            nbformat.v4.new_output("stream", name="stdout", text="2 worker(s): done\n"),
            nbformat.v4.new_output(
                "display_data",
                data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure at 0x7f3a2b>"},
            ),
        ],
    )
    assert compared_outputs(cell, sanitize_patterns(SANITIZE)) == {
        "stdout": ["1 worker(s): done\n2 worker(s): done\n"],
        "text/plain": ["<Figure at 0xADDRESS>"],
    }


def test_ignored_and_skipped_cells_are_not_compared():
    assert nbval_compares(nbformat.v4.new_code_cell("print(1)"))
    assert not nbval_compares(nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)"))
    assert not nbval_compares(nbformat.v4.new_code_cell("# NBVAL_SKIP\nprint(1)"))
    tagged = nbformat.v4.new_code_cell("print(1)", metadata={"tags": ["nbval-ignore-output"]})
    assert not nbval_compares(tagged)


def test_errors_lists_every_error_output_with_its_cell():
    error = nbformat.v4.new_output("error", ename="NameError", evalue="x", traceback=[])
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("text"),
            nbformat.v4.new_code_cell("1"),
            nbformat.v4.new_code_cell("x", outputs=[error]),
        ]
    )
    assert errors(nb) == [(2, "NameError: x")]


@needs_proc
def test_stop_kills_a_worker_whose_parent_died(tmp_path):
    """A kernel killed outright leaves its workers to init, outside the server's process tree;
    they keep the session, and that is how `stop` still finds them."""
    server = LabServer(tmp_path, tmp_path, {})
    # stands in for the server: a shell (its session's leader) with a child, then killed
    server.proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True, stdin=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while len(descendants(server.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    children = descendants(server.proc.pid)
    assert len(children) == 2
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    assert descendants(server.proc.pid) == [] and all(alive(c) for c in children)
    killed = server.stop()
    assert {p.pid for p in killed} == {c.pid for c in children}
    deadline = time.monotonic() + 10
    while any(alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(c) for c in children)
