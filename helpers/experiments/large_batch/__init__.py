"""Large-batch training, measured: the best learning rate at every global batch, warm-up, and
the budgets (samples, steps, seconds) to reach a target.

* ``run_grid`` trains every (global batch, learning rate, seed) for a budget fixed in epochs, so
  in samples seen: a larger batch gets fewer steps. ``best_lr_table`` picks, per batch, the rate
  whose final training loss is lowest on average over the seeds, and says how far the seeds
  agree. McCandlish et al. 2018 (*An Empirical Model of Large-Batch Training*) predict that the
  best rate grows about linearly with the batch below the critical batch and levels off above
  it: ``best_lr(B) = lr_max / (1 + B_noise / B)`` (``predicted_best_lr``).
* ``noise_scale_during_training`` measures the gradient noise scale
  (``helpers.experiments.noise_scale``), their estimate of that critical batch, at a few
  points of a training run.
* ``time_to_target_table``: the samples, steps and seconds each batch needs, at its best rate,
  to reach a test accuracy, read from the same runs as the tables.

The runs use one process (``train_in_process``'s loop): N workers sharing a global batch do the
same training to rounding (notebook 03), so one process tells *what* is learnt.
"""

from helpers.experiments.large_batch.best_lr import (
    BestLR,
    best_lr_table,
    fit_lr_max,
    noise_scale_during_training,
    noise_scale_interval,
    predicted_best_lr,
)
from helpers.experiments.large_batch.goyal import (
    GOYAL,
    IMAGENET_TRAIN,
    format_goyal,
    goyal_comparison,
)
from helpers.experiments.large_batch.grid import (
    BATCHES,
    EPOCHS,
    LR_GRID,
    SEEDS,
    Run,
    diverged,
    epochs_to_reach,
    last_epoch_loss,
    reordered,
    run_grid,
    time_to_target_table,
    train_run,
)
from helpers.experiments.large_batch.report import (
    format_best_lr,
    format_loss_grid,
    format_noise_scale,
    format_plan,
    format_time_to_target,
    format_warmup,
)

__all__ = [
    "BATCHES",
    "LR_GRID",
    "SEEDS",
    "BestLR",
    "EPOCHS",
    "GOYAL",
    "IMAGENET_TRAIN",
    "Run",
    "best_lr_table",
    "diverged",
    "epochs_to_reach",
    "fit_lr_max",
    "format_best_lr",
    "format_goyal",
    "format_loss_grid",
    "format_noise_scale",
    "format_plan",
    "format_time_to_target",
    "format_warmup",
    "goyal_comparison",
    "last_epoch_loss",
    "noise_scale_during_training",
    "noise_scale_interval",
    "predicted_best_lr",
    "reordered",
    "run_grid",
    "time_to_target_table",
    "train_run",
]
