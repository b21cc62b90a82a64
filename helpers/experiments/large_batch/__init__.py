"""Large-batch training, measured against a training-loss target (notebook 06).

* ``runs_to_target`` trains every (global batch, learning rate, seed) until the training loss on
  a fixed subset reaches a target (or, with ``hold=HOLD``, stays below it), and counts the
  steps and samples it took (``target``); ``train_counting`` is its loop, which notebook 11's
  counts to a test accuracy share (``helpers.experiments.cost``).
* ``best_per_batch`` picks each batch's best rate (fewest steps, every seed there);
  ``fit_steps_samples`` fits McCandlish et al. 2018's trade-off ``S = S_min + E_min / B`` to
  those runs, whose ratio ``E_min / S_min`` is the critical batch (``curve``).
* ``noise_scale_along_run`` measures the simple noise scale ``B_simple`` along a run
  (``helpers.experiments.noise_scale``), to set beside that critical batch.

The runs use one process: N workers sharing a global batch take the same steps to rounding
(notebooks 03 and 04), so one process tells *what* is learnt.
"""

from helpers.experiments.large_batch.curve import (
    at_best_rate,
    best_per_batch,
    fit_steps_samples,
    noise_scale_along_run,
    pooled_noise_scale,
)
from helpers.experiments.large_batch.report import format_best, format_noise, format_runs
from helpers.experiments.large_batch.target import (
    EVAL_SAMPLES,
    HOLD,
    Counted,
    TargetRun,
    checkpoints,
    confirmed_by,
    diverged,
    eval_subset,
    reordered,
    runs_to_target,
    stays_below,
    train_counting,
    train_to_target,
)

__all__ = [
    "EVAL_SAMPLES",
    "HOLD",
    "Counted",
    "TargetRun",
    "at_best_rate",
    "best_per_batch",
    "checkpoints",
    "confirmed_by",
    "diverged",
    "eval_subset",
    "fit_steps_samples",
    "format_best",
    "format_noise",
    "format_runs",
    "noise_scale_along_run",
    "pooled_noise_scale",
    "reordered",
    "runs_to_target",
    "stays_below",
    "train_counting",
    "train_to_target",
]
