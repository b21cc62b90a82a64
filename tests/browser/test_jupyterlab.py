"""The notebooks as a student runs them: in JupyterLab, in a real (headless) Chromium, through
the menus, the toolbar and the keyboard. nbval runs the same cells through a kernel alone; this
checks what it cannot see: that the UI runs them, spawns DDP workers from its kernel, stops them
from its stop button, shows figures and tables whole, and that the student edition's checks fail
where they should. Run by `make test-browser` (which sets DDP_COURSE_BROWSER); skipped otherwise.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from lab_driver import (
    CELLS,
    alive,
    compared_outputs,
    errors,
    menu,
    nbval_compares,
    open_notebook,
    prompts,
    sanitize_patterns,
    save,
    select_cell,
    spawned_workers,
    toolbar,
    wait_for_run,
)

from helpers.notebook.tools import KERNELSPEC, PLACEHOLDER, exercises, is_check

pytestmark = pytest.mark.skipif(
    not os.environ.get("DDP_COURSE_BROWSER"),
    reason="JupyterLab in headless Chromium: run `make test-browser`",
)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
SCREENSHOTS = REPO / "results" / "browser"  # kept by the course's workflow; never committed
NB01 = "01_allreduce_by_hand.ipynb"
NB03 = "03_ddp_on_har.ipynb"
SCRATCH = "interrupt_scratch.ipynb"
# Rendered narrower than this, a figure's axis labels and legend are too small to read at 100 %.
MIN_FIGURE_WIDTH = 400
# Drawn at less than half its size, a figure's text is too small to read (JupyterLab shrinks an
# image to the output area's width).
MIN_FIGURE_SCALE = 0.5


@contextlib.contextmanager
def notebook_page(browser, lab, notebook: str):
    """A page with ``notebook`` open and its kernel idle; on an error, a screenshot of the page
    in results/browser/ and the end of the server's log (with the kernel's and the workers'
    stderr) printed; at the end, the page closed and the notebook's kernel shut down."""
    page = browser.new_page()
    try:
        open_notebook(page, lab, notebook)
        yield page
    except BaseException:
        # the error in flight is the one to report, whatever else fails now
        with contextlib.suppress(Exception):
            page.screenshot(path=SCREENSHOTS / f"failed-{Path(notebook).stem}.png")
        with contextlib.suppress(Exception):
            page.close()
        with contextlib.suppress(Exception):
            lab.shut_down_notebook(notebook)
        print(f"jupyter lab's log, last lines:\n{lab.tail()}")
        raise
    page.close()
    lab.shut_down_notebook(notebook)


def mismatches(ran, committed, upto: int | None = None) -> list[str]:
    """The cells (up to ``upto``) whose outputs differ from the committed ones where nbval
    compares them, each with both versions."""
    patterns = sanitize_patterns(NOTEBOOKS / "sanitize.cfg")
    found = []
    for index, cell in enumerate(committed.cells[: None if upto is None else upto + 1]):
        if cell.cell_type != "code" or not nbval_compares(cell):
            continue
        want, got = compared_outputs(cell, patterns), compared_outputs(ran.cells[index], patterns)
        if want != got:
            found.append(f"cell {index}:\n  committed {want}\n  in the browser {got}")
    return found


def unfinished(page) -> list[str]:
    """The prompts of code cells that show neither a number nor nothing (collapsed): ``[*]:``
    (running or waiting) or ``[ ]:`` (not run)."""
    return [p for p in prompts(page) if p and not re.fullmatch(r"\[\d+\]:", p)]


# --------------------------------------------------------------------------- notebook 01


@pytest.fixture(scope="module")
def run_01(lab, browser, lab_root):
    """Notebook 01 run from the UI: Edit > Clear Outputs of All Cells, Run > Run All Cells,
    saved from the toolbar; the page stays open for the screenshots."""
    with notebook_page(browser, lab, NB01) as page:
        menu(page, "Edit", "editmenu:clear-all")
        assert not any(re.search(r"\d", p) for p in prompts(page)), "outputs not cleared"
        menu(page, "Run", "runmenu:run-all")
        wait_for_run(page, timeout_s=180)
        yield page, save(page, lab_root / NB01)


def test_notebook_01_runs_from_the_menu_and_shows_the_committed_outputs(run_01):
    page, saved = run_01
    committed = nbformat.read(NOTEBOOKS / NB01, as_version=4)
    assert [c.source for c in saved.cells] == [c.source for c in committed.cells]
    assert unfinished(page) == [], "every code cell shows its execution count"
    assert errors(saved) == []
    not_run = [
        i for i, c in enumerate(saved.cells) if c.cell_type == "code" and not c.execution_count
    ]
    assert not_run == [], f"cells not run by Run All Cells: {not_run}"
    assert any(c.cell_type == "code" and nbval_compares(c) for c in committed.cells)
    assert mismatches(saved, committed) == []


def pixel_spread(path: Path) -> float:
    """The standard deviation of the screenshot's grey levels (0 for a blank one)."""
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        return ImageStat.Stat(image.convert("L")).stddev[0]


def test_figures_and_tables_of_01_are_whole_and_legible(run_01):
    """Every figure and table of notebook 01 as rendered at the default zoom on a 1280-pixel
    screen: not blank, within the page and its output area, figures wide enough to read."""
    page, saved = run_01
    cells = page.locator(CELLS)
    assert cells.count() == len(saved.cells), "JupyterLab no longer attaches every cell"
    page_width = page.evaluate("() => document.documentElement.clientWidth")
    shown = []
    for index, cell in enumerate(saved.cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                shown.append((index, "figure", "img"))
            elif "<table" in data.get("text/html", ""):
                shown.append((index, "table", "table"))
    assert {kind for _, kind, _ in shown} == {"figure", "table"}
    for index, kind, tag in shown:
        element = cells.nth(index).locator(f".jp-OutputArea-output {tag}").first
        element.scroll_into_view_if_needed()
        shot = SCREENSHOTS / f"01-cell{index:02d}-{kind}.png"
        element.screenshot(path=shot)
        box = element.bounding_box()
        where = f"cell {index}'s {kind} ({shot.name})"
        assert box["x"] >= 0 and box["x"] + box["width"] <= page_width, f"{where}: {box}"
        area = element.evaluate(
            "e => { const a = e.closest('.jp-OutputArea-output');"
            " return [a.scrollWidth, a.clientWidth]; }"
        )
        assert area[0] <= area[1], f"{where}: cut off by its output area (width {area})"
        assert pixel_spread(shot) > 10, f"{where}: blank"
        if kind == "figure":
            natural = element.evaluate("e => e.naturalWidth")
            assert box["width"] >= MIN_FIGURE_WIDTH, f"{where}: {box['width']:.0f} px wide"
            assert box["width"] >= MIN_FIGURE_SCALE * natural, f"{where}: shrunk from {natural}"


# --------------------------------------------------------------------------- notebook 03


def test_first_ddp_run_of_03_from_the_browser(lab, browser, lab_root):
    """The cells of notebook 03 up to its first training (on 1, then 2 workers that the kernel
    spawns), run with Run > Run All Above Selected Cell, as nbval would see them."""
    committed = nbformat.read(NOTEBOOKS / NB03, as_version=4)
    training = next(
        i
        for i, c in enumerate(committed.cells)
        if c.cell_type == "code" and "run_training(" in c.source
    )
    assert training + 1 < len(committed.cells)
    most_workers = 0
    with notebook_page(browser, lab, NB03) as page:
        kernel = lab.kernel_of(NB03)

        def count_workers() -> None:
            nonlocal most_workers
            most_workers = max(most_workers, len(spawned_workers(kernel)))

        menu(page, "Edit", "editmenu:clear-all")
        select_cell(page, training + 1)
        menu(page, "Run", "notebook:run-all-above")
        wait_for_run(page, timeout_s=600, while_waiting=count_workers)
        saved = save(page, lab_root / NB03)
        assert errors(saved) == []
        ran = [i for i, c in enumerate(saved.cells) if c.cell_type == "code" and c.execution_count]
        code = [i for i, c in enumerate(committed.cells) if c.cell_type == "code"]
        assert ran == [i for i in code if i <= training]
        assert mismatches(saved, committed, upto=training) == []
        # experiment 1's largest world size, run oversubscribed where the cores are fewer
        [sizes] = re.findall(r"plan_world_sizes\(\[([\d, ]+)\]", committed_source(committed))
        largest = max(int(n) for n in sizes.split(","))
        assert most_workers == largest, f"at most {most_workers} workers seen under the kernel"
        assert spawned_workers(kernel) == [], "workers left after the training"


# --------------------------------------------------------------------------- interrupt


def test_stop_button_interrupts_a_training_and_leaves_no_worker(lab, browser, lab_root):
    """A training far longer than the test, on 2 workers, stopped with the toolbar's stop
    button once its first epoch is done: KeyboardInterrupt in the cell, no worker left under
    the kernel, and the next cell runs in the same kernel."""
    sources = [
        "from helpers.training import TrainConfig, run_training",
        "# far longer than the test waits: it is interrupted from the toolbar\n"
        "run_training(2, TrainConfig(epochs=1000, show_progress=True))",
        'print("after the interrupt:", 6 * 7)',
    ]
    scratch = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s) for s in sources], metadata={"kernelspec": KERNELSPEC}
    )
    nbformat.write(scratch, lab_root / SCRATCH)
    with notebook_page(browser, lab, SCRATCH) as page:
        kernel = lab.kernel_of(SCRATCH)
        cells = page.locator(CELLS)
        select_cell(page, 0)
        page.keyboard.press("Shift+Enter")  # the import
        page.keyboard.press("Shift+Enter")  # the training
        # rank 0 reports each finished epoch on stderr, which the kernel shows in the cell
        progress = cells.nth(1).locator(".jp-OutputArea-output", has_text=re.compile(r"epoch \d"))
        progress.first.wait_for(timeout=400_000)  # about 20 s on 2 idle cores
        workers = spawned_workers(kernel)
        assert len(workers) == 2, f"the kernel's workers while training: {workers}"

        toolbar(page, "notebook:interrupt-kernel")
        wait_for_run(page, timeout_s=60)
        assert [w.pid for w in workers if alive(w)] == [], "workers left after the interrupt"
        assert spawned_workers(kernel) == [], "other workers under the kernel"
        assert alive(kernel), "the interrupt ended the kernel"
        cells.nth(1).locator(".jp-OutputArea-output", has_text="KeyboardInterrupt").wait_for()

        select_cell(page, 2)
        page.keyboard.press("Shift+Enter")
        cells.nth(2).locator(".jp-OutputArea-output", has_text="after the interrupt: 42").wait_for()
        wait_for_run(page, timeout_s=60)
        saved = save(page, lab_root / SCRATCH)
    assert errors(saved) == [(1, "KeyboardInterrupt: ")]
    assert compared_outputs(saved.cells[2], []) == {"stdout": ["after the interrupt: 42\n"]}


# --------------------------------------------------------------------------- student edition


@pytest.fixture(scope="module")
def student_01(lab, browser, lab_root):
    """The student edition of notebook 01, as `make student` writes it, run with Run All Cells;
    (the saved notebook, the text of each cell's outputs as shown)."""
    out = lab_root / "student"
    build = [sys.executable, "-m", "helpers.notebook.tools", "student", "--out", str(out)]
    subprocess.run([*build, str(NOTEBOOKS / NB01)], cwd=REPO, check=True, capture_output=True)
    with notebook_page(browser, lab, f"student/{NB01}") as page:
        menu(page, "Run", "runmenu:run-all")
        wait_for_run(page, timeout_s=180)
        saved = save(page, out / NB01)
        cells = page.locator(CELLS)
        shown = [
            "\n".join(cells.nth(i).locator(".jp-OutputArea-output").all_inner_texts())
            for i in range(cells.count())
        ]
        yield saved, shown


def test_student_edition_fails_at_the_first_check_naming_what_is_missing(student_01):
    saved, shown = student_01
    full = nbformat.read(NOTEBOOKS / NB01, as_version=4)
    placeholder = next(i for i, c in enumerate(saved.cells) if c.source == PLACEHOLDER)
    failed = errors(saved)
    assert failed, "a check ran after an exercise left undone, and passed"
    index, message = failed[0]
    assert index == placeholder + 1 and is_check(saved.cells[index]), f"cell {index}: {message}"
    before = [c for c in saved.cells[:index] if c.cell_type == "code"]
    assert all(c.execution_count for c in before), "a cell before the first exercise did not run"
    # the names the removed solution defines, one of which the check must say is missing
    solution = "\n".join(full.cells[i].source for i in exercises(full)[0].solution)
    defined = {
        target.id
        for node in ast.walk(ast.parse(solution))
        if isinstance(node, ast.Assign)
        for target in ast.walk(node)
        if isinstance(target, ast.Name)
    }
    named = set(re.findall(r"\w+", message)) & defined
    assert named, f"the error ({message}) names none of the solution's {sorted(defined)}"
    assert message.split(": ", 1)[1] in shown[index], "the error is not shown in the browser"


def test_student_edition_check_says_what_to_do(student_01):
    saved, _ = student_01
    index, message = errors(saved)[0]
    assert not re.fullmatch(r"NameError: name '\w+' is not defined", message), (
        f"cell {index}: {message}"
    )


def committed_source(nb) -> str:  # noqa: ANN001
    """Every code cell's source, one text."""
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")
