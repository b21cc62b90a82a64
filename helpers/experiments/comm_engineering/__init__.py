"""Notebook 07's experiments: making DDP's communication cheaper, measured.

* ``record_timelines`` (a launch): when each layer's backward, the optimizer and each bucket's
  all-reduce start and end on the workers, one training step, for several bucket settings;
* ``time_variants``: step times of DDP variants (bucket caps, hooks, accumulation), all in one
  launch, interleaved over repeats so that a burst of load hits every variant alike, beside one
  worker's step time measured the same way;
* the tables the notebook reads (``speedup_table``, ``bytes_table``), the step-time model with
  overlap and compression (``model_step_seconds``, ``model_speedups``), and the goal: the best
  speed-up among the techniques that keep the accuracy (``best_within_tolerance``) beside the
  ceiling with communication free (``communication_free_ceiling``; modelled or measured, capped
  at the number of workers by ``capped_ceiling``);
* the knob study (``time_knobs``): pinning, ``gradient_as_bucket_view``, ``static_graph``, one
  bucket, fp16, each alone and combined, against the ceiling measured with silent workers, and
  one DDP step profiled beside a silent one (``profile_table``);
* what a hook's compression costs: PyTorch's own hooks, timed in this process on a group of one
  (``time_hooks``, ``compression_seconds``);
* the activations autograd keeps for backward, counted (``activation_bytes``) and seen
  (``saved_activation_bytes``).

The training loop is ``helpers.training``'s; the buckets and the overlap model are
``helpers.dist.buckets``'s; the hooks ``helpers.dist.comm_hooks``'s.

``python -m helpers.experiments.comm_engineering`` runs the longer measurements the notebook
leaves out (more repeats, more seeds for PowerSGD's accuracy).
"""

from helpers.dist.comm_hooks import collectives_per_bucket
from helpers.experiments.comm_engineering.compression import (
    best_within_tolerance,
    compression_seconds,
    time_hooks,
    train_hooks,
)
from helpers.experiments.comm_engineering.knobs import (
    GOAL_SHARE,
    KNOB_ROUNDS,
    KNOBS,
    Knob,
    knob_table,
    profile_table,
    time_knobs,
)
from helpers.experiments.comm_engineering.step_model import (
    GIGABIT_ALPHA,
    GIGABIT_BETA,
    MAX_ROUND_DEVIATION,
    QUIET_COMPUTE,
    QUIET_IDLE,
    activation_bytes,
    calibrated_compute,
    calibration_problems,
    capped_ceiling,
    communication_free_ceiling,
    deep_mlp,
    layer_of_parameters,
    make_mlp_stack,
    mlp_layers,
    model_speedups,
    model_step_seconds,
    overlap_table,
    saved_activation_bytes,
    scaled_compute,
    uneven_rounds,
)
from helpers.experiments.comm_engineering.timelines import (
    overlap_share,
    record_timelines,
    timeline_table,
    timeline_worker,
)
from helpers.experiments.comm_engineering.timing import (
    goal_speedup,
    goal_verdict,
    paired_shares,
    pytorch_records,
    share_bracket,
    speedup_table,
    speedup_text,
    time_variants,
    timing_rows,
    timing_worker,
)
from helpers.experiments.comm_engineering.variants import (
    ACCUMULATION_VARIANTS,
    BATCHES,
    BUCKET_VARIANTS,
    HOOK_VARIANTS,
    NO_COMMUNICATION,
    ONE_BUCKET_MB,
    REPEATS,
    TIMED_STEPS,
    UNTIMED_STEPS,
    Variant,
    bytes_table,
    timing_config,
)
from helpers.training.model import GRADIENT_BYTES

__all__ = [
    "ACCUMULATION_VARIANTS", "BATCHES", "BUCKET_VARIANTS", "GIGABIT_ALPHA", "GIGABIT_BETA",
    "GOAL_SHARE",
    "GRADIENT_BYTES", "HOOK_VARIANTS", "KNOB_ROUNDS", "KNOBS", "NO_COMMUNICATION", "Knob",
    "MAX_ROUND_DEVIATION", "calibrated_compute", "calibration_problems", "capped_ceiling",
    "knob_table",
    "profile_table", "time_knobs", "ONE_BUCKET_MB", "QUIET_COMPUTE", "QUIET_IDLE", "REPEATS",
    "TIMED_STEPS",
    "UNTIMED_STEPS",
    "Variant", "activation_bytes", "best_within_tolerance", "bytes_table",
    "collectives_per_bucket", "communication_free_ceiling", "compression_seconds", "deep_mlp",
    "layer_of_parameters",
    "make_mlp_stack", "mlp_layers", "model_speedups", "model_step_seconds", "overlap_share",
    "overlap_table", "pytorch_records", "record_timelines", "saved_activation_bytes",
    "scaled_compute", "share_bracket", "paired_shares", "goal_speedup", "goal_verdict",
    "speedup_table", "speedup_text", "time_variants", "timeline_table", "timeline_worker",
    "time_hooks", "timing_config", "uneven_rounds", "timing_rows", "timing_worker", "train_hooks",
]  # fmt: skip
