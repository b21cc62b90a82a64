"""What the student edition may hold, as rules a test can check on every notebook.

A self-check (a ``# Check`` cell, which the student edition keeps) must not give the answer away,
and no import may hand an exercise over. Whether a check gives an answer away is a judgement;
these rules are its mechanical stand-ins, strict enough that each of the give-aways an instructor
found (a check calling the function that computes the answer, a check rebuilding the answer from
the notebook's own variables, a check comparing with the answer's value, an import whose only use
is the solution) breaks one of them:

1. **names**: a self-check reads only the names its exercise's statement shows in backticks, names
   the check binds itself, builtins, and the modules ``np``, ``numpy`` and ``math``, and imports
   nothing else;
2. **calls**: it calls nothing that the solution calls, except builtins and those modules'
   functions (``fit.predict`` in the solution rules out ``fit.predict`` in the check);
3. **numbers**: every number it writes appears in the statement, or is 0, 1, 2 or a power of ten
   (the stuff of bounds and tolerances), so it cannot compare with the answer's value;
4. **imports**: every name the student edition imports is used by one of its own code cells
   (outside the imports and the checks), or shown in an exercise statement as a tool to use.

The grader's checks (``# Grader`` cells) are not bound by any of this: the student edition drops
them.
"""

from __future__ import annotations

import ast
import builtins
import math
import re

from nbformat import NotebookNode

from helpers.notebook.tools import Exercise, exercises, is_check, statement, student_edition

MODULES = frozenset({"np", "numpy", "math"})
SMALL = frozenset({0, 1, 2})
_NUMBER = re.compile(r"(?<![\w.])\d[\d,_]*(?:\.\d+)?(?:[eE][+-]?\d+)?")


def statement_names(text: str) -> set[str]:
    """The identifiers inside the statement's backtick spans."""
    spans = re.findall(r"`([^`]*)`", text)
    return {name for span in spans for name in re.findall(r"[A-Za-z_]\w*", span)}


def statement_numbers(text: str) -> set[float]:
    """Every number the statement writes (``6,524,952``, ``1.7``, ``1e-3``)."""
    found = set()
    for token in _NUMBER.findall(text):
        try:
            found.add(float(token.replace(",", "").replace("_", "")))
        except ValueError:
            continue
    return found


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _parse(source: str) -> ast.Module:
    """The cell's code; IPython's ``%`` and ``!`` lines are left out."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def bound_names(tree: ast.AST) -> set[str]:
    """Names the code binds: assignments, loop and comprehension targets, functions and their
    arguments, imports."""
    bound = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            bound.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            bound |= imported_names(n)
    return bound


def imported_names(node: ast.Import | ast.ImportFrom) -> set[str]:
    return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}


def called_names(tree: ast.AST, local: bool = False) -> set[str]:
    """Dotted names of what the code calls, outside builtins and the allowed modules, and, with
    ``local``, outside what the code binds itself (a loop variable's methods)."""
    allowed = MODULES | set(dir(builtins)) | (bound_names(tree) if local else set())
    calls = {_dotted(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {c for c in calls if c and c.split(".")[0] not in allowed}


def _numbers_in(tree: ast.AST) -> set[float]:
    return {
        abs(float(n.value))
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, int | float)
        and not isinstance(n.value, bool)
    }


def _is_power_of_ten(value: float) -> bool:
    return value > 0 and math.isclose(10 ** round(math.log10(value)), value, rel_tol=1e-9)


def check_problems(nb: NotebookNode, ex: Exercise, number: int) -> list[str]:
    """What breaks rules 1-3 in the self-check of exercise ``number`` (from 1)."""
    if ex.check is None:
        return []
    text = statement(nb, ex)
    check = _parse(nb.cells[ex.check].source)
    where = f"exercise {number}'s check (cell {ex.check})"
    problems = []
    allowed = statement_names(text) | bound_names(check) | MODULES | set(dir(builtins))
    if foreign := sorted(loaded_names(check) - allowed):
        problems.append(f"{where} reads {', '.join(foreign)}, which the statement does not name")
    imports = [n for n in ast.walk(check) if isinstance(n, ast.Import | ast.ImportFrom)]
    if brought := sorted(set().union(*map(imported_names, imports)) - MODULES):
        problems.append(f"{where} imports {', '.join(brought)}")
    solution_calls = set()
    for i in ex.solution:
        solution_calls |= called_names(_parse(nb.cells[i].source))
    if shared := sorted(called_names(check, local=True) & solution_calls):
        problems.append(f"{where} calls {', '.join(shared)}, as the solution does")
    given = statement_numbers(text)
    numbers = [
        v for v in _numbers_in(check)
        if v not in SMALL and not _is_power_of_ten(v) and not any(math.isclose(v, g) for g in given)
    ]  # fmt: skip
    if numbers:
        shown = ", ".join(f"{v:g}" for v in sorted(numbers))
        problems.append(f"{where} writes {shown}, which the statement does not")
    return problems


def import_problems(nb: NotebookNode) -> list[str]:
    """Rule 4 on the student edition of ``nb``: imports that only an exercise would use."""
    student = student_edition(nb)
    named = set()
    for ex in exercises(nb):
        named |= statement_names(statement(nb, ex))
    imported, used = {}, set()
    for index, cell in enumerate(student.cells):
        if cell.cell_type != "code" or is_check(cell):
            continue
        tree = _parse(cell.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                imported.update(dict.fromkeys(imported_names(node), index))
        used |= loaded_names(tree)
    return [
        f"the student edition imports {name} (cell {index}), which only an exercise uses"
        for name, index in imported.items()
        if name not in used and name not in named
    ]


def student_edition_problems(nb: NotebookNode) -> list[str]:
    """Every rule broken by the student edition that ``nb`` (a full edition) makes."""
    problems = []
    for number, ex in enumerate(exercises(nb), 1):
        problems += check_problems(nb, ex, number)
    return problems + import_problems(nb)
