"""One-off: put notebook 05's new first section into it, "Before adding workers: profile the single
worker, and the biggest single device" (helpers.experiments.data_pipeline and .single_device).

    python tools/insert_nb05_pipeline.py [NOTEBOOK] [--out PATH]

inserts the section's cells just before the markdown cell whose source starts with
``## 1. What is timed`` (the anchor), and draws its baseline into the sweep's table and figures:
the cell printing ``speedup_text(table)`` and the two calling ``plot_scaling(...)`` get the
argument ``baselines``. Three prose cells are touched up where their sentences are still found
(the introduction, the check list, what the output showed); one that is not is reported, not
fatal. It refuses a notebook that has the section already or lacks the anchor or a cell it must
change, writing nothing. Then execute and normalise the notebook (README, "Notebooks"), and
delete this script: it is for applying once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "05_speedup_and_efficiency.ipynb"
ANCHOR = "## 1. What is timed"
HEADING = "## Before adding workers: profile the single worker, and the biggest single device"

CELLS: list[tuple[str, str]] = [
    ("markdown", HEADING + """

The reference article's first advice before going distributed is to **profile the single-worker
job**: slow data loading or preprocessing will not improve with more workers. Its first common
mistake is the other side of it: *adding workers to a job bottlenecked on data loading*. Its
second advice is to **use the biggest single device you can**. Both come before the sweep,
because both change what a speed-up should be measured against.

Every training so far indexed tensors already in memory: the 561 features of every window were
computed once, when the data was first loaded, and cached. Many real pipelines do their
preprocessing per sample instead, as the samples are read (decoding and augmenting images,
tokenising text). `WindowFeatures`, a PyTorch `Dataset`, does that with this course's own feature
code (`helpers/data/features.py`, which builds the cache for all windows at once): the filters
run once over each whole recording, the first time the dataset is used (a causal filter needs
the recording's past), and each item cuts its 128-sample window and computes its 561 features
when a `DataLoader` asks for it. They equal the cached features bit for bit:
"""),
    ("code", """\
import inspect

import torch

from helpers.dist.cores import available_cores
from helpers.experiments.data_pipeline import (
    CACHED,
    REGIONS,
    PipelineRun,
    WindowFeatures,
    batches,
    pipeline_table,
    pipeline_text,
    profiled_steps,
    run_here,
    run_workers,
)
from helpers.experiments.scaling import DEFAULT_BATCHES
from helpers.experiments.single_device import baseline_runs
from helpers.notebook.before_workers import plot_step_breakdown

windows = WindowFeatures("train")  # which windows, and each feature's range, from the cache
windows.signals()  # the recordings read and filtered once (seconds): start-up, off every clock
print(windows.banner)
checked = range(0, len(windows), 500)
for i in checked:
    x, y = windows[i]  # computed now, from the raw signals
    assert torch.equal(x, torch.from_numpy(windows.X_cached[i])) and y == windows.y[i]
print(f"{len(windows):,} windows; {len(checked)} computed on the fly equal the cache's")
"""),
    ("markdown", """\
**The step, profiled.** `profiled_steps` trains as `train_steps` does (notebook 03), but it asks
for every batch itself, so that waiting for it is a region of its own: `torch.profiler` records
four `record_function` regions in every step, **data wait**, **forward**, **backward** (where DDP
also all-reduces the gradients) and **optimizer**. The clock starts before the first batch is
asked for, so the start of a `DataLoader`'s worker processes is on it, as every epoch pays it.
`batches` is what feeds it: a `DataLoader` over `WindowFeatures` that takes this rank's slice of
each global batch in the course's order, or the cached array, indexed.
"""),
    ("code", "print(inspect.getsource(profiled_steps))\nprint(inspect.getsource(batches))"),
    ("markdown", """\
**Seven ways to feed the same training** (the MLP from `torch.manual_seed(0)`, SGD at 0.05, the
course's order; 6 steps at global batch 64):

1. one worker computing the features itself, between its steps (`num_workers=0`): the profile
   the advice asks for;
2. the same with **one `DataLoader` worker process** (`num_workers=1`, two batches prefetched):
   the features computed beside the training instead of between its steps;
3. the same with **two** loader processes;
4. one worker on the **cached** features;
5. **2 DDP workers**, each computing its own slice's features: the mistake, workers added to a
   job that waits for its data;
6. 2 DDP workers with a loader process each;
7. 2 DDP workers on the cached features.

**Cores spent on data count.** A loader process computing features keeps a core as busy as a
training process does, so every run counts its busy processes, workers x (threads + loader
processes), against the cores. A run that needs more is refused unless it is asked for with
`oversubscribe=True`, and then it is flagged `OVERSUBSCRIBED` in the table and the figure. On 2
cores runs 3 and 6 are, and they run here on purpose, to measure what the competition costs.
The timings vary with the machine and its load (nbval does not compare them).
"""),
    ("code", """\
# NBVAL_IGNORE_OUTPUT
feed = {"global_batch": 64, "steps": 6}
one = run_here(
    [
        PipelineRun(**feed),  # 1: features computed between the steps
        PipelineRun(**feed, loader_workers=1),  # 2
        PipelineRun(**feed, loader_workers=2),  # 3
        PipelineRun(**feed, features=CACHED),  # 4
    ],
    windows,
    oversubscribe=True,  # measured on purpose, and flagged
)
two = run_workers(  # 5, 6, 7: one launch, each worker computing its own slice
    [
        PipelineRun(**feed),  # 5
        PipelineRun(**feed, loader_workers=1),  # 6
        PipelineRun(**feed, features=CACHED),  # 7
    ],
    2,
    oversubscribe=True,
)
steps_table = pipeline_table(one + two)
print(f"{available_cores()} cores, {feed['steps']} steps at global batch {feed['global_batch']}")
print(pipeline_text(steps_table))
"""),
    ("code", """\
# the same training whichever way it was fed: bit for bit in this process; on 2 workers the
# replicas identical, equal to one worker's to float rounding (another order of sums)
assert len({r["digest"] for r in one}) == 1
assert all(r["replicas_identical"] for r in two) and len({r["digest"] for r in two}) == 1
assert np.isclose(two[0]["checksums"][0], one[0]["checksums"][0], rtol=1e-6)
# the profile holds every region of every step
assert all(r["regions"][name]["count"] == r["steps"] for r in one + two for name in REGIONS)
# no run oversubscribed the cores silently
busy = [r["busy_processes"] > available_cores() for r in one + two]
assert steps_table["oversubscribed"].tolist() == busy
print("the same training every way; every region of every step profiled; oversubscribed: flagged")
"""),
    ("code", """\
fig = plot_step_breakdown(steps_table, windows.banner)
plt.show()
"""),
    ("markdown", """\
**Reading the profile.** In run 1 almost the whole step is *data wait*: the features of 64
windows take many times the forward, backward and optimizer together (several milliseconds of a
core per window, against about 0.1 ms of training per sample in section 3). That is the profile
the article warns about, and no change to the training can fix it. What each way out can buy:

* **Prefetching alone (run 2)** can hide at most the training's own share of the step: the
  loader process computes the next batch while the training computes on this one, but a single
  core still computes every feature.
* **More loader processes (run 3)** help up to the cores they get: two compute two batches at
  once. The training process makes a third busy process on 2 cores (flagged); it sleeps while it
  waits, so it costs little while the job is data-bound, but once the data keeps up it competes
  with the loaders for the same cores.
* **The cache (run 4)** removes the wait: the features are computed once, not at every epoch,
  and the step is the training's own, tens of times shorter.
* **2 DDP workers on the fly (run 5)**, the mistake. Whatever they gain over run 1 comes from the
  second core computing features (each worker computes its half of the batch), not from dividing
  the training: the step is still mostly data wait, the gain cannot pass the number of cores, and
  loader processes give a single worker the same (run 3) without an all-reduce or a second
  replica. Set against the cache, both are slow.
* **Loader processes on DDP workers (run 6)**: 4 busy processes on 2 cores. They bring no cores,
  they take turns on the same two, and a step ends only when both workers have their batch: the
  one that waits longer for its data holds the other up in the all-reduce (its *backward*).
* **Fixed (run 7)**: on the cached features, 2 workers compete with one worker's cached step
  (run 4), not with run 1; at a global batch of 64 the sweep below shows what that is worth.

These are one sample each, and other programs on the machine move them: a process that gets no
core gains nothing, so on a busy machine the runs with more processes can come out no faster at
all. The shares of the step, and the cache's lead, hold however busy it is.

So: profile one worker first. If its step waits for its data, fix the pipeline (cache whatever
can be computed once; otherwise loader processes, on cores that the training does not need), and
only then measure what workers add, against the fixed single worker.

### The biggest single device

The sweep below sets N workers against one worker with the same threads each: N machines against
one machine of the same kind. The article's second advice asks for another baseline first: **one
worker using every core** (intra-op threads, `torch.set_num_threads`), the biggest single device
this machine has. Threads split each matrix product of a step between the cores and never
all-reduce. Workers split the batch, and every one of them pays the all-reduce of the whole
gradient and the step's fixed costs (`c0`, section 3). Which wins depends on how well a step's
products split over threads and on what the all-reduce costs. A third layout tells the two apart:
**workers that never communicate** (`sync="none"`, each trains alone on its slice: not a valid
training, only what the workers would reach if the all-reduce were free).

`baseline_runs` times both at the sweep's global batches with the sweep's budget (the same steps,
the same untimed first steps), each layout's batches in one launch, so that its start-up is paid
once. Their speed-ups over the sweep's 1-worker run are in the sweep's table (section 2, with a
line per batch saying which is faster) and figures (section 4), beside the workers'.
"""),
    ("code", """\
# NBVAL_IGNORE_OUTPUT
baselines = baseline_runs(DEFAULT_BATCHES, min_steps=10, progress=print)
shown = ["layout", "world", "threads_per_worker", "global_batch", "seconds", "samples_per_s"]
print(baselines[shown].to_string(index=False, float_format="{:,.2f}".format))
"""),
    ("code", """single = baselines[baselines["layout"] == "single device"]
# every core, as each worker's own torch reported it (torch.get_num_threads())
assert (single["world"] == 1).all() and (single["threads_used"] == available_cores()).all()
assert (baselines["threads_used"] == baselines["threads_per_worker"]).all()
print(f"the single device: 1 worker running {available_cores()} intra-op threads, every core")
"""),
    ("markdown", """\
**Which should win.** At small batches one worker on every core has the advantage: it pays no
all-reduce, and its fixed costs per step are not paid twice. Where workers that never
communicate beat the threads, the threads lose on splitting a step's products (a small matrix
product splits over cores less well than a batch splits over processes); where DDP falls below
those workers, the difference is the all-reduce. The table under the sweep says which was faster
here, batch by batch.

Threads are also the more fragile of the two when other programs share the cores: every parallel
operation of a step waits for its slowest thread, and PyTorch's OpenMP threads spin while they
wait, burning the time slices their partner needs. On this course's 2-core machine, with other
programs keeping its load average between 10 and 15, one worker on 2 threads took up to 12 times
as long as on 1 thread at the small batches (about as long at 4096), while 2 workers of one
thread each lost less than half of the speed-up they had on the quiet machine; a step at batch
256 used about 30 ms of CPU on 1 thread and 115 to 205 ms on 2. Setting
`OMP_WAIT_POLICY=PASSIVE` before the worker starts (threads sleep instead of spinning) brought
those 2 threads back to about 30 ms of CPU per step. Measure the single device on a quiet machine,
and record the load beside it (the machine facts at the top).
"""),
]

# (cell source starts with, old text, new text): the sweep's table and figures draw the baselines
REQUIRED = [
    ("# NBVAL_IGNORE_OUTPUT\nprint(f\"Speed-up over 1 worker", "print(speedup_text(table))",
     "print(speedup_text(table, baselines))"),
    ("curve = prediction_table(",
     'plot_scaling(table, curve, published, "speedup", data.banner, PUBLISHED_LABEL)',
     'plot_scaling(\n    table, curve, published, "speedup", data.banner, PUBLISHED_LABEL, '
     'baselines=baselines\n)'),
    ('fig = plot_scaling(table, curve, published, "efficiency"',
     'plot_scaling(table, curve, published, "efficiency", data.banner, PUBLISHED_LABEL)',
     'plot_scaling(\n    table, curve, published, "efficiency", data.banner, PUBLISHED_LABEL, '
     'baselines=baselines\n)'),
]  # fmt: skip
# Prose that mentions the new section where its sentences are still as they were written.
OPTIONAL = [
    ("# 05 · Speed-up and efficiency", "4. what to check before going distributed.",
     "4. what to check before going distributed: profile one worker first (does its step wait for\n"
     "   its data?), and set it against the biggest single device, one worker on every core."),
    ("# 05 · Speed-up and efficiency", "each paying a few seconds of start-up).",
     "each paying a few seconds of start-up), and\nabout 40 s more for the first section (a data "
     "pipeline profiled and fed seven ways, and the\nsingle-device baseline)."),
    ("## 5. What it comes to", "1. **Measure one worker first.**",
     "1. **Measure one worker first: profile it, and give it every core.** A step that waits for\n"
     "   its data gains nothing from workers that a cache or loader processes would not give for\n"
     "   less (the first section), and one worker on every core, not one worker per core, is the\n"
     "   baseline that workers must beat."),
    ("## What the output showed", "* **Model:**",
     "* **Before adding workers:** one worker's profile with the features computed on the fly,\n"
     "  the same training fed seven ways (bit for bit in one process), every region of every step\n"
     "  profiled, and the runs that oversubscribed the cores flagged; one worker on every core\n"
     "  timed at every batch, in the sweep's table and figures.\n* **Model:**"),
]  # fmt: skip


def insert(nb: nbformat.NotebookNode) -> list[str]:
    """Insert the section and draw the baselines in ``nb``; returns notes on skipped prose.
    ValueError (nothing changed) if the section is there already or a required cell is not."""
    sources = [cell.source for cell in nb.cells]
    if any(source.startswith(HEADING) for source in sources):
        raise ValueError("the notebook has the section already")
    at = next((i for i, c in enumerate(nb.cells)
               if c.cell_type == "markdown" and c.source.startswith(ANCHOR)), None)  # fmt: skip
    if at is None:
        raise ValueError(f"no markdown cell starting with {ANCHOR!r} to insert before")
    edits = []
    for start, old, new in REQUIRED:
        found = [c for c in nb.cells if c.source.startswith(start) and old in c.source]
        if len(found) != 1:
            raise ValueError(f"expected one cell starting {start!r} holding {old!r}, found "
                             f"{len(found)}: apply that change by hand")  # fmt: skip
        edits.append((found[0], old, new))
    for cell, old, new in edits:
        cell.source = cell.source.replace(old, new, 1)
    notes = []
    for start, old, new in OPTIONAL:
        found = [c for c in nb.cells if c.source.startswith(start) and old in c.source]
        if len(found) == 1:
            found[0].source = found[0].source.replace(old, new, 1)
        else:
            notes.append(f"not found, left as it is: {old!r} in the cell starting {start!r}")
    new_cells = [
        nbformat.v4.new_markdown_cell(source.strip("\n"), id=f"before-workers-{k}")
        if kind == "markdown"
        else nbformat.v4.new_code_cell(source.strip("\n"), id=f"before-workers-{k}")
        for k, (kind, source) in enumerate(CELLS)
    ]
    nb.cells[at:at] = new_cells
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", nargs="?", type=Path, default=NOTEBOOK)
    parser.add_argument("--out", type=Path, help="write here (default: the notebook, in place)")
    args = parser.parse_args(argv)
    try:
        nb = nbformat.read(args.notebook, as_version=4)
        notes = insert(nb)
    except (OSError, ValueError) as err:
        print(f"insert_nb05_pipeline: {args.notebook}: {err}", file=sys.stderr)
        return 1
    nbformat.write(nb, args.out or args.notebook)
    for note in notes:
        print(f"insert_nb05_pipeline: {note}", file=sys.stderr)
    print(f"inserted {len(CELLS)} cells before {ANCHOR!r} in {args.out or args.notebook}; "
          "now execute and normalise it")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
