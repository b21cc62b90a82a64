"""The grader (`make grade`): the grading edition, the submissions' layout, and a class of three
graded end to end on notebook 01 (NumPy only, seconds), with an environment failure beside it."""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.notebook.grading import find_submissions, is_environment, main
from helpers.notebook.tools import (
    PLACEHOLDER,
    ROLE,
    exercises,
    grading_edition,
    read,
    student_edition,
    to_text,
)

ROOT = Path(__file__).parent.parent
NB01 = ROOT / "notebooks" / "01_allreduce_by_hand.ipynb"


def answered(full: nbformat.NotebookNode, answers: list[str | None]) -> nbformat.NotebookNode:
    """The student edition of ``full`` with each placeholder replaced by an answer; None gives
    the model solution."""
    student = student_edition(full)
    for ex, answer in zip(exercises(full), answers, strict=True):
        [cell] = [c for c in student.cells if c.id == full.cells[ex.solution[0]].id]
        model = "\n".join(full.cells[i].source for i in ex.solution)
        cell.source = model if answer is None else answer
    return student


def rows(out: Path) -> dict[tuple[str, int], dict]:
    with (out / "grades.csv").open(encoding="utf-8") as f:
        return {(r["student"], int(r["exercise"])): r for r in csv.DictReader(f)}


def test_the_grading_edition_runs_the_course_cells_and_checks_as_written_around_the_answers():
    full = read(NB01)
    submission = answered(full, ["prediction_ring = prediction_root = 1", None])
    ex1, ex2 = exercises(full)
    check = full.cells[ex1.check]
    [mine] = [c for c in submission.cells if c.id == check.id]
    mine.source = "# Check\nassert True"  # a check the student weakened
    submission.cells[1].source = "import numpy as np"  # a course cell the student broke
    added = new_markdown_cell("Each worker's mean, weighted by its slice.")
    solution_id = full.cells[ex2.solution[0]].id
    submission.cells.insert([c.id for c in submission.cells].index(solution_id) + 1, added)

    edition = grading_edition(full, submission)
    sources = [c.source for c in edition.cells]
    assert check.source in sources and "# Check\nassert True" not in sources
    assert full.cells[1].source in sources, "the course's own cells, not the student's edits"
    assert full.cells[ex1.grader].source in sources, "the grader checks are back"
    roles = [(c.metadata[ROLE]["role"], c.metadata[ROLE]["exercise"]) for c in edition.cells]
    at = sources.index("prediction_ring = prediction_root = 1")
    assert roles[at : at + 3] == [("answer", 1), ("check", 1), ("grader", 1)]
    written = sources.index(added.source)
    assert roles[written] == ("answer", 2), "a cell added after the answer belongs to it"
    assert all(not c.get("outputs") for c in edition.cells if c.cell_type == "code")


def test_submissions_are_found_in_a_folder_per_student_or_named_by_student(tmp_path: Path):
    course = ["01_allreduce_by_hand", "05_speedup_and_efficiency"]
    for name in ("alice/01_allreduce_by_hand.ipynb", "bob_01_allreduce_by_hand.ipynb",
                 "alice/.ipynb_checkpoints/01_allreduce_by_hand-checkpoint.ipynb",
                 "notes.ipynb", "carol/untitled.ipynb"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    found, ignored = find_submissions(tmp_path, course)
    assert [(s.student, s.notebook) for s in found] == [
        ("alice", "01_allreduce_by_hand"), ("bob", "01_allreduce_by_hand")]  # fmt: skip
    assert sorted(p.name for p in ignored) == ["notes.ipynb", "untitled.ipynb"]


@pytest.mark.parametrize(
    ("role", "ename", "evalue", "environment"),
    [
        ("course", "AssertionError", "", True),  # a timing assert in the course's own cell
        ("check", "AssertionError", "at `assert 0 < x`", False),
        ("answer", "NameError", "name 'fit' is not defined", False),
        ("answer", "WorkerError", "worker rank 1 of 2 died (exit code -9) without reporting", True),
        ("answer", "WorkerError", "worker rank 0 of 2 failed: ValueError: lr must be > 0", False),
        ("grader", "ValueError", "skipped: 2 workers x 1 threads = 2 threads > 1 cores", True),
        ("answer", "CellTimeoutError", "stopped after 900 s", True),
        ("answer", "DeadKernelError", "Kernel died", True),
    ],
)
def test_failures_are_the_students_or_the_environments(role, ename, evalue, environment):
    assert is_environment(role, ename, evalue) is environment


@pytest.mark.slow
def test_a_class_of_three_gets_the_points_its_answers_earn(tmp_path: Path, monkeypatch):
    """One correct submission, one with exercise 1 wrong, one broken file: 4, 2 and 0 of 4."""
    monkeypatch.setenv("HAR_DATA", "standin")
    monkeypatch.setenv("DDP_COURSE_CORES", "2")
    full = read(NB01)
    submissions = tmp_path / "submissions"
    (submissions / "alice").mkdir(parents=True)
    (submissions / "alice" / NB01.name).write_text(to_text(answered(full, [None, None])))
    [ex1, _] = exercises(full)  # bob predicts 2 M for the ring, and measures as the model does
    model = "\n".join(full.cells[i].source for i in ex1.solution)
    right = "prediction_ring, prediction_root = 12_234_285, 97_874_280"
    assert right in model, "the model solution changed: update bob's answer"
    wrong = model.replace(right, "prediction_ring, prediction_root = 2 * 6_524_952 - 1, 97_874_280")
    (submissions / f"bob_{NB01.name}").write_text(to_text(answered(full, [wrong, None])))
    (submissions / f"carol_{NB01.name}").write_text('{"cells": [')  # cut short in the upload
    out = tmp_path / "grades"

    assert main([str(submissions), "--out", str(out), "--full", str(NB01.parent)]) == 0
    grades = rows(out)
    points = {k: (int(r["points"]), int(r["max_points"]), r["status"]) for k, r in grades.items()}
    assert points == {
        ("alice", 1): (2, 2, "passed"), ("alice", 2): (2, 2, "passed"),
        ("bob", 1): (0, 2, "failed"), ("bob", 2): (2, 2, "passed"),
        ("carol", 1): (0, 2, "failed"), ("carol", 2): (0, 2, "failed"),
    }  # fmt: skip
    assert grades["bob", 1]["reason"].startswith("grader: AssertionError: 2 (N - 1) / N x M")
    assert "unreadable" in grades["carol", 1]["reason"]
    report = (out / "report.md").read_text()
    assert "| alice | 4/4 | 4/4 |" in report and "| bob | 2/4 | 2/4 |" in report
    assert (out / "notebooks" / "bob" / NB01.name).exists(), "the run is kept for reading"


def course_notebook() -> nbformat.NotebookNode:
    """A course notebook whose second cell fails where the machine is busy (a timing assert),
    with one exercise after it, and one before it."""
    return new_notebook(cells=[
        new_markdown_cell("# 09 · A notebook\n\n**1. One.** Set `x` to 1.\n\n*Solution*: 1."),
        new_code_cell("x = 1", metadata={"jupyter": {"source_hidden": True}}),
        new_code_cell("# Check\nassert x > 0"),
        new_code_cell("# Grader: 1 point\nassert x == 1"),
        new_code_cell("import os\nassert os.environ.get('FAKE_LOAD') != 'busy', 'too slow'"),
        new_markdown_cell("**2. Two.** Set `y` to 2, and say why.\n\n*Solution*: 2."),
        new_code_cell("y = 2", metadata={"jupyter": {"source_hidden": True}}),
        new_code_cell("# Check\nassert y > 0"),
        new_code_cell("# Grader: 2 points; written answer 1 point, by hand\nassert y == 2"),
    ])  # fmt: skip


def test_a_failing_course_cell_is_the_environments_and_is_run_again(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("FAKE_LOAD", "busy")
    full_dir, submissions = tmp_path / "full", tmp_path / "submissions" / "dana"
    full_dir.mkdir()
    submissions.mkdir(parents=True)
    full = course_notebook()
    nbformat.write(full, full_dir / "09_a.ipynb")
    student = answered(full, ["x = 1", "y = 2"])
    assert PLACEHOLDER not in [c.source for c in student.cells]
    after = [c.source for c in student.cells].index("y = 2") + 1
    student.cells.insert(after, new_markdown_cell("Because two is one more than one."))
    (submissions / "09_a.ipynb").write_text(to_text(student))
    out = tmp_path / "grades"

    assert main([str(tmp_path / "submissions"), "--out", str(out), "--full", str(full_dir)]) == 0
    grades = rows(out)
    assert (grades["dana", 1]["status"], grades["dana", 1]["points"]) == ("passed", "1")
    assert grades["dana", 2]["status"] == "environment" and grades["dana", 2]["points"] == "0"
    assert "(course): AssertionError: too slow" in grades["dana", 2]["reason"]
    assert grades["dana", 2]["attempts"] == "2", "run once more before giving up"
    report = (out / "report.md").read_text()
    assert "rerun these" in report and "dana, `09_a` exercise 2" in report
    assert "> Because two is one more than one." in report, "the written answer, to mark"


def test_a_skeleton_handed_back_unchanged_is_not_answered(tmp_path: Path):
    """Notebook 04's exercises hand out their solution with its key lines blanked: a submission
    that leaves the skeleton as it came scores "not answered", one that fills it in is graded."""
    full = new_notebook(cells=[
        new_markdown_cell("**1. Fill in.** Complete the lines marked `TODO`.\n\n*Solution*: 3."),
        new_code_cell("x = 1\ny = x + 2  # TODO: y from x",
                      metadata={"jupyter": {"source_hidden": True}}),
        new_code_cell("# Check\nassert y > 0"),
        new_code_cell("# Grader: 1 point\nassert y == 3"),
    ])  # fmt: skip
    full_dir, submissions = tmp_path / "full", tmp_path / "submissions"
    full_dir.mkdir()
    (submissions / "erin").mkdir(parents=True)
    (submissions / "fred").mkdir()
    nbformat.write(full, full_dir / "04_a.ipynb")
    handed_out = student_edition(full)
    assert "x = 1\n# TODO: y from x" in [c.source for c in handed_out.cells]
    (submissions / "erin" / "04_a.ipynb").write_text(to_text(handed_out))
    (submissions / "fred" / "04_a.ipynb").write_text(to_text(answered(full, ["x = 1\ny = 3"])))
    out = tmp_path / "grades"

    assert main([str(submissions), "--out", str(out), "--full", str(full_dir)]) == 0
    grades = rows(out)
    assert (grades["erin", 1]["status"], grades["erin", 1]["points"]) == ("not answered", "0")
    assert (grades["fred", 1]["status"], grades["fred", 1]["points"]) == ("passed", "1")
