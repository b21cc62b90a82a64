"""The script's versions: four steps from one process to DDP, kept as templates beside this
module, the mistakes made on purpose as edits of the last step, and the diff between any two.

The templates are plain scripts (they import torch and NumPy, never this course's code): a
notebook copies them into a folder of its own, prints each step's diff, as PyTorch's
``ddp-tutorial-series`` does, and runs them.
"""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"
# one process, then: the process group, the data split, DDP
STEPS = ("step0_one_process", "step1_process_group", "step2_sampler", "ddp_har")
EVALUATE_PADDED = "evaluate_padded"  # an evaluation on N workers that counts some rows twice

_SAVE_ON_RANK_0 = """\
    if rank == 0:  # one writer
        # the MLP's own state_dict: keys without DDP's "module." prefix
        checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(checkpoint, out / "checkpoint.pt")
        print(f"saved {out / 'checkpoint.pt'}", flush=True)
"""
_SAVE_ON_EVERY_RANK = """\
    checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(checkpoint, out / "checkpoint.pt")
    print(f"saved {out / 'checkpoint.pt'}", flush=True)
"""
# Each mistake as (text of ddp_har.py, what replaces it).
MISTAKES: dict[str, tuple[str, str]] = {
    "forgotten set_epoch": (
        "        sampler.set_epoch(epoch)  # this epoch's shuffle: randperm seeded by seed + epoch"
        "\n",
        "",
    ),
    "seeds that disagree": ("shuffle=True, seed=0,", "shuffle=True, seed=rank,"),
    "every rank saves": (_SAVE_ON_RANK_0, _SAVE_ON_EVERY_RANK),
}


def template(name: str) -> str:
    """The text of one template (a name from ``STEPS``, or ``EVALUATE_PADDED``)."""
    path = TEMPLATES / f"{name}.py"
    if not path.exists():
        known = ", ".join(p.stem for p in sorted(TEMPLATES.glob("*.py")))
        raise ValueError(f"no template {name!r}; there are: {known}")
    return path.read_text()


def copy_templates(folder: Path) -> dict[str, Path]:
    """Every template copied into ``folder``, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    copied = {}
    for path in sorted(TEMPLATES.glob("*.py")):
        copied[path.stem] = Path(shutil.copyfile(path, folder / path.name))
    return copied


def with_mistake(source: str, mistake: str) -> str:
    """``source`` (ddp_har.py's text) with one of ``MISTAKES`` made in it."""
    if mistake not in MISTAKES:
        raise ValueError(f"no mistake {mistake!r}; there are: {', '.join(MISTAKES)}")
    old, new = MISTAKES[mistake]
    if source.count(old) != 1:
        raise ValueError(f"cannot make {mistake!r}: the script does not contain {old!r} once")
    return source.replace(old, new)


def diff(old: Path, new: Path, context: int = 1) -> str:
    """The unified diff from file ``old`` to file ``new``, as ``diff -u`` prints it (named by
    their file names), with ``context`` unchanged lines around each change."""
    lines = difflib.unified_diff(
        old.read_text().splitlines(keepends=True),
        new.read_text().splitlines(keepends=True),
        fromfile=old.name,
        tofile=new.name,
        n=context,
    )
    return "".join(lines)
