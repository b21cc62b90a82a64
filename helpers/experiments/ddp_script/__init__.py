"""Notebook 04: your own DDP script. A plain training script changed into a DDP one step at a
time (``versions``), run as its author will run it, under torchrun (``run``), and graded by what
it did: the rows each rank trained on, who saved, and its weights against one process's and the
course's reference (``grade``)."""

from helpers.experiments.ddp_script.grade import (
    SCRIPT_ATOL,
    accuracy_counts,
    checkpoint_weights,
    each_sample_once,
    gap_table,
    global_batches,
    grade,
    grade_table,
    new_order_each_epoch,
    printers,
    reference_batches,
    same_batches,
    seen,
    tensor_gaps,
    visits,
    writers,
)
from helpers.experiments.ddp_script.run import (
    ScriptFailed,
    ScriptRun,
    run_script,
    torchrun_command,
    write_npz,
)
from helpers.experiments.ddp_script.versions import (
    EVALUATE_PADDED,
    MISTAKES,
    STEPS,
    TEMPLATES,
    copy_templates,
    diff,
    template,
    with_mistake,
)

__all__ = [
    "EVALUATE_PADDED",
    "MISTAKES",
    "SCRIPT_ATOL",
    "STEPS",
    "TEMPLATES",
    "ScriptFailed",
    "ScriptRun",
    "accuracy_counts",
    "checkpoint_weights",
    "copy_templates",
    "diff",
    "each_sample_once",
    "gap_table",
    "global_batches",
    "grade",
    "grade_table",
    "new_order_each_epoch",
    "printers",
    "reference_batches",
    "run_script",
    "same_batches",
    "seen",
    "template",
    "tensor_gaps",
    "torchrun_command",
    "visits",
    "with_mistake",
    "write_npz",
    "writers",
]
