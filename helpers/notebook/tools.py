"""The notebooks as files: one normal form for committing them, and the student edition.

``python -m helpers.notebook.tools normalise notebooks/*.ipynb``: rewrite in place, so that a
diff shows only real changes (no execution timestamps, no kernel or UI noise).
``python -m helpers.notebook.tools check notebooks/*.ipynb``: exit 1 naming every notebook that is
not in normal form.
``python -m helpers.notebook.tools student --out student notebooks/*.ipynb``: the student edition,
outputs cleared and exercise solutions removed.
``python -m helpers.notebook.tools grade --out graded/alice submissions/alice/*.ipynb``: a
student's notebooks with the full edition's check cells put back, ready to run for grading.

The exercise convention these tools rely on (notebooks 01-06 follow it):

* An exercise's **solution** is the code cell right after a markdown cell that contains
  ``*Solution*``; a code cell with ``metadata.jupyter.source_hidden`` set (collapsed in
  JupyterLab) counts as a solution too, so a solution spread over several collapsed cells is
  removed whole.
* The ``*Solution*`` paragraph is the **last** thing in its markdown cell: the student edition cuts
  that cell from the line holding ``*Solution*`` to its end (the prose answer goes with the code).
* An exercise's **check** is an optional code cell right after its solution whose source has a
  line starting with ``# Check``; it holds the asserts and uses only names the exercise statement
  asks for. The student edition keeps it, so a student can check their own answer (and a grader
  can run it). Asserts that sit inside the solution cell leave with the solution.
* A solution can be a **skeleton** instead: if lines of its (first) cell end in a ``# TODO``
  comment, the student edition keeps that cell, expanded, with only those lines blanked. A line
  ending ``# TODO: what to write`` becomes ``# TODO: what to write`` at its indentation; a line
  ending in a bare ``# TODO`` (the rest of a statement already marked) is dropped. Notebook 04's
  training script is one: the student fills in its key lines.
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


def _is_marker(cell: NotebookNode) -> bool:
    return cell.cell_type == "markdown" and SOLUTION_MARK in cell.source


def is_check(cell: NotebookNode) -> bool:
    """A check cell stays in the student edition, so it is never taken for a solution."""
    return cell.cell_type == "code" and bool(CHECK_LINE.search(cell.source))


def _is_hidden_code(cell: NotebookNode) -> bool:
    hidden = cell.metadata.get("jupyter", {}).get("source_hidden", False)
    return cell.cell_type == "code" and bool(hidden) and not is_check(cell)


def exercises(nb: NotebookNode) -> list[Exercise]:
    """Every exercise's solution and check, in order (the convention is in the module's doc)."""
    cells, found, i = nb.cells, [], 0
    while i < len(cells):
        after_marker = i > 0 and _is_marker(cells[i - 1]) and not is_check(cells[i])
        if (cells[i].cell_type == "code" and after_marker) or _is_hidden_code(cells[i]):
            solution = [i]
            while i + 1 < len(cells) and _is_hidden_code(cells[i + 1]):
                i += 1
                solution.append(i)
            check = i + 1 if i + 1 < len(cells) and is_check(cells[i + 1]) else None
            found.append(Exercise(tuple(solution), check))
        i += 1
    return found


def _without_solution_prose(source: str) -> str:
    lines = source.splitlines(keepends=True)
    cut = next(n for n, line in enumerate(lines) if SOLUTION_MARK in line)
    return "".join(lines[:cut]).rstrip()


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
    ``# your solution here`` (or by its skeleton), the prose answers cut, every output cleared,
    check cells kept."""
    found = exercises(nb)
    first = {ex.solution[0] for ex in found}
    rest = {i for ex in found for i in ex.solution[1:]}
    cells = []
    for index, cell in enumerate(nb.cells):
        if index in rest:
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


def with_checks_from(full: NotebookNode, submission: NotebookNode) -> NotebookNode:
    """A student's notebook with every check cell as the full edition has it, for grading: a
    check the student edited or deleted counts as written. Cells are matched by id, which the
    student edition keeps; a deleted check goes back before the first cell that followed it."""
    graded = copy.deepcopy(submission)
    ids = [cell.id for cell in full.cells]
    for ex in exercises(full):
        if ex.check is None:
            continue
        check = full.cells[ex.check]
        mine = next((cell for cell in graded.cells if cell.get("id") == check.id), None)
        if mine is not None and mine.cell_type == "code":
            mine.source = check.source
            continue
        if mine is not None:
            graded.cells.remove(mine)
        later = set(ids[ex.check + 1 :])
        at = next(
            (i for i, cell in enumerate(graded.cells) if cell.get("id") in later),
            len(graded.cells),
        )
        graded.cells.insert(at, nbformat.v4.new_code_cell(check.source, id=check.id))
    return graded


# --------------------------------------------------------------------------- command line


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
    grade = sub.add_parser(
        "grade", help="put the full edition's check cells back into students' notebooks"
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
            graded = with_checks_from(read(args.full / path.name), read(path))
            (args.out / path.name).write_text(to_text(graded), encoding="utf-8")
            print(f"{args.out / path.name}: checks from {args.full / path.name}")
        return 0
    for path in args.notebooks:
        nb = read(path)
        target = args.out / path.name
        target.write_text(to_text(student_edition(nb)), encoding="utf-8")
        print(f"{target}: {len(exercises(nb))} solution(s) removed, outputs cleared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
