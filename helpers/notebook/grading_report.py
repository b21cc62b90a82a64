"""What ``make grade`` writes: a CSV for the gradebook and a Markdown report to read."""

from __future__ import annotations

import argparse
import csv
import os
import time
from collections.abc import Sequence
from pathlib import Path

from helpers.dist.cores import CORES_ENV, machine_cores
from helpers.notebook.grading import ExerciseResult, NotebookRun
from helpers.training.measure import cpu_model

COLUMNS = (
    "student", "notebook", "exercise", "title", "status", "points", "max_points",
    "written_max", "written_points", "reason", "notebook_seconds", "attempts",
)  # fmt: skip


def _rows(runs: Sequence[NotebookRun]) -> list[tuple[NotebookRun, ExerciseResult]]:
    ordered = sorted(runs, key=lambda r: (r.submission.student, r.submission.notebook))
    return [(run, result) for run in ordered for result in run.results]


def write_csv(path: Path, runs: Sequence[NotebookRun], course: dict[str, Path]) -> None:
    """One row per student, notebook and exercise; ``written_points`` is left for the
    instructor, who marks the written answers by hand."""
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for run, r in _rows(runs):
            out.writerow([
                r.student, r.notebook, r.exercise, r.title, r.status, r.points, r.max_points,
                r.written_max, "", r.reason, f"{run.seconds:.1f}", run.attempts,
            ])  # fmt: skip


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def write_report(path: Path, runs: Sequence[NotebookRun], course: dict[str, Path],
                 ignored: Sequence[Path], seconds: float, args: argparse.Namespace) -> None:
    """The class at a glance (points per student and notebook), what to rerun, then every
    student's exercises with what failed and why, and the written answers to mark."""
    students = sorted({r.submission.student for r in runs})
    notebooks = sorted({r.submission.notebook for r in runs})
    ran = [r for r in runs if r.cells_total]
    lines = [
        f"# Grades: {args.submissions}",
        "",
        f"Graded {time.strftime('%Y-%m-%d %H:%M')} on {cpu_model()}, {machine_cores()} cores, "
        f"planning for {CORES_ENV}={os.environ.get(CORES_ENV)}, "
        f"HAR_DATA={os.environ.get('HAR_DATA')}, {args.jobs} job(s) at once, "
        f"load average {os.getloadavg()[0]:.1f} at the end. "
        f"{len(ran)} notebook run(s) of {len(students)} student(s) in {seconds:.0f} s "
        f"({seconds / max(1, len(students)):.0f} s per student).",
        "",
        "## Points (automatic; the written answers are marked by hand)",
        "",
        "| student | " + " | ".join(notebooks) + " | automatic | written, to mark |",
        "| --- | " + " | ".join("---:" for _ in notebooks) + " | ---: | ---: |",
    ]
    for student in students:
        mine = {r.submission.notebook: r for r in runs if r.submission.student == student}
        cells, total, top, written = [], 0, 0, 0
        for notebook in notebooks:
            results = mine[notebook].results if notebook in mine else []
            got, best = sum(r.points for r in results), sum(r.max_points for r in results)
            flag = " (env)" if any(r.status == "environment" for r in results) else ""
            cells.append(f"{got}/{best}{flag}")
            total, top = total + got, top + best
            written += sum(r.written_max for r in results)
        lines.append(f"| {student} | " + " | ".join(cells) + f" | {total}/{top} | {written} |")
    environment = [(run, r) for run, r in _rows(runs) if r.status == "environment"]
    lines += ["", "## Environment failures: not the students', rerun these", ""]
    lines += [
        f"* {r.student}, `{r.notebook}` exercise {r.exercise} ({run.attempts} run(s)): "
        f"{_cell(r.reason)}"
        for run, r in environment
    ] or ["None."]
    if ignored:
        lines += ["", "## Files that are not submissions", ""]
        lines += [f"* `{p}`: not `<student>/NN_name.ipynb` or `<student>_NN_name.ipynb`"
                  for p in ignored]  # fmt: skip
    for student in students:
        lines += ["", f"## {student}"]
        for run in sorted((r for r in runs if r.submission.student == student),
                          key=lambda r: r.submission.notebook):  # fmt: skip
            got = sum(r.points for r in run.results)
            best = sum(r.max_points for r in run.results)
            timing = f", {run.seconds:.0f} s" if run.cells_total else ""
            lines += ["", f"### `{run.submission.notebook}`: {got} of {best} points{timing}", "",
                      "| exercise | points | result |", "| --- | ---: | --- |"]  # fmt: skip
            for r in run.results:
                result = r.status + (f": {_cell(r.reason)}" if r.reason else "")
                lines.append(f"| {_cell(r.title)} | {r.points}/{r.max_points} | {result} |")
            for r in run.results:
                if r.written_max:
                    answer = "\n".join("> " + line for line in r.written.splitlines()) or "> (none)"
                    heading = (f"Written answer to exercise {r.exercise} ({r.written_max} "
                               "point(s), COURSE.md's rubric):")
                    lines += ["", heading, "", answer]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
