"""The notebooks as files: one normal form for committing them, and three editions of each.

``python -m helpers.notebook.tools normalise notebooks/*.ipynb``: rewrite in place, so that a
diff shows only real changes (no execution timestamps, no kernel or UI noise).
``python -m helpers.notebook.tools check notebooks/*.ipynb``: exit 1 naming every notebook that is
not in normal form.
``python -m helpers.notebook.tools student --out student notebooks/*.ipynb``: the student edition,
outputs cleared, exercise solutions and grader cells removed.
``python -m helpers.notebook.tools grade --out graded/alice submissions/alice/*.ipynb``: the
grading edition of a student's notebooks (``helpers.notebook.grading`` runs and scores them).

The exercise convention these tools rely on (every notebook of the course follows it):

* An exercise's **solution** is the code cell right after a markdown cell that contains
  ``*Solution*``; a code cell with ``metadata.jupyter.source_hidden`` set (collapsed in
  JupyterLab) counts as a solution too, so a solution spread over several collapsed cells is
  removed whole.
* The ``*Solution*`` paragraph is the **last** thing in its markdown cell: the student edition cuts
  that cell from the line holding ``*Solution*`` to its end (the prose answer goes with the code).
* An exercise's **self-check** is an optional code cell right after its solution with a line
  starting ``# Check``. The student edition keeps it, so it must not give the answer away: it
  confirms the kind and shape of the answer and a sanity bound, and refers only to the names the
  exercise statement asks for, builtins and NumPy or ``math`` (``helpers.notebook.rules`` states
  the rule mechanically; ``tests/test_editions.py`` enforces it).
* An exercise's **grader check** is an optional code cell after the self-check (or right after
  the solution) whose first line starts ``# Grader: N points``, optionally followed by
  ``; written answer M point(s), by hand``. It may compute the answer. The student edition drops
  it; the grading edition puts it back, and ``make grade`` scores the exercise by it.
* Asserts that sit inside the solution cell leave with the solution.
* A solution can be a **skeleton** instead: if lines of its (first) cell end in a ``# TODO``
  comment, the student edition keeps that cell, expanded, with only those lines blanked. A line
  ending ``# TODO: what to write`` becomes ``# TODO: what to write`` at its indentation; a line
  ending in a bare ``# TODO`` (the rest of a statement already marked) is dropped. Notebook 04's
  training script is one: the student fills in its key lines.

The **grading edition** of a submission is the full edition with each solution replaced by the
student's answer (the cell with the solution's id, and any cells the student added right after
it): every other cell, the checks and grader checks included, is the course's own, so a check the
student edited or deleted counts as the course wrote it, and a failure outside the answers is not
the student's.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

SOLUTION_MARK = "*Solution*"
CHECK_LINE = re.compile(r"^# Check\b", re.MULTILINE)
GRADER_LINE = re.compile(
    r"^# Grader: (?P<points>\d+) points?"
    r"(?:; written answer (?P<written>\d+) points?, by hand)?"
)
PLACEHOLDER = "# your solution here"
# a line of code that ends in a TODO comment: a line a skeleton solution leaves blank
TODO_LINE = re.compile(r"^(?P<indent>[ \t]*)[^\s#].*?[ \t]*#[ \t]*TODO(?P<hint>:.*)?$")

# The kernel every notebook is written for, without what depends on the machine that ran it last
# (the Python patch version) or on how its kernelspec was installed (the display name).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
}
# Notebook metadata that is written, not produced by a run; everything else is dropped.
NOTEBOOK_METADATA_KEPT = ("title", "authors")
# Cell metadata produced by running or viewing (timestamps, scroll state, editor noise). What an
# author sets stays, above all ``jupyter.source_hidden`` and ``tags``.
CELL_METADATA_DROPPED = ("execution", "ExecuteTime", "collapsed", "scrolled", "vscode")
_CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")


def normalise(nb: NotebookNode) -> NotebookNode:
    """A copy of ``nb`` in normal form; sources, outputs and execution counts are untouched.

    Execution counts stay as they are on purpose: they show whether the notebook was run top to
    bottom, which ``tests/test_notebooks.py`` checks, so renumbering them would hide a mistake.
    """
    nb = copy.deepcopy(nb)
    kept = {k: nb.metadata[k] for k in NOTEBOOK_METADATA_KEPT if k in nb.metadata}
    nb.metadata = nbformat.from_dict(
        {"kernelspec": KERNELSPEC, "language_info": LANGUAGE_INFO, **kept}
    )
    nb.nbformat, nb.nbformat_minor = 4, max(nb.nbformat_minor, 5)
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        for key in CELL_METADATA_DROPPED:
            cell.metadata.pop(key, None)
        if not _CELL_ID.match(cell.get("id") or "") or cell.id in seen:
            cell.id = _stable_id(index, cell.source, seen)
        seen.add(cell.id)
    return nb


def _stable_id(index: int, source: str, taken: set[str]) -> str:
    """An id that depends only on the cell's place and text, so that re-running the normaliser
    gives the same id (nbformat 4.5 requires ids; random ones would churn every diff)."""
    digest = hashlib.sha1(f"{index}\n{source}".encode()).hexdigest()
    for start in range(0, len(digest) - 8):
        if (candidate := digest[start : start + 8]) not in taken:
            return candidate
    raise ValueError(f"no free cell id for cell {index}")  # 32 collisions: not in practice


def to_text(nb: NotebookNode) -> str:
    """The notebook as nbformat writes it (and as Jupyter saves it), ending in a newline."""
    return nbformat.writes(nb) + "\n"


def read(path: Path) -> NotebookNode:
    """The notebook at ``path``, as nbformat 4 (what every function here takes)."""
    return nbformat.read(path, as_version=4)


def is_normal(path: Path) -> bool:
    """Whether the file is byte for byte what ``normalise`` would write."""
    return to_text(normalise(read(path))) == path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- exercises


@dataclass(frozen=True)
class Exercise:
    """Where one exercise's code is, as cell indices."""

    solution: tuple[int, ...]  # the solution's code cells, consecutive
    check: int | None  # the "# Check" cell right after the solution, if any
    grader: int | None = None  # the "# Grader" cell after those, if any


def _is_marker(cell: NotebookNode) -> bool:
    return cell.cell_type == "markdown" and SOLUTION_MARK in cell.source


def is_grader(cell: NotebookNode) -> bool:
    """A grader cell: its first line starts ``# Grader``; the student edition drops it."""
    return cell.cell_type == "code" and cell.source.startswith("# Grader")


def is_check(cell: NotebookNode) -> bool:
    """A check cell stays in the student edition, so it is never taken for a solution."""
    return cell.cell_type == "code" and bool(CHECK_LINE.search(cell.source)) and not is_grader(cell)


def grader_points(cell: NotebookNode) -> tuple[int, int]:
    """(automatic points, points for the written answer) of a grader cell's first line."""
    found = GRADER_LINE.match(cell.source)
    if found is None:
        first = cell.source.splitlines()[0] if cell.source else ""
        raise ValueError(
            f"grader cell {cell.get('id')}: the first line must read '# Grader: N points' "
            f"(optionally '; written answer M point(s), by hand'), not {first!r}"
        )
    return int(found["points"]), int(found["written"] or 0)


def _is_hidden_code(cell: NotebookNode) -> bool:
    hidden = cell.metadata.get("jupyter", {}).get("source_hidden", False)
    return cell.cell_type == "code" and bool(hidden) and not is_check(cell) and not is_grader(cell)


def exercises(nb: NotebookNode) -> list[Exercise]:
    """Every exercise's solution, check and grader cell, in order (the convention is in the
    module's doc)."""
    cells, found, i = nb.cells, [], 0
    while i < len(cells):
        ours = not is_check(cells[i]) and not is_grader(cells[i])
        after_marker = i > 0 and _is_marker(cells[i - 1]) and ours
        if (cells[i].cell_type == "code" and after_marker) or _is_hidden_code(cells[i]):
            solution = [i]
            while i + 1 < len(cells) and _is_hidden_code(cells[i + 1]):
                i += 1
                solution.append(i)
            check = i + 1 if i + 1 < len(cells) and is_check(cells[i + 1]) else None
            after = i + 1 + (check is not None)
            grader = after if after < len(cells) and is_grader(cells[after]) else None
            found.append(Exercise(tuple(solution), check, grader))
        i += 1
    return found


def _without_solution_prose(source: str) -> str:
    lines = source.splitlines(keepends=True)
    cut = next(n for n, line in enumerate(lines) if SOLUTION_MARK in line)
    return "".join(lines[:cut]).rstrip()


def statement(nb: NotebookNode, exercise: Exercise) -> str:
    """The exercise's statement as the student edition shows it: the markdown cell before the
    solution, from the exercise's bold number (``**2. ...``) to the ``*Solution*`` paragraph,
    which may stand in a markdown cell of its own after the statement's."""
    text, index = "", exercise.solution[0] - 1
    while index >= 0 and nb.cells[index].cell_type == "markdown":
        cell = nb.cells[index]
        part = _without_solution_prose(cell.source) if _is_marker(cell) else cell.source
        text = f"{part}\n\n{text}" if text else part
        if re.search(r"^\*\*\d+\.", text, re.MULTILINE):
            break
        index -= 1
    starts = [m.start() for m in re.finditer(r"^\*\*\d+\.", text, re.MULTILINE)]
    return text[starts[-1] :].rstrip() if starts else text


def skeleton(source: str) -> str | None:
    """A solution's source with its ``# TODO`` lines blanked (the module's doc says how), or
    None if no line ends in ``# TODO``."""
    kept, blanked = [], False
    for line in source.splitlines():
        todo = TODO_LINE.match(line)
        if todo is None:
            kept.append(line)
            continue
        blanked = True
        if todo["hint"]:
            kept.append(f"{todo['indent']}# TODO{todo['hint']}")
    return "\n".join(kept) if blanked else None


def student_solution(source: str) -> str:
    """What the student edition puts in place of a solution's first cell: its skeleton, or
    ``# your solution here``."""
    return skeleton(source) or PLACEHOLDER


def student_edition(nb: NotebookNode) -> NotebookNode:
    """The notebook as a student gets it: every solution replaced by one empty code cell saying
    ``# your solution here`` (or by its skeleton), the prose answers cut, grader cells dropped,
    every output cleared, self-checks kept."""
    found = exercises(nb)
    first = {ex.solution[0] for ex in found}
    rest = {i for ex in found for i in ex.solution[1:]}
    cells = []
    for index, cell in enumerate(nb.cells):
        if index in rest or is_grader(cell):
            continue
        if index in first:
            cells.append(nbformat.v4.new_code_cell(student_solution(cell.source), id=cell.id))
            continue
        cell = copy.deepcopy(cell)
        if _is_marker(cell):
            cell.source = _without_solution_prose(cell.source)
            if not cell.source:
                continue
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    return normalise(nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata))


ROLE = "ddp_course_grading"  # cell metadata the grading edition writes: whose cell it is


def _answer_cells(full: NotebookNode, submission: NotebookNode, ex: Exercise) -> list:
    """The student's answer to ``ex``: the cell with the solution's id and the cells the student
    added right after it, up to the next cell the full edition has; where that id is gone (the
    placeholder deleted, the answer typed into a new cell), the cells the student put between the
    exercise's statement and the next cell the full edition has. None if there are none."""
    known = {cell.id for cell in full.cells}
    ids = [cell.get("id") for cell in submission.cells]
    solution_id, statement_id = full.cells[ex.solution[0]].id, full.cells[ex.solution[0] - 1].id
    if solution_id in ids:
        start = ids.index(solution_id)
    elif statement_id in ids:
        start = ids.index(statement_id) + 1
    else:
        return []
    end = next((i for i in range(start + 1, len(ids)) if ids[i] in known), len(ids))
    if start < len(ids) and ids[start] in known and ids[start] != solution_id:
        return []  # nothing between the statement and the next cell the course has
    return [copy.deepcopy(cell) for cell in submission.cells[start:end]]


def grading_edition(full: NotebookNode, submission: NotebookNode) -> NotebookNode:
    """The full edition with every solution replaced by the student's answer, outputs cleared,
    and each cell's role in its metadata (``course``, ``answer``, ``check``, ``grader``, with the
    exercise's number), for ``helpers.notebook.grading`` to run and score."""
    found = exercises(full)
    role_of: dict[int, tuple[str, int]] = {}
    for number, ex in enumerate(found, 1):
        for i in ex.solution:
            role_of[i] = ("answer", number)
        if ex.check is not None:
            role_of[ex.check] = ("check", number)
        if ex.grader is not None:
            role_of[ex.grader] = ("grader", number)
    answers = {ex.solution[0]: _answer_cells(full, submission, ex) for ex in found}
    cells = []
    for index, cell in enumerate(full.cells):
        role, number = role_of.get(index, ("course", 0))
        if role == "answer":
            if index not in answers:
                continue  # a later cell of a solution in several cells: the answer replaces all
            given = answers[index] or [nbformat.v4.new_code_cell("", id=cell.id)]
        else:
            given = [copy.deepcopy(cell)]
        for mine in given:
            if mine.cell_type == "code":
                mine.outputs, mine.execution_count = [], None
            mine.metadata[ROLE] = {"role": role, "exercise": number}
            cells.append(mine)
    return nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(full.metadata))


# --------------------------------------------------------------------------- command line


def _write_student_editions(
    notebooks: Sequence[Path], out: Path, kernel: str | None, keep_existing: bool
) -> None:
    """``student``: each notebook's student edition into ``out`` (a hub's copy: ``kernel`` set,
    and a notebook the student already has left alone)."""
    for path in notebooks:
        nb, target = read(path), out / path.name
        if keep_existing and target.exists():
            print(f"{target}: kept (already there)")
            continue
        student = student_edition(nb)
        if kernel:
            student.metadata.kernelspec = {**KERNELSPEC, "name": kernel, "display_name":
                                           f"Python 3 ({kernel})"}
        target.write_text(to_text(student), encoding="utf-8")
        graders = sum(ex.grader is not None for ex in exercises(nb))
        removed = f"{len(exercises(nb))} solution(s) and {graders} grader check(s) removed, "
        print(f"{target}: {removed if exercises(nb) else ''}outputs cleared")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line the Makefile calls (``make normalise``, ``make student``)."""
    p = argparse.ArgumentParser(
        prog="python -m helpers.notebook.tools", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("normalise", help="rewrite notebooks in normal form, in place").add_argument(
        "notebooks", nargs="+", type=Path
    )
    sub.add_parser("check", help="exit 1 if a notebook is not in normal form").add_argument(
        "notebooks", nargs="+", type=Path
    )
    student = sub.add_parser("student", help="write the student edition into a folder")
    student.add_argument("notebooks", nargs="+", type=Path)
    student.add_argument("--out", type=Path, default=Path("student"), help="default: student/")
    student.add_argument(
        "--kernel", help="the kernel's name in the copies (a hub's registered kernel, ddp-course)"
    )
    student.add_argument(
        "--keep-existing", action="store_true", help="leave a notebook already in --out alone"
    )
    grade = sub.add_parser(
        "grade", help="the grading edition: students' answers in the full edition"
    )
    grade.add_argument("notebooks", nargs="+", type=Path, help="a student's notebooks")
    grade.add_argument("--full", type=Path, default=Path("notebooks"), help="default: notebooks/")
    grade.add_argument("--out", type=Path, required=True, help="folder for the notebooks to run")
    args = p.parse_args(argv)

    if args.command == "check":
        bad = [path for path in args.notebooks if not is_normal(path)]
        for path in bad:
            print(f"{path}: not in normal form; run `make normalise`", file=sys.stderr)
        return 1 if bad else 0
    if args.command == "normalise":
        for path in args.notebooks:
            text = to_text(normalise(read(path)))
            if text != path.read_text(encoding="utf-8"):
                path.write_text(text, encoding="utf-8")
                print(f"normalised {path}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "grade":
        for path in args.notebooks:
            graded = grading_edition(read(args.full / path.name), read(path))
            (args.out / path.name).write_text(to_text(graded), encoding="utf-8")
            print(f"{args.out / path.name}: answers in {args.full / path.name}")
        return 0
    _write_student_editions(args.notebooks, args.out, args.kernel, args.keep_existing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
