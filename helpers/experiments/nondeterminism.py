"""What changes the bits of a result, on one machine and between machines (notebook 11).

Floating-point addition is not associative, so anything that changes the order in which a
kernel adds changes the last bits of its result, and a training amplifies them step by step:

* **the number of threads**: a sum split over 2 threads adds two partial sums at the end, one
  thread adds in one sweep (``thread_sums``, ``training_checksum``);
* **a kernel that races**: on CPU, ``index_put_`` and ``put_`` with ``accumulate=True`` add into
  the same element from several threads in whatever order they arrive, so two identical calls
  can differ (``racing_sums``); ``torch.use_deterministic_algorithms(True)`` switches them to a
  single-threaded loop that adds in index order, and makes the ops that have none raise (on CPU
  in 2.13: ``put_`` without accumulate, ``MaxUnpool``; most CPU kernels are deterministic for a
  fixed thread count);
* **another processor**: other vector instructions (AVX-512, AVX2, none) and another MKL code
  path add in other orders; ``OTHER_PROCESSOR`` simulates one, as the course's second nbval pass
  does (``fresh_checksums`` trains in fresh processes with and without it).

On a GPU three more settings are needed for the same guarantee: ``CUBLAS_WORKSPACE_CONFIG``
(``:4096:8`` or ``:16:8``, before CUDA starts), ``torch.backends.cudnn.deterministic = True``
with ``torch.backends.cudnn.benchmark = False``, and ``torch.use_deterministic_algorithms(True)``,
which also catches the many CUDA kernels that use atomic adds (``GPU_SETTINGS``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import torch

from helpers.training import TrainConfig, torch_threads, train_in_process

# The course's simulated other processor (the Makefile's OTHER_PROCESSOR): ATen's kernels
# without AVX2/AVX-512, and MKL's compatible code path.
OTHER_PROCESSOR = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
GPU_SETTINGS = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8 (in the environment, before CUDA is initialised)",
    "torch.backends.cudnn.deterministic": "True",
    "torch.backends.cudnn.benchmark": "False",
    "torch.use_deterministic_algorithms": "True",
}
# A short training: ten steps of the reference experiment
SHORT = TrainConfig(global_batch=256, epochs=1, max_steps=10)


def thread_sums(threads: tuple[int, ...] = (1, 2, 1, 2), n: int = 10_000_000) -> list[float]:
    """The float32 sum of the same ``n`` random numbers, with each thread count in turn."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    sums = []
    for t in threads:
        with torch_threads(t):
            sums.append(x.sum().item())
    return sums


@contextlib.contextmanager
def deterministic(mode: bool) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(mode)`` inside the block, the previous mode after."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(mode)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:12]


def racing_sums(repeats: int = 10, mode: bool = False, threads: int = 2,
                n: int = 2_000_000, bins: int = 100) -> list[str]:  # fmt: skip
    """``index_put_(accumulate=True)`` of ``n`` numbers into ``bins`` elements, ``repeats``
    times on the same input, under ``use_deterministic_algorithms(mode)``: each result's digest
    (12 hex digits of SHA-256). Several threads race only with ``threads`` > 1."""
    g = torch.Generator().manual_seed(0)
    index, values = torch.randint(0, bins, (n,), generator=g), torch.randn(n, generator=g)
    with torch_threads(threads), deterministic(mode):
        return [_digest(torch.zeros(bins).index_put_((index,), values, accumulate=True))
                for _ in range(repeats)]  # fmt: skip


def ordered_sum(n: int = 2_000_000, bins: int = 100) -> str:
    """The digest of the same sums by ``index_add_``, which adds in index order on CPU."""
    g = torch.Generator().manual_seed(0)
    index, values = torch.randint(0, bins, (n,), generator=g), torch.randn(n, generator=g)
    return _digest(torch.zeros(bins).index_add_(0, index, values))


def flagged_on_cpu() -> dict[str, str]:
    """Which of a few CPU ops ``use_deterministic_algorithms(True)`` refuses (raises), and
    which it lets run (with a deterministic version where it has one)."""
    x, index, v = torch.zeros(10), torch.tensor([1, 1, 2]), torch.ones(3)
    ops = {
        "put_(accumulate=False)": lambda: x.clone().put_(index, v, accumulate=False),
        "put_(accumulate=True)": lambda: x.clone().put_(index, v, accumulate=True),
        "index_put_(accumulate=True)": lambda: x.clone().index_put_((index,), v, True),
        "index_add_": lambda: x.clone().index_add_(0, index, v),
        "scatter_add_": lambda: x.clone().scatter_add_(0, index, v),
        "MaxUnpool1d": lambda: torch.nn.MaxUnpool1d(2)(torch.ones(1, 1, 2),
                                                        torch.tensor([[[0, 3]]])),
    }  # fmt: skip
    out = {}
    with deterministic(True):
        for name, op in ops.items():
            try:
                op()
                out[name] = "runs"
            except RuntimeError:
                out[name] = "raises"
    return out


def training_checksum(threads: int, config: TrainConfig = SHORT) -> float:
    """The float64 sum of the weights after ``config``'s training in this process."""
    return train_in_process(config, threads=threads).checksums[0]


_TRAIN = """
import json, sys
from helpers.training import TrainConfig, train_in_process
config = TrainConfig(global_batch=256, epochs=1, max_steps=10, data=sys.argv[1])
print(json.dumps(train_in_process(config, threads=1).checksums[0]))
"""


def _native_env() -> dict[str, str]:
    """This environment without the simulated processor's variables: a fresh process runs
    natively even where this one does not."""
    return {k: v for k, v in os.environ.items() if k not in OTHER_PROCESSOR}


def fresh_checksums(runs: dict[str, dict[str, str]], data: str) -> dict[str, float]:
    """``SHORT``'s training (1 thread) in a fresh Python process per entry of ``runs`` (name:
    extra environment), all at once. The simulated processor's variables are removed from the
    environment first, so that an entry without them runs natively even when this process
    does not."""
    base = _native_env()
    procs = {
        name: subprocess.Popen([sys.executable, "-c", _TRAIN, data], env={**base, **extra},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, extra in runs.items()
    }  # fmt: skip
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode:
            raise RuntimeError(f"the {name} training failed: {stderr.strip().splitlines()[-1:]}")
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def native_capability() -> str:
    """The CPU capability ATen picks in a fresh process without the simulated processor's
    variables ("AVX512", "AVX2", "DEFAULT", ...): where it is already "DEFAULT", the variables
    select no other kernels, and the two processors may round alike."""
    base = _native_env()
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return done.stdout.strip()
