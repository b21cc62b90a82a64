"""helpers.notebook.tools on small notebooks built here: the normal form, the student edition and
the grading edition."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from helpers.notebook.tools import (
    KERNELSPEC,
    LANGUAGE_INFO,
    PLACEHOLDER,
    ROLE,
    Exercise,
    exercises,
    grader_points,
    grading_edition,
    is_normal,
    main,
    normalise,
    skeleton,
    student_edition,
    to_text,
)

TIMESTAMPS = {"iopub.execute_input": "2026-11-30T09:57:50.298647Z", "shell.execute_reply": "x"}
HIDDEN = {"jupyter": {"source_hidden": True}}


def ran(source: str, count: int, text: str = "out\n", **metadata) -> nbformat.NotebookNode:
    cell = new_code_cell(source, execution_count=count, metadata=metadata)
    cell.outputs = [new_output("stream", name="stdout", text=text)]
    return cell


def course_notebook() -> nbformat.NotebookNode:
    """Two exercises: one solved in a cell after a *Solution* note with a # Check cell and a
    # Grader cell after it, one solved in two collapsed cells without either."""
    nb = new_notebook(
        cells=[
            new_markdown_cell("# 09 · A notebook"),
            ran("x = 1", 1, execution=TIMESTAMPS),
            new_markdown_cell(
                "## Exercises\n\n**1. Double it.** Set `y` to twice `x`.\n\n"
                "*Solution* (expand the cell): `y = 2 * x`,\nsince doubling is that."
            ),
            ran("y = 2 * x\nprint(y)", 2, "2\n", **HIDDEN),
            ran("# Check your answer\nassert y == 2", 3, ""),
            ran("# Grader: 2 points; written answer 1 point, by hand\nassert y == 2 * x", 4, ""),
            new_markdown_cell("**2. Triple it.**\n\n*Solution*: in two steps."),
            ran("z = 3 * x", 5, "", **HIDDEN),
            ran("assert z == 3\nprint(z)", 6, "3\n", **HIDDEN),
            new_markdown_cell("The end."),
        ],
        metadata={
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {**LANGUAGE_INFO, "version": "3.11.7"},
            "vscode": {"interpreter": {"hash": "abc"}},
            "title": "A notebook",
        },
    )
    return nb


def test_normal_form_drops_what_a_run_writes_and_keeps_what_an_author_writes():
    nb = course_notebook()
    normal = normalise(nb)
    assert normal.metadata == {
        "kernelspec": KERNELSPEC,
        "language_info": LANGUAGE_INFO,
        "title": "A notebook",
    }
    assert "execution" not in normal.cells[1].metadata
    assert normal.cells[3].metadata == HIDDEN
    for before, after in zip(nb.cells, normal.cells, strict=True):
        assert after.source == before.source
        assert after.get("outputs") == before.get("outputs")
        assert after.get("execution_count") == before.get("execution_count")
        assert after.id == before.id
    assert "execution" in nb.cells[1].metadata, "normalise works on a copy"


def test_normal_form_is_a_fixed_point_and_gives_missing_ids_stable_values(tmp_path: Path):
    nb = course_notebook()
    nb.cells[0].id = nb.cells[1].id  # a duplicate, as copying cells between notebooks makes
    del nb.cells[2]["id"]
    once = to_text(normalise(nb))
    assert to_text(normalise(nb)) == once, "the same notebook gives the same ids"
    path = tmp_path / "09_a.ipynb"
    path.write_text(once, encoding="utf-8")
    assert is_normal(path)
    ids = [c.id for c in nbformat.reads(once, as_version=4).cells]
    assert len(set(ids)) == len(ids)
    nbformat.validate(nbformat.reads(once, as_version=4))


def test_exercises_follow_the_solution_convention():
    assert exercises(course_notebook()) == [Exercise((3,), 4, 5), Exercise((7, 8), None)]


def test_a_grader_cell_says_its_points_on_its_first_line():
    nb = course_notebook()
    assert grader_points(nb.cells[5]) == (2, 1)
    assert grader_points(new_code_cell("# Grader: 1 point\nassert True")) == (1, 0)
    with pytest.raises(ValueError, match="'# Grader: N points'"):
        grader_points(new_code_cell("# Grader, three points\nassert True"))


def test_a_check_or_grader_cell_is_never_taken_for_a_solution():
    nb = new_notebook(
        cells=[
            new_markdown_cell("*Solution*: see below."),
            new_code_cell("# Check\nassert True", metadata=HIDDEN),
            new_code_cell("# Grader: 1 point\nassert True", metadata=HIDDEN),
        ]
    )
    assert exercises(nb) == []


def test_student_edition_removes_solutions_their_prose_and_the_graders_and_keeps_the_checks():
    nb = course_notebook()
    student = student_edition(nb)
    sources = [c.source for c in student.cells]
    assert sources == [
        "# 09 · A notebook",
        "x = 1",
        "## Exercises\n\n**1. Double it.** Set `y` to twice `x`.",
        PLACEHOLDER,
        "# Check your answer\nassert y == 2",
        "**2. Triple it.**",
        PLACEHOLDER,
        "The end.",
    ]
    assert not any("*Solution*" in s or "2 * x" in s or "3 * x" in s or "Grader" in s
                   for s in sources)  # fmt: skip
    code = [c for c in student.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert all(c.metadata == {} for c in code), "the placeholder is not collapsed"
    assert student.cells[3].id == nb.cells[3].id
    assert to_text(normalise(student)) == to_text(student)
    assert len(nb.cells) == 10 and nb.cells[3].outputs, "the full edition is left as it was"


def test_a_skeleton_solution_keeps_its_cell_with_the_todo_lines_blanked():
    solution = (
        "%%writefile train.py\n"
        "import torch.distributed as dist\n"
        "def main():\n"
        "    dist.init_process_group(backend=\"gloo\")  # TODO: join the group\n"
        "    sampler = Sampler(  # TODO: every rank its share\n"
        "        data, seed=0  # TODO\n"
        "    )  # TODO\n"
        "    x = 1  # a comment that is no TODO\n"
        "    # TODO: a comment line stays as written"
    )
    expected = (
        "%%writefile train.py\n"
        "import torch.distributed as dist\n"
        "def main():\n"
        "    # TODO: join the group\n"
        "    # TODO: every rank its share\n"
        "    x = 1  # a comment that is no TODO\n"
        "    # TODO: a comment line stays as written"
    )
    assert skeleton(solution) == expected
    assert skeleton("y = 2 * x") is None
    nb = new_notebook(
        cells=[
            new_markdown_cell("**1.** Write it.\n\n*Solution*: below."),
            ran(solution, 1, **HIDDEN),
            ran("# Check\nassert True", 2, ""),
        ]
    )
    student = student_edition(nb)
    sources = [c.source for c in student.cells]
    assert sources == ["**1.** Write it.", expected, "# Check\nassert True"]
    assert student.cells[1].metadata == {} and student.cells[1].outputs == []
    assert student.cells[1].id == nb.cells[1].id


def test_a_markdown_cell_holding_only_the_solution_prose_is_dropped():
    nb = new_notebook(
        cells=[
            new_markdown_cell("**1.** Set `y`."),
            new_markdown_cell("*Solution*: `y = 1`."),
            new_code_cell("y = 1"),
        ]
    )
    assert [c.source for c in student_edition(nb).cells] == ["**1.** Set `y`.", PLACEHOLDER]


def test_grading_edition_puts_the_answers_into_the_full_edition():
    full = course_notebook()
    submission = student_edition(full)
    submission.cells[3].source = "y = 2"  # the answer, in the placeholder
    submission.cells[4].source = "# Check your answer\nassert True"  # an edited check
    submission.cells[1].source = "x = 5"  # an edited course cell
    submission.cells.insert(4, new_markdown_cell("Because 2 x 1 = 2."))  # a written answer
    del submission.cells[-2]  # the second exercise's placeholder, deleted
    graded = grading_edition(full, submission)
    assert [c.source for c in graded.cells] == [
        full.cells[0].source, "x = 1", full.cells[2].source,
        "y = 2", "Because 2 x 1 = 2.", full.cells[4].source, full.cells[5].source,
        full.cells[6].source, "", full.cells[9].source,
    ]  # fmt: skip
    roles = [(c.metadata[ROLE]["role"], c.metadata[ROLE]["exercise"]) for c in graded.cells]
    assert roles == [
        ("course", 0), ("course", 0), ("course", 0), ("answer", 1), ("answer", 1), ("check", 1),
        ("grader", 1), ("course", 0), ("answer", 2), ("course", 0),
    ]  # fmt: skip
    assert all(not c.get("outputs") for c in graded.cells if c.cell_type == "code")
    assert submission.cells[3].source == "y = 2", "the submission is left as it was"
    # the answer typed into a new cell where the placeholder was: found after the statement
    submission.cells.insert(-1, new_code_cell("z = 3"))
    assert [c.source for c in grading_edition(full, submission).cells][8] == "z = 3"


def test_command_line_check_normalise_and_student(tmp_path: Path, capsys):
    path = tmp_path / "09_a.ipynb"
    nbformat.write(course_notebook(), path)
    assert main(["check", str(path)]) == 1
    assert "not in normal form" in capsys.readouterr().err
    assert main(["normalise", str(path)]) == 0
    assert main(["check", str(path)]) == 0
    normal = path.read_text(encoding="utf-8")
    assert main(["normalise", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == normal, "normalising twice changes nothing"
    out = tmp_path / "student"
    assert main(["student", "--out", str(out), str(path)]) == 0
    assert "2 solution(s) and 1 grader check(s) removed" in capsys.readouterr().out
    written = nbformat.read(out / "09_a.ipynb", as_version=4)
    assert [c.source for c in written.cells].count(PLACEHOLDER) == 2
    (out / "09_a.ipynb").write_text("{}")  # a student's work, which a second copy must keep
    hub = ["student", "--out", str(out), "--kernel", "ddp-course", "--keep-existing", str(path)]
    assert main(hub) == 0
    assert (out / "09_a.ipynb").read_text() == "{}"
    (out / "09_a.ipynb").unlink()
    assert main(hub) == 0
    copy = nbformat.read(out / "09_a.ipynb", as_version=4)
    assert copy.metadata.kernelspec.name == "ddp-course"
    graded = tmp_path / "graded"
    assert main(["grade", "--full", str(tmp_path), "--out", str(graded), str(out / path.name)]) == 0
    edition = nbformat.read(graded / path.name, as_version=4)
    answers = {"y = 2 * x\nprint(y)": PLACEHOLDER, "z = 3 * x": PLACEHOLDER}
    assert [c.source for c in edition.cells] == [
        answers.get(c.source, c.source) for c in course_notebook().cells
        if c.source != "assert z == 3\nprint(z)"
    ], "the unanswered copy: placeholders in the full edition"
