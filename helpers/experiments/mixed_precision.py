"""Mixed precision (notebook 09, section 3): bfloat16 where it is cheap to be wrong (the matrix
products, the activations), float32 where rounding would accumulate (the weights the optimizer
updates, the gradients' sums), on the CPU and across workers.

``cpu_features`` reads which bf16 instructions this processor has; ``paired_seconds`` times a
training step and a matrix product in float32 and under ``torch.autocast``, in interleaved
pairs (``bf16_ratios`` summarises them); ``precision_worker``
trains the reference in both, one seed per run, for their test accuracies; ``fsdp_mp_worker``
runs FSDP2 with ``MixedPrecisionPolicy`` on Gloo and counts what it sends and holds;
``bytes_per_parameter`` is the Ultra-Scale Playbook's arithmetic, and ``held_per_parameter`` the
same bytes read from the tensors of a real float32 and mixed-precision Adam step."""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.data import load_har
from helpers.dist.counting import CollectiveCounter
from helpers.experiments.memory import local_bytes, state_bytes
from helpers.experiments.saved_activations import SavedActivations
from helpers.experiments.split_training import Steps, gaps, one_worker
from helpers.training.metrics import correct_per_sample
from helpers.training.model import make_mlp
from helpers.training.order import epoch_order, local_slice

# The instructions a CPU's bf16 matrix products can use, best first, as /proc/cpuinfo names them.
BF16_FLAGS = {
    "amx_bf16": "AMX tiles multiply bf16 matrices (Intel Sapphire Rapids and later)",
    "avx512_bf16": "AVX-512 BF16: dot products of bf16 pairs into float32 (Cooper Lake, Zen 4)",
    "avx512f": "AVX-512 without BF16: bf16 converted to float32, then multiplied",
    "avx2": "AVX2: 8 float32 lanes, no bf16 instructions",
}


def cpu_features(path: str = "/proc/cpuinfo") -> dict[str, bool]:
    """Which of ``BF16_FLAGS`` this processor reports (Linux); empty where there is no
    ``/proc/cpuinfo`` (macOS)."""
    try:
        with open(path) as info:
            flags = next((line.split(":", 1)[1].split() for line in info
                          if line.startswith("flags")), [])  # fmt: skip
    except OSError:
        return {}
    return {flag: flag in flags for flag in BF16_FLAGS}


def autocast(enabled: bool):
    """bf16 autocast on the CPU, or nothing."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


def _train_step(bf16: bool, X: torch.Tensor, y: torch.Tensor):
    """One training step of the reference MLP (forward, backward, SGD step), in float32 or under
    bf16 autocast, as a function of nothing: each dtype has its own model, from seed 0."""
    torch.manual_seed(0)
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def step() -> None:
        optimizer.zero_grad()
        with autocast(bf16):
            loss = F.cross_entropy(model(X).float(), y)
        loss.backward()
        optimizer.step()

    return step


def _cpu_seconds(fn) -> float:
    """This thread's CPU seconds of one call of ``fn()``."""
    started = time.thread_time()
    fn()
    return time.thread_time() - started


def paired_seconds(pairs: int = 10, batch: int = 256, step: bool = True,
                   warmup: int = 1) -> list[dict[str, float]]:  # fmt: skip
    """This thread's CPU seconds of one product of a batch by a 1024x1024 matrix, in float32
    then in bf16, ``pairs`` times in turn (float32, bf16, float32, bf16, ...) after ``warmup``
    untimed pairs; with ``step``, then the reference MLP's training step the same way, in
    float32 and under autocast (one more warm-up: its first allocates the gradients). One row
    per pair. A pair's two calls run a moment apart, under the same load, so their ratio is
    what a shared machine disturbs least; the spread of the ratios shows how much it does."""
    if pairs < 1 or warmup < 0:
        raise ValueError(f"pairs must be at least 1 and warmup at least 0, got {pairs} and "
                         f"{warmup}")  # fmt: skip
    torch.manual_seed(0)
    a, b = torch.randn(batch, 1024), torch.randn(1024, 1024)
    a16, b16 = a.bfloat16(), b.bfloat16()
    timed = {"matmul": (lambda: a @ b, lambda: a16 @ b16, warmup)}
    if step:
        X, y = torch.randn(batch, 561), torch.randint(0, 6, (batch,))
        timed["step"] = (_train_step(False, X, y), _train_step(True, X, y), warmup + 1)
    rows: list[dict[str, float]] = [{"pair": i} for i in range(pairs)]
    for name, (f32, bf16, untimed) in timed.items():
        for i in range(untimed + pairs):
            seconds = (_cpu_seconds(f32), _cpu_seconds(bf16))  # float32 first, then bf16
            if i >= untimed:
                rows[i - untimed].update({f"{name}_f32_cpu_s": seconds[0],
                                          f"{name}_bf16_cpu_s": seconds[1]})  # fmt: skip
    return rows


# oneDNN's names for the instruction sets it may be capped at (ONEDNN_MAX_CPU_ISA), with the
# processors that stop there
ISA_CAPS = {
    "": "this processor, uncapped",
    "AVX512_CORE": "AVX-512 without BF16 (Skylake-SP, Ice Lake)",
    "AVX2": "AVX2 (Haswell to Zen 3)",
}


def isa_worker(rank: int, world_size: int, caps: list[str], pairs: int = 10,
               slow_pairs: int = 3) -> list[dict]:  # fmt: skip
    """Each rank in turn (the others wait at a barrier) caps the instruction sets oneDNN, the
    library behind PyTorch's CPU matrix products, may use (``ONEDNN_MAX_CPU_ISA``, read at its
    first product, so set in a fresh process) and times float32 and bf16 products in
    interleaved pairs (``paired_seconds``), and on the uncapped rank the training step too: the
    same code on older processors. One rank per cap. Where oneDNN cannot take a bf16 product
    (PyTorch's own kernels: many times slower), ``slow_pairs`` pairs and no warm-up."""
    import os

    import torch.distributed as dist

    cap = caps[rank]
    if cap:
        os.environ["ONEDNN_MAX_CPU_ISA"] = cap
    rows = []
    for turn in range(world_size):
        dist.barrier()
        if turn == rank:
            onednn_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
            timed = paired_seconds(pairs if onednn_bf16 else slow_pairs, step=not cap,
                                   warmup=1 if onednn_bf16 else 0)  # fmt: skip
            rows += [{"cap": cap, "onednn_bf16": onednn_bf16, **row} for row in timed]
    return rows


def bf16_ratios(rows: list[dict]) -> pd.DataFrame:
    """``isa_worker``'s rows as one row per cap and timed call (the product, the step): the
    pairs, the median CPU milliseconds of each dtype, and the median, min and max over the
    pairs of bf16's time over float32's (below 1: bf16 faster)."""
    table = pd.DataFrame(rows)
    out = []
    for cap, timed in table.groupby("cap", sort=False):
        for name, what in (("matmul", "product"), ("step", "training step")):
            if f"{name}_f32_cpu_s" not in timed or timed[f"{name}_f32_cpu_s"].isna().all():
                continue
            f32, bf16 = timed[f"{name}_f32_cpu_s"], timed[f"{name}_bf16_cpu_s"]
            ratio = bf16 / f32
            out.append({"processor": ISA_CAPS.get(cap, cap), "timed": what, "pairs": len(ratio),
                        "float32 ms": 1e3 * f32.median(), "bf16 ms": 1e3 * bf16.median(),
                        "bf16/float32": ratio.median(), "min": ratio.min(),
                        "max": ratio.max()})  # fmt: skip
    return pd.DataFrame(out).set_index(["processor", "timed"])


def saved_bytes(bf16: bool, batch: int = 256) -> dict[str, int]:
    """Bytes autograd saves for the backward of one forward of the reference MLP: activations,
    and the weight copies autocast makes (``saved_activations.SavedActivations``)."""
    torch.manual_seed(0)
    model = make_mlp()
    meter = SavedActivations(list(model.parameters()))
    with meter.hooks(), autocast(bf16):
        output = model(torch.randn(batch, 561))
    del output
    return {"activations": meter.peak_bytes, "weight copies": meter.peak_copy_bytes}


def bytes_per_parameter(mixed: bool, optimizer: str = "adam") -> dict[str, int]:
    """Bytes a worker keeps per parameter (Hugging Face's Ultra-Scale Playbook): in float32,
    4 for the weight, 4 for its gradient, and Adam's two float32 moments; in mixed precision
    2 + 2 for the bf16 weight and gradient, and 12 more for the float32 master weight and the
    moments: the same 16 bytes. Mixed precision saves compute, activations and traffic, not
    this."""
    moments = {"sgd": 0, "momentum": 4, "adam": 8}[optimizer]
    if not mixed:
        return {"parameters": 4, "gradients": 4, "master weights": 0, "optimizer": moments}
    return {"parameters": 2, "gradients": 2, "master weights": 4, "optimizer": moments}


def held_per_parameter(mixed: bool, adam_on_bf16: bool = False) -> dict[str, float]:
    """Bytes per parameter held after one Adam step of the reference MLP, read from the tensors
    (``memory.state_bytes``; Adam's step counts, 4 bytes per tensor, included). In float32, the
    model, its gradients and Adam. Mixed, as the Playbook counts it: a bf16 model computes the
    forward and backward, so its weights and gradients are bf16; Adam updates a float32 master
    copy, its moments in the master's dtype, and the result is copied back into the bf16 model.
    ``adam_on_bf16`` is the mistake of giving Adam the bf16 model itself: its moments are bf16."""
    torch.manual_seed(0)
    model = make_mlp()
    X, y = torch.randn(64, 561), torch.randint(0, 6, (64,))
    if not mixed:
        optimizer = torch.optim.Adam(model.parameters())
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
        held = state_bytes(model, optimizer)
        held["master weights"] = 0
    else:
        master = [p.detach().clone().requires_grad_() for p in model.parameters()]
        model = model.to(torch.bfloat16)
        optimizer = torch.optim.Adam(model.parameters() if adam_on_bf16 else master)
        F.cross_entropy(model(X.to(torch.bfloat16)).float(), y).backward()
        if not adam_on_bf16:
            for weight, p in zip(master, model.parameters(), strict=True):
                weight.grad = p.grad.float()  # for the step only, then dropped
            optimizer.step()
            with torch.no_grad():
                for weight, p in zip(master, model.parameters(), strict=True):
                    p.copy_(weight)
                    weight.grad = None
        else:
            optimizer.step()
        held = state_bytes(model, optimizer)
        held["master weights"] = 0 if adam_on_bf16 else sum(local_bytes(w) for w in master)
    n = sum(p.numel() for p in model.parameters())
    return {"parameters": held["parameters"] / n, "gradients": held["gradients"] / n,
            "master weights": held["master weights"] / n,
            "optimizer": held["optimizer_state"] / n}  # fmt: skip


# --------------------------------------------------------------------------- accuracy


def train_precision(seed: int, bf16: bool, epochs: int, global_batch: int, lr: float,
                    data: str | None) -> dict:  # fmt: skip
    """The reference training (SGD, the course's data order) from ``seed``, its forward and
    loss under bf16 autocast or not; the test accuracy, evaluated in the same precision, and
    which test samples it got right (for a paired test of two trainings, McNemar's)."""
    har = load_har(data, download=False)
    X, y = torch.from_numpy(har.X_train), torch.from_numpy(har.y_train)
    torch.manual_seed(seed)
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        order = epoch_order(len(X), epoch)
        for i in range(len(X) // global_batch):
            idx = order[i * global_batch : (i + 1) * global_batch]
            optimizer.zero_grad()
            with autocast(bf16):
                loss = F.cross_entropy(model(X[idx]).float(), y[idx])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    X_test, y_test = torch.from_numpy(har.X_test), torch.from_numpy(har.y_test)
    with autocast(bf16):
        correct = correct_per_sample(model, X_test, y_test)
    return {"seed": seed, "bf16": bf16, "accuracy": correct.float().mean().item(),
            "correct": correct.numpy(), "losses": losses}  # fmt: skip


def precision_worker(rank: int, world_size: int, seeds: list[int], epochs: int = 5,
                     global_batch: int = 256, lr: float = 0.05,
                     data: str | None = None) -> list[dict]:  # fmt: skip
    """This rank's share of the seeds, each trained in float32 and in bf16: independent
    trainings, spread over the workers only to use every core."""
    return [train_precision(seed, bf16, epochs, global_batch, lr, data)
            for seed in seeds[rank::world_size] for bf16 in (False, True)]  # fmt: skip


# --------------------------------------------------------------------------- across workers


def _steps(model: nn.Module, spec: Steps, X, y, rank: int, world: int, bf16: bool) -> list:
    """``spec``'s steps on this rank's slice; the collectives of the last one, counted."""
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    calls: list = []
    for idx in spec.batches(len(X)):
        mine = local_slice(idx, rank, world)
        optimizer.zero_grad()
        with CollectiveCounter() as counter:
            with autocast(bf16):
                loss = F.cross_entropy(model(X[mine]).float(), y[mine])
            loss.backward()
        calls = counter.calls
        optimizer.step()
    return calls


def _dtypes(model: nn.Module) -> dict[str, str]:
    p = next(model.parameters())
    local = p.to_local() if hasattr(p, "to_local") else p
    return {"parameter": str(local.dtype).replace("torch.", ""),
            "gradient": str(p.grad.dtype).replace("torch.", "") if p.grad is not None else "-"}


def _whole(model: nn.Module) -> np.ndarray:
    return np.concatenate([(p.full_tensor() if hasattr(p, "full_tensor") else p)
                           .detach().double().numpy().ravel() for p in model.parameters()])


def fsdp_mp_worker(rank: int, world_size: int, spec: Steps) -> dict:
    """``spec``'s steps as data parallelism in five precisions: DDP in float32 and under bf16
    autocast; FSDP2 in float32, with bf16 parameters and float32 reductions, and all in bf16
    (``MixedPrecisionPolicy``). For each: the dtypes held, the bytes held (``state_bytes``),
    the last step's collectives, the final weights' gap to one worker in float32, or the error
    it stopped with."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    X, y = spec.data_tensors()
    reference = one_worker(spec, X, y)
    policies = {
        "FSDP2 fp32": None,
        "FSDP2 bf16 params, fp32 reduce": MixedPrecisionPolicy(torch.bfloat16, torch.float32),
        "FSDP2 bf16 params, bf16 reduce": MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16),
    }
    report = {}
    for name in ("DDP fp32", "DDP autocast bf16", *policies):
        try:
            model = spec.model()
            if name.startswith("DDP"):
                model = DDP(model)
            else:
                policy = policies[name] or MixedPrecisionPolicy()
                for layer in model:
                    if isinstance(layer, nn.Linear):
                        fully_shard(layer, mp_policy=policy)
                fully_shard(model, mp_policy=policy)
            calls = _steps(model, spec, X, y, rank, world_size, name == "DDP autocast bf16")
            plain = model.module if isinstance(model, DDP) else model
            weights = _whole(plain)
            report[name] = {"calls": calls, "dtypes": _dtypes(plain),
                            "held": state_bytes(plain, None),
                            "gap": gaps({"weights": weights}, {"weights": reference["weights"]})
                            ["weights"], "error": None}  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - what the backend refuses is the lesson
            report[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    return report

