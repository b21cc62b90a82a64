"""README's package table names every module of helpers/ and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def table() -> dict[str, set[str]]:
    """Folder -> the module names its row gives (`` `name`: `` or `` `name/` ``, before a colon)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The package") :]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `(helpers/[a-z_/]*)` \| (.*) \|$", line)
        if m:
            names = set()
            for entry in re.split(r"; ", m.group(2)):
                head = entry.split(":")[0]
                names |= {n.rstrip("/") for n in re.findall(r"`([a-z0-9_]+/?)`", head)}
            rows[m.group(1)] = names
    return rows


def tree() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    helpers = ROOT / "helpers"
    for folder in [helpers, *sorted(p for p in helpers.iterdir() if p.is_dir())]:
        if folder.name == "__pycache__":
            continue
        names = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")}
        names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
        if folder == helpers:
            names = {n for n in names if not (helpers / n).is_dir()}
        found[f"{folder.relative_to(ROOT)}/"] = names
    return found


def test_the_package_table_matches_the_tree():
    assert table() == tree()


def test_the_table_is_read():
    """The check above can fail: the table has a row per folder, with the modules in it."""
    rows = table()
    assert {"helpers/data/", "helpers/dist/", "helpers/training/"} <= set(rows)
    assert "launch" in rows["helpers/dist/"] and "comm_engineering" in rows["helpers/experiments/"]
