"""DDP communication hooks by name: what replaces DDP's plain all-reduce of each gradient bucket.

A hook (``DistributedDataParallel.register_comm_hook``) receives each bucket of gradients when it
is ready in backward, and returns a future of the averaged bucket. PyTorch ships the ones named in
``CommHook``:

* ``ALLREDUCE``: no hook, DDP's own all-reduce of float32 gradients (the reference);
* ``FP16``, ``BF16``: cast the bucket to 16 bits, all-reduce that, cast back: half the bytes,
  about 3 (FP16) or 2 (BF16) significant decimal digits per gradient;
* ``POWER_SGD``: Vogels, Karimireddy and Jaggi 2019, *PowerSGD: Practical Low-Rank Gradient
  Compression for Distributed Optimization*: each weight matrix's gradient ``M`` (n x m) is sent
  as two thin factors, ``P = M Q`` (n x r) and ``Q = M^T P`` (m x r), each all-reduced, with
  error feedback (what the low-rank approximation missed is added to the next step's gradient).

Two limits, checked by ``check_hook`` before any worker starts:

* PyTorch refuses ``bf16_compress_hook`` unless the build has CUDA or ROCm with NCCL 2.10+, or
  XCCL with an XPU present (``bf16_hook_supported``): a question of the build, not of the backend;
* PowerSGD issues its second and third all-reduce of a bucket from the *completion callback* of
  the one before. On Gloo a callback runs on Gloo's own thread when the collective has finished,
  at a moment that differs from rank to rank, while the next bucket's all-reduce is issued from
  backward on the main thread: the ranks can then issue their collectives in different orders,
  and Gloo aborts the process ("Received data size doesn't match expected size"). With a single
  bucket nothing runs concurrently with the chain, so it is safe: on Gloo, PowerSGD needs
  ``bucket_cap_mb`` at least the gradient's size.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

# PowerSGD runs plain all-reduce for its first iterations (PyTorch's default: 1,000). DDP rebuilds
# its buckets after the first step, and PyTorch requires at least 2 so that compression starts on
# the final buckets: the earliest start, which short timings use.
POWERSGD_START_ITER = 2
POWERSGD_WARMUP_SHARE = 0.1  # PowerSGDState's docs: start tuning from 10% of the steps
POWERSGD_MIN_COMPRESSION_RATE = 2  # PyTorch's default: a matrix is compressed only if it pays 2x
MIB = 1024 * 1024


class CommHook(enum.Enum):
    """Which DDP communication hook a training registers."""

    ALLREDUCE = "allreduce"  # no hook: DDP's float32 all-reduce
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "powersgd"

    def label(self, matrix_rank: int = 1) -> str:
        """A short name for tables ("PowerSGD r=2")."""
        names = {"allreduce": "none (fp32)", "fp16": "fp16", "bf16": "bf16"}
        return f"PowerSGD r={matrix_rank}" if self is CommHook.POWER_SGD else names[self.value]


def bf16_hook_supported() -> bool:
    """What ``DistributedDataParallel.register_comm_hook`` itself checks before it accepts
    ``bf16_compress_hook`` (torch 2.13): a CUDA or ROCm build with NCCL 2.10 or later (whatever
    its error message says of CUDA 11), or XCCL with an XPU present at run time. A property of
    the build, not of the backend a group uses: a CPU-only build refuses it whatever the backend,
    a CUDA build accepts it even for a Gloo group."""
    cuda_build = torch.version.cuda is not None or torch.version.hip is not None
    nccl = (
        dist.is_available() and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
    )
    xccl = dist.is_available() and dist.is_xccl_available() and torch.xpu.is_available()
    return bool((cuda_build and nccl) or xccl)


def check_hook(
    hook: CommHook, n_buckets: int, backend: str = "gloo", gradient_bytes: int | None = None
) -> None:
    """Refuse, with what to do instead, the hooks that cannot run with this build, ``backend`` and
    this many buckets (see the module's docstring). Called before any worker starts."""
    if hook is CommHook.BF16 and not bf16_hook_supported():
        raise ValueError(
            "this PyTorch build refuses bf16_compress_hook (it needs a CUDA or ROCm build with "
            "NCCL 2.10+, or XCCL with an XPU present); use CommHook.FP16"
        )
    if backend == "gloo" and hook is CommHook.POWER_SGD and n_buckets > 1:
        size = f"{math.ceil(gradient_bytes / MIB)}" if gradient_bytes else "the gradient's MiB"
        raise ValueError(
            f"PowerSGD on Gloo needs a single gradient bucket, not {n_buckets}: its chained "
            "all-reduces, issued from Gloo's completion callbacks, can interleave with the next "
            "bucket's in a different order on each rank, and Gloo aborts; pass "
            f"bucket_cap_mb={size} or more"
        )


Hook = Callable[[object, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def powersgd_start_iter(total_steps: int) -> int:
    """The step at which PowerSGD starts compressing: 10% of the training's steps, the value
    PyTorch's ``PowerSGDState`` docs suggest to *start* tuning from ("and increase it until a
    satisfactory accuracy is reached": early training is sensitive to inaccurate gradients), and
    never before step 2 (DDP's buckets are rebuilt after step 1). Not tuned here."""
    return max(POWERSGD_START_ITER, round(POWERSGD_WARMUP_SHARE * total_steps))


def hook_and_state(
    hook: CommHook, matrix_rank: int = 1, start_iter: int = POWERSGD_START_ITER
) -> tuple[Hook, object]:
    """PyTorch's hook function for ``hook`` and the state it is registered with (PowerSGD's
    counts what it compressed; it compresses from step ``start_iter``); ``ALLREDUCE`` gives
    ``allreduce_hook``, which does what DDP does without a hook."""
    if hook is CommHook.POWER_SGD:
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=matrix_rank,
            start_powerSGD_iter=start_iter,
            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
        )
        return powerSGD_hook.powerSGD_hook, state
    functions = {
        CommHook.ALLREDUCE: default_hooks.allreduce_hook,
        CommHook.FP16: default_hooks.fp16_compress_hook,
        CommHook.BF16: default_hooks.bf16_compress_hook,
    }
    return functions[hook], None


def register(
    ddp: DDP,
    hook: CommHook,
    matrix_rank: int = 1,
    log: list | None = None,
    start_iter: int = POWERSGD_START_ITER,
) -> object:
    """Register ``hook`` on ``ddp`` (PowerSGD with matrix approximation rank ``matrix_rank``,
    compressing from step ``start_iter``) and return its state. With a ``log``, every bucket's
    communication is timestamped into it (``timestamped``); without one, ``ALLREDUCE`` registers
    nothing and DDP keeps its built-in all-reduce."""
    if hook is CommHook.ALLREDUCE and log is None:
        return None
    fn, state = hook_and_state(hook, matrix_rank, start_iter)
    ddp.register_comm_hook(state, fn if log is None else timestamped(fn, log))
    return state


def _powersgd_elements(shape: Sequence[int], matrix_rank: int) -> int:
    """Elements PowerSGD all-reduces for one gradient tensor: P and Q if compressing pays at
    least ``POWERSGD_MIN_COMPRESSION_RATE`` (PyTorch's rule), else the tensor itself."""
    numel = math.prod(shape)
    if len(shape) < 2:
        return numel
    n, m = shape[0], numel // shape[0]
    r = min(n, m, matrix_rank)
    compressed = (n + m) * r
    return compressed if numel > compressed * POWERSGD_MIN_COMPRESSION_RATE else numel


def bytes_per_step(
    shapes: Sequence[Sequence[int]], hook: CommHook, matrix_rank: int = 1
) -> int:
    """Bytes each worker hands to the all-reduce per step, for float32 gradients of these
    ``shapes``: 4 per element uncompressed, 2 with FP16/BF16, PowerSGD's factors P and Q (and the
    tensors it leaves uncompressed, the biases) otherwise. The ring then sends about
    ``2 (N - 1) / N`` times that (notebook 01)."""
    if hook is CommHook.POWER_SGD:
        return 4 * sum(_powersgd_elements(s, matrix_rank) for s in shapes)
    per_element = 2 if hook in (CommHook.FP16, CommHook.BF16) else 4
    return per_element * sum(math.prod(s) for s in shapes)


def collectives_per_bucket(hook: CommHook) -> int:
    """All-reduce calls a hook makes per bucket and step: PowerSGD makes three, one after the
    other (the uncompressed tensors, then P, then Q), each paying the latency ``alpha``."""
    return 3 if hook is CommHook.POWER_SGD else 1


def timestamped(hook_fn: Hook, log: list) -> Hook:
    """Wrap a comm hook so that it appends ``(bucket index, start, end)`` in ``perf_counter``
    seconds to ``log``: start when DDP hands the bucket over, end when its future completes."""

    # no annotations: DDP checks them against its own types, and this module's are strings
    def wrapper(state, bucket):  # noqa: ANN001, ANN202
        start, index = time.perf_counter(), bucket.index()

        def stamp(fut: torch.futures.Future) -> torch.Tensor:
            log.append((index, start, time.perf_counter()))
            return fut.value()

        return hook_fn(state, bucket).then(stamp)

    return wrapper
