"""Grading a class: ``make grade SUBMISSIONS=dir`` (``python -m helpers.notebook.grading``).

A submission is a student's copy of a student-edition notebook, found in SUBMISSIONS as
``<student>/<NN_name>.ipynb`` (one folder per student) or ``<student>_<NN_name>.ipynb`` (one
folder for the class); ``NN_name`` is the course notebook's file name. Each is run as its grading
edition (``helpers.notebook.tools.grading_edition``: the course's own cells with the student's
answers in place, the self-checks and grader checks as the course wrote them) in a fresh kernel,
from the top down to its last graded cell, with a time limit per cell.

An exercise scores its grader cell's points when its answer, self-check and grader check all ran
without error; ``not answered`` when the answer is still the placeholder. A failure is the
student's when their answer, or a check on it, fails for a reason of its own; it is the
**environment's** when a course cell fails (a timing assert, a skipped world size: nothing a
student wrote runs there), or when any cell fails in a way that says the machine, not the code,
is at fault (a worker that could not start or died, the kernel dying, no memory, a cell that ran
out of time in the course's own code): those exercises are not scored, the notebook is run again
(``--retries``), and the report lists what still failed, to rerun on a quieter machine. An
exercise without a grader cell (a notebook not yet converted) is scored by its self-check, for 1
point. Written answers are left to the instructor (COURSE.md, "Grading"): the report quotes them.

It writes ``grades.csv`` (one row per student, notebook and exercise) and ``report.md`` into
``--out``, with the executed grading editions under ``--out/notebooks/<student>/``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from helpers.notebook.tools import (
    PLACEHOLDER,
    ROLE,
    exercises,
    grader_points,
    grading_edition,
    read,
    statement,
    student_solution,
    to_text,
)

CELL_TIMEOUT = 900  # seconds; notebook 06's grid takes minutes on 2 busy cores
ENVIRONMENT_TYPES = {
    "DeadKernelError", "MemoryError", "TimeoutError", "ConnectionError", "ConnectionResetError",
    "ConnectionRefusedError", "BrokenPipeError", "CellTimeoutError",
}  # fmt: skip
# What a message says when the machine, not the code, failed: a worker that died or did not
# start or finish, a collective that timed out, a world size skipped for want of cores, a port
# or a file limit, no memory or disk.
ENVIRONMENT_MESSAGE = re.compile(
    r"died|without reporting|did not (start|finish)|timed? ?out|skipped|\bcores?\b|"
    r"address already in use|too many open files|no space left|cannot allocate memory",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Submission:
    student: str
    notebook: str  # the course notebook's stem, NN_name
    path: Path


@dataclass
class ExerciseResult:
    student: str
    notebook: str
    exercise: int
    title: str
    status: str  # passed, failed, not answered, environment, not submitted
    points: int
    max_points: int
    written_max: int
    reason: str = ""
    written: str = ""  # the student's own markdown beside the answer, for the instructor


@dataclass
class NotebookRun:
    submission: Submission
    results: list[ExerciseResult] = field(default_factory=list)
    seconds: float = 0.0
    attempts: int = 1  # runs made: more than 1 where the environment failed
    cells_run: int = 0
    cells_total: int = 0


def find_submissions(folder: Path, course: Sequence[str]) -> tuple[list[Submission], list[Path]]:
    """The submissions in ``folder`` (layout in the module's doc), and the files that are none."""
    found, ignored = [], []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        relative = path.relative_to(folder)
        if len(relative.parts) == 2 and path.stem in course:
            found.append(Submission(relative.parts[0], path.stem, path))
            continue
        match = next((n for n in course if path.stem.endswith("_" + n)), None)
        if len(relative.parts) == 1 and match:
            found.append(Submission(path.stem[: -len(match) - 1], match, path))
        else:
            ignored.append(path)
    return found, ignored


def exercise_title(text: str, number: int) -> str:
    found = re.match(r"\*\*(\d+\.[^*]*?)\.?\*\*", text)
    return found[1].strip() if found else f"{number}."


def is_environment(role: str, ename: str, evalue: str) -> bool:
    """Whether a cell's error is the machine's, not the student's (the module's doc)."""
    if role == "course" or ename in ENVIRONMENT_TYPES:
        return True
    return ename in ("WorkerError", "RuntimeError", "OSError", "ValueError") and bool(
        ENVIRONMENT_MESSAGE.search(evalue)
    )


def _grader_only(source: str) -> str:
    """A grader cell run so that its names do not reach the cells after it (the student's
    answers to later exercises never saw them)."""
    return f"exec(compile({source!r}, '<grader>', 'exec'), dict(globals()))"


def _failing_line(traceback: Sequence[str]) -> str:
    """The line IPython's traceback marks (``----> 3 assert ...``), for an error with no
    message, such as a bare assert."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(traceback))
    marked = re.findall(r"^-+> *\d+ (.*)$", plain, re.MULTILINE)
    return f"at `{marked[-1].strip()}`" if marked else ""


def run_edition(nb: nbformat.NotebookNode, cwd: Path, timeout: int) -> tuple[dict, int]:
    """Execute ``nb`` in place down to its last graded cell: (errors by cell index as
    (ename, evalue), cells run). A cell over ``timeout`` seconds is interrupted; a dead kernel
    stops the run."""
    roles = [cell.metadata.get(ROLE, {}).get("role", "course") for cell in nb.cells]
    last = max((i for i, role in enumerate(roles) if role != "course"), default=-1)
    errors: dict[int, tuple[str, str]] = {}

    def on_error(cell, cell_index, execute_reply):
        content = execute_reply["content"]
        evalue = content.get("evalue", "") or _failing_line(content.get("traceback", []))
        errors[cell_index] = (content.get("ename", "Error"), evalue)

    client = NotebookClient(
        nb, timeout=timeout, allow_errors=True, interrupt_on_timeout=True, kernel_name="python3",
        error_on_timeout={"ename": "CellTimeoutError", "evalue": f"stopped after {timeout} s",
                          "traceback": []},
        resources={"metadata": {"path": str(cwd)}}, on_cell_error=on_error,
    )  # fmt: skip
    run = 0
    with client.setup_kernel():
        for index in range(last + 1):
            cell = nb.cells[index]
            if roles[index] == "grader":
                cell.source = _grader_only(cell.source)
            try:
                client.execute_cell(cell, index)
            except DeadKernelError as error:
                errors[index] = ("DeadKernelError", str(error) or "the kernel died")
                break
            run = index + 1
    return errors, run


def _answer_given(cells: list, handed_out: str) -> bool:
    """Whether the answer cells hold more than the student edition handed out (the placeholder,
    or a skeleton solution's blanked lines)."""
    code = "".join(c.source for c in cells if c.cell_type == "code")
    return bool(code.replace(PLACEHOLDER, "").strip()) and code.strip() != handed_out.strip()


def score(sub: Submission, full: nbformat.NotebookNode, edition: nbformat.NotebookNode,
          errors: dict, run: int) -> list[ExerciseResult]:
    """One result per exercise of ``full`` from the errors of its grading edition's run."""
    meta = [cell.metadata.get(ROLE, {}) for cell in edition.cells]
    environment_at = min(
        (i for i, (ename, evalue) in errors.items()
         if is_environment(meta[i].get("role", "course"), ename, evalue)),
        default=None,
    )  # fmt: skip
    results = []
    for number, ex in enumerate(exercises(full), 1):
        text = statement(full, ex)
        points, written = grader_points(full.cells[ex.grader]) if ex.grader is not None else (1, 0)
        result = ExerciseResult(sub.student, sub.notebook, number, exercise_title(text, number),
                                "passed", points, points, written)
        mine = [i for i, m in enumerate(meta) if m.get("exercise") == number]
        answer = [edition.cells[i] for i in mine if meta[i]["role"] == "answer"]
        result.written = "\n\n".join(c.source for c in answer if c.cell_type == "markdown")
        failed = sorted(i for i in mine if i in errors)
        if not _answer_given(answer, student_solution(full.cells[ex.solution[0]].source)):
            result.status, result.points, result.reason = "not answered", 0, ""
        elif environment_at is not None and environment_at <= max(mine):
            ename, evalue = errors[environment_at]
            result.status, result.points = "environment", 0
            role = meta[environment_at].get("role", "course")
            result.reason = f"cell {environment_at} ({role}): {ename}: {evalue}"
        elif failed:
            ename, evalue = errors[failed[0]]
            result.status, result.points = "failed", 0
            result.reason = f"{meta[failed[0]]['role']}: {ename}: {evalue}"
        elif run <= max(mine):
            result.status, result.points, result.reason = "environment", 0, "not run"
        results.append(result)
    return results


def unscored(sub: Submission, full: nbformat.NotebookNode, status: str,
             reason: str) -> list[ExerciseResult]:
    """Every exercise of ``full`` at 0 points, for a submission that could not be run."""
    results = []
    for number, ex in enumerate(exercises(full), 1):
        points, written = grader_points(full.cells[ex.grader]) if ex.grader is not None else (1, 0)
        title = exercise_title(statement(full, ex), number)
        results.append(ExerciseResult(sub.student, sub.notebook, number, title, status, 0, points,
                                      written, reason))
    return results


def grade_one(
    sub: Submission, full_path: Path, out: Path, timeout: int, retries: int
) -> NotebookRun:
    """Run and score one submission, again up to ``retries`` times while the environment fails."""
    full = read(full_path)
    record = NotebookRun(sub)
    try:
        submission = read(sub.path)
    except Exception as error:  # not a notebook: JSON, nbformat or encoding errors alike
        reason = f"unreadable: {type(error).__name__}: {str(error)[:200]}"
        record.results = unscored(sub, full, "failed", reason)
        return record
    started = time.perf_counter()
    for attempt in range(1, retries + 2):
        edition = grading_edition(full, submission)
        errors, run = run_edition(edition, full_path.parent, timeout)
        results = score(sub, full, edition, errors, run)
        record.attempts = attempt
        better = not record.results or (
            sum(r.status == "environment" for r in results)
            < sum(r.status == "environment" for r in record.results)
        )
        if better:
            record.results, record.cells_run = results, run
            record.cells_total = len(edition.cells)
            target = out / "notebooks" / sub.student / f"{sub.notebook}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(to_text(edition), encoding="utf-8")
        if not any(r.status == "environment" for r in record.results):
            break
    record.seconds = time.perf_counter() - started
    return record


def not_submitted(runs: Sequence[NotebookRun], course: dict[str, Path]) -> list[NotebookRun]:
    """A run at 0 points for every notebook that some student handed in and another did not."""
    students = sorted({r.submission.student for r in runs})
    assigned = sorted({r.submission.notebook for r in runs})
    handed = {(r.submission.student, r.submission.notebook) for r in runs}
    missing = []
    for student in students:
        for notebook in assigned:
            if (student, notebook) not in handed:
                sub = Submission(student, notebook, course[notebook])
                results = unscored(sub, read(course[notebook]), "not submitted", "")
                missing.append(NotebookRun(sub, results))
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    from helpers.notebook.grading_report import write_csv, write_report

    p = argparse.ArgumentParser(prog="python -m helpers.notebook.grading",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("submissions", type=Path, help="the class's folder (layout: see --help's doc)")
    p.add_argument("--out", type=Path, default=Path("grades"), help="default: grades/")
    p.add_argument("--full", type=Path, default=Path("notebooks"),
                   help="the full edition (default: notebooks/)")
    p.add_argument("--timeout", type=int, default=CELL_TIMEOUT,
                   help=f"seconds a cell may run (default {CELL_TIMEOUT})")
    p.add_argument("--retries", type=int, default=1,
                   help="runs again of a notebook the environment failed (default 1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="notebooks run at once, in kernels of their own (default 1; 2 cores each)")
    args = p.parse_args(argv)
    course = {path.stem: path for path in sorted(args.full.glob("[0-9][0-9]_*.ipynb"))}
    if not args.submissions.is_dir():
        print(f"error: {args.submissions} is not a folder of submissions", file=sys.stderr)
        return 2
    if not course:
        print(f"error: no course notebooks (NN_name.ipynb) in {args.full}", file=sys.stderr)
        return 2
    subs, ignored = find_submissions(args.submissions, list(course))
    if not subs:
        print(f"error: no submissions in {args.submissions}: expected <student>/NN_name.ipynb "
              "or <student>_NN_name.ipynb", file=sys.stderr)
        return 2
    os.environ.setdefault("HAR_DATA", "recordings")  # as the class ran them (COURSE.md)
    os.environ.setdefault("DDP_COURSE_CORES", "2")
    # OpenMP's waiting threads sleep instead of spinning: the same results, and far less time
    # lost where other programs (or other --jobs) share the cores
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = [(s, course[s.notebook], args.out, args.timeout, args.retries) for s in subs]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            runs = list(pool.map(grade_one, *zip(*jobs, strict=True)))
    else:
        runs = []
        for job in jobs:
            runs.append(grade_one(*job))
            print(f"{job[0].student} {job[0].notebook}: {runs[-1].seconds:.0f} s", flush=True)
    seconds = time.perf_counter() - started
    runs += not_submitted(runs, course)
    write_csv(args.out / "grades.csv", runs, course)
    write_report(args.out / "report.md", runs, course, ignored, seconds, args)
    print(f"{args.out / 'grades.csv'}, {args.out / 'report.md'}: {len(runs)} notebook(s) of "
          f"{len({r.submission.student for r in runs})} student(s) in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
