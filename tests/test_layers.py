"""helpers/ in layers: every import, lazy ones inside functions included, runs downward (data,
then dist, then training, then experiments, then the notebooks' tools, then the command lines),
and no module is longer than a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
LAYERS = ("data", "dist", "training", "experiments", "notebook", "cli")
MAX_LINES = 400


def layer_of(module: str) -> int:
    """The layer of a dotted module name under helpers (the command lines are the top layer)."""
    parts = module.split(".")
    if parts[0] != "helpers" or len(parts) < 2:
        raise ValueError(f"{module} is not a module of helpers")
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else LAYERS.index("cli")


def helpers_imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module) for every import of a helpers module in ``source``, wherever it stands."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("helpers.")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))  # fmt: skip
            if base == "helpers":  # from helpers import data: the submodule is what is imported
                found += [(node.lineno, f"helpers.{a.name}") for a in node.names]
            elif base.startswith("helpers."):
                found.append((node.lineno, base))
    return found


def upward_imports(source: str, module: str) -> list[str]:
    """The imports in ``source`` (of ``module``) that reach a higher layer than its own."""
    own = layer_of(module)
    return [
        f"{module}:{line} imports {target} ({LAYERS[layer_of(target)]} above {LAYERS[own]})"
        for line, target in helpers_imports(source, module)
        if layer_of(target) > own
    ]


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(HELPERS.rglob("*.py")):
        parts = path.relative_to(HELPERS.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name != "helpers":
            found.append((name, path))
    return found


def test_every_import_runs_downward():
    problems = [p for name, path in modules() for p in upward_imports(path.read_text(), name)]
    assert not problems, "\n".join(problems)


def test_an_upward_import_is_caught():
    """The check above can fail: a dist module importing the training layer, lazily."""
    source = "def f():\n    from helpers.training.loop import train_steps\n"
    assert upward_imports(source, "helpers.dist.launch") == [
        "helpers.dist.launch:2 imports helpers.training.loop (training above dist)"
    ]
    assert upward_imports("from helpers import experiments\n", "helpers.data.har")
    assert not upward_imports("from helpers.data import load_har\n", "helpers.training.worker")


def test_the_top_level_holds_the_layers_and_the_two_command_lines():
    entries = {p.name for p in HELPERS.iterdir() if p.name != "__pycache__"}
    extra = entries - {"__init__.py", "reproduce.py", "train.py"}
    assert len(extra) <= 6, sorted(extra)
    assert {Path(p).stem for p in extra} <= set(LAYERS), sorted(extra)


@pytest.mark.parametrize("name,path", modules(), ids=[n for n, _ in modules()])
def test_no_module_is_over_400_lines(name: str, path: Path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by idea"
