"""The committed notebooks: numbered, executed with their outputs, free of errors and warnings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_those_the_readme_lists():
    """The README's table of notebooks, one row each, names exactly the committed ones."""
    table = ROOT.joinpath("README.md").read_text().split("## The notebooks", 1)[1].split("\n## ")[0]
    listed = re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \|", table, re.MULTILINE)
    assert listed, "no notebook found in the README's table: this check would prove nothing"
    assert sorted(listed) == [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_numbered_executed_and_clean(path: Path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), f"{path.name} is not NN_name.ipynb"
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown"
    assert "".join(cells[0]["source"]).startswith(f"# {path.name[:2]}"), "title: '# NN · ...'"
    code = [c for c in cells if c["cell_type"] == "code"]
    executed = [c for c in code if c.get("outputs")]
    assert len(executed) >= len(code) / 2, "commit the notebook executed, with its outputs"
    counts = [c["execution_count"] for c in code if c["execution_count"] is not None]
    assert counts == list(range(1, len(code) + 1)), "execute top to bottom, every cell, once"
    for cell in code:
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", "a committed cell raised"
            assert out.get("name") != "stderr", f"stderr in a committed cell: {out.get('text')}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_markdown_holds_no_escaped_newlines(path: Path):
    """A text edited through a string literal can keep its ``\\n`` as two characters, which
    Jupyter then shows as text (03's cell 48 once did); a ``\\n`` in backticks is code, not that."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        prose = re.sub(r"`[^`]*`", "", "".join(cell["source"]))
        if cell["cell_type"] == "markdown":
            assert "\\n" not in prose, f"cell {index}: a literal \\n in the text"
