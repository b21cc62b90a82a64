"""Training: the configuration, the model, the data order, the loop, one worker's share, and runs
of N workers. Each module holds one of these; the names most used are importable from here."""

from helpers.training.config import (
    DDP_WRAP,
    FSDP2,
    MOMENTUM,
    OptimizerName,
    Sync,
    TrainConfig,
    epochs_for_min_steps,
    lr_at,
    make_model,
    run_identity,
    steps_per_epoch,
    total_steps,
    validate,
    validate_communication,
)
from helpers.training.loop import AfterStep, Loop, forward_backward, sgd_step, train_steps
from helpers.training.metrics import (
    accuracy,
    accuracy_on_test,
    final_weights,
    weights_checksum,
    weights_digest,
)
from helpers.training.order import epoch_order, local_slice, worker_order
from helpers.training.runs import (
    RunResult,
    run_training,
    run_trainings,
    summarise,
    train_in_process,
)
from helpers.training.worker import (
    Probe,
    launch_data_source,
    torch_threads,
    train_worker,
    train_worker_many,
    worker_data,
)
from helpers.training.wrap import (
    build_model,
    make_optimizer,
    unwrapped,
    wrap_ddp,
    wrap_fsdp2,
    wrap_model,
)

__all__ = [
    "DDP_WRAP", "FSDP2", "MOMENTUM", "AfterStep", "Loop", "OptimizerName", "Probe", "RunResult",
    "Sync", "TrainConfig", "accuracy", "build_model", "epoch_order", "epochs_for_min_steps",
    "final_weights", "forward_backward", "launch_data_source", "local_slice", "lr_at",
    "make_model", "make_optimizer", "run_identity", "run_training", "run_trainings", "sgd_step",
    "steps_per_epoch", "summarise", "accuracy_on_test", "torch_threads", "total_steps",
    "train_in_process", "train_steps", "train_worker", "train_worker_many", "unwrapped",
    "validate", "validate_communication", "weights_checksum", "weights_digest", "worker_data",
    "worker_order", "wrap_ddp", "wrap_fsdp2", "wrap_model",
]  # fmt: skip
