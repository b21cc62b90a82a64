"""The committed notebooks as editions: the full edition in normal form with every solution run
and checked by its self-check and its grader check, and the student edition, which gives nothing
away (helpers/notebook/rules.py) and runs up to its first exercise."""

from __future__ import annotations

from pathlib import Path

import pytest
from nbclient import NotebookClient

from helpers.notebook.rules import student_edition_problems
from helpers.notebook.tools import (
    PLACEHOLDER,
    exercises,
    grader_points,
    is_grader,
    is_normal,
    read,
    student_edition,
    student_solution,
)

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# The cheapest notebook (NumPy only, seconds): the student edition is run up to its first exercise.
STUDENT_RUN = ["01_allreduce_by_hand.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_in_normal_form(path: Path):
    assert is_normal(path), f"{path.name} is not in normal form: run `make normalise`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_solution_ran_and_passed_its_asserts_in_the_full_edition(path: Path):
    """What the student edition removes was run, top to bottom, in the committed full edition,
    and its asserts held there (nbval re-runs it in `make test`)."""
    nb = read(path)
    found = exercises(nb)
    assert found, "every notebook ends with exercises that have a solution"
    for ex in found:
        graded = [i for i in (ex.check, ex.grader) if i is not None]
        cells = [nb.cells[i] for i in (*ex.solution, *graded)]
        assert any("assert " in c.source for c in cells), f"cell {ex.solution[0]}: no asserts"
        for cell in cells:
            assert cell.execution_count is not None, f"cell {ex.solution[0]} was not run"
            assert all(o.output_type != "error" for o in cell.outputs), "a solution raised"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_solution_is_collapsed_and_graded_by_a_check_cell_that_asserts(path: Path):
    """The check cell stays in the student edition: without one, a submission could only be
    checked for running without error (COURSE.md, "Graded assignments")."""
    nb = read(path)
    for ex in exercises(nb):
        for i in ex.solution:  # collapsed, so that a reader meets the question before the answer
            assert nb.cells[i].metadata.get("jupyter", {}).get("source_hidden"), f"cell {i}"
        assert ex.check is not None, f"cell {ex.solution[0]}: the exercise has no `# Check` cell"
        assert "assert " in nb.cells[ex.check].source, f"cell {ex.check}: a check that asserts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_grader_check_with_its_points(path: Path):
    """`make grade` scores an exercise by its `# Grader: N points` cell (COURSE.md, "Grading")."""
    nb = read(path)
    for ex in exercises(nb):
        assert ex.grader is not None, f"cell {ex.solution[0]}: no `# Grader: N points` cell"
        assert grader_points(nb.cells[ex.grader])[0] >= 1
        assert "assert " in nb.cells[ex.grader].source, f"cell {ex.grader}: it must assert"
    stray = [i for i, c in enumerate(nb.cells) if is_grader(c)]
    assert stray == [ex.grader for ex in exercises(nb)], "a grader cell follows its exercise"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_edition_gives_no_answer_away(path: Path):
    """No solution, no grader check, no self-check that computes or states the answer and no
    import that only an exercise uses are left in the student edition (the rules are in
    helpers/notebook/rules.py)."""
    nb = read(path)
    student = student_edition(nb)
    assert not any(is_grader(c) for c in student.cells)
    assert student_edition_problems(nb) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_edition_holds_no_solution_and_no_output(path: Path):
    nb = read(path)
    student = student_edition(nb)
    removed = [nb.cells[i].source for ex in exercises(nb) for i in ex.solution]
    sources = [c.source for c in student.cells]
    # each solution becomes a placeholder, or its skeleton (its TODO lines blanked)
    left = [student_solution(nb.cells[ex.solution[0]].source) for ex in exercises(nb)]
    assert all(s == PLACEHOLDER or s in sources for s in left)
    assert sources.count(PLACEHOLDER) == left.count(PLACEHOLDER)
    assert not any(r in sources for r in removed)
    assert not any("*Solution*" in s or s.startswith("# Grader") for s in sources)
    assert all(not c.get("outputs") for c in student.cells)


@pytest.mark.parametrize("name", STUDENT_RUN)
def test_student_edition_runs_to_the_first_exercise(name: str, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("HAR_DATA", "standin")  # as `make test`: no network, the 2-core plan
    monkeypatch.setenv("DDP_COURSE_CORES", "2")
    student = student_edition(read(Path(__file__).parent.parent / "notebooks" / name))
    first = next(i for i, c in enumerate(student.cells) if c.source == PLACEHOLDER)
    student.cells = student.cells[:first]
    client = NotebookClient(student, timeout=120, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on an error
    code = [c for c in student.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
