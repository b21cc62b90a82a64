"""Which parallelism when (notebook 09, section 4): for an MLP of given widths, a global batch,
``N`` workers, a link ``t = alpha + beta * bytes`` (notebooks 02 and 05) and a memory per worker,
what data parallelism (DDP), FSDP, tensor parallelism (Megatron's pairs) and pipeline
parallelism (1F1B, balanced stages) each send, hold and cost per training step.

The byte counts are the ones notebook 09 counts through the dispatcher for the course's MLP;
the times are a model: compute divided by ``N`` (and stretched by the pipeline's bubble), plus
every message's ``alpha + beta * bytes`` with no overlap, an upper bound where DDP and FSDP hide
some of it behind the backward (notebook 07)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from helpers.dist.comm_model import AlphaBeta, ring_factor
from helpers.experiments.memory import STATE_COPIES

STRATEGIES = ("data (DDP)", "FSDP", "tensor", "pipeline")


@dataclass(frozen=True)
class Workload:
    """An MLP (input, hidden..., output widths), trained at ``global_batch`` with ``optimizer``
    in float32, its step computing ``seconds_per_sample_parameter`` per sample and parameter on
    one worker (forward, backward and update: about 6 floating-point operations)."""

    widths: tuple[int, ...]
    global_batch: int
    seconds_per_sample_parameter: float
    optimizer: str = "adam"
    value_bytes: int = 4

    @property
    def layers(self) -> list[tuple[int, int]]:
        return list(zip(self.widths, self.widths[1:], strict=False))

    @property
    def parameters(self) -> int:
        return sum(a * b + b for a, b in self.layers)

    def state_bytes(self, parameters: float) -> float:
        """Parameters, gradients and optimizer state of ``parameters`` parameters."""
        return (2 + STATE_COPIES[self.optimizer]) * self.value_bytes * parameters


def tensor_messages(work: Workload) -> list[int]:
    """Bytes of every all-reduce of one step under ``tensor_parallel.megatron_plan``: per pair
    of hidden layers, the row-parallel layer's output in the forward, and the pair's input
    gradient in the backward, except where the input is the data."""
    hidden = len(work.layers) - 1  # the output layer stays whole
    messages = []
    for first in range(0, hidden - hidden % 2, 2):
        messages.append(work.global_batch * work.widths[first + 2] * work.value_bytes)
        if first > 0:
            messages.append(work.global_batch * work.widths[first] * work.value_bytes)
    return messages


def _tensor_sharded(work: Workload) -> int:
    """Parameters the plan splits: every weight of a pair, and the column-parallel layer's bias
    (the row-parallel layer's bias stays whole: DTensor adds a 1/N share of it on each worker
    before the all-reduce, Megatron-LM all of it after)."""
    hidden = len(work.layers) - 1
    return sum(a * b + (b if i % 2 == 0 else 0)
               for i, (a, b) in enumerate(work.layers[: hidden - hidden % 2]))  # fmt: skip


def _pipeline_boundaries(work: Workload, stages: int) -> list[int]:
    """Where balanced stages cut the layers: the widths of the activations that cross."""
    per_layer = [a * b + b for a, b in work.layers]
    cuts, done, target = [], 0, work.parameters / stages
    for i, p in enumerate(per_layer[:-1]):
        done += p
        if len(cuts) < stages - 1 and done >= target * (len(cuts) + 1):
            cuts.append(work.widths[i + 1])
    while len(cuts) < stages - 1:  # fewer layers than stages: not a real split
        cuts.append(work.widths[-2])
    return cuts


def costs(work: Workload, workers: int, link: AlphaBeta, memory_bytes: float,
          micro_batches: int = 8) -> pd.DataFrame:  # fmt: skip
    """One row per strategy at ``workers``: bytes each worker sends per step (on a ring, the
    most-sending stage for the pipeline), messages per step, bytes of parameters, gradients and
    optimizer state it holds and whether they fit ``memory_bytes``, and the modelled seconds of
    compute, communication and the step."""
    n, P, v = workers, work.parameters, work.value_bytes
    compute = work.seconds_per_sample_parameter * work.global_batch * P
    ring = ring_factor(n)
    per_layer_calls = len(work.layers)
    tp_messages = tensor_messages(work)
    cuts = _pipeline_boundaries(work, n)
    pp_message = work.global_batch * max(cuts, default=0) * v
    pp_sends = (2 if n > 2 else 1) * pp_message if n > 1 else 0
    bubble = (n - 1) / (micro_batches + n - 1)
    rows = {
        "data (DDP)": (ring * v * P, 1, work.state_bytes(P), compute / n),
        "FSDP": (1.5 * ring * v * P, 3 * per_layer_calls, work.state_bytes(P / n), compute / n),
        "tensor": (ring * sum(tp_messages), len(tp_messages),
                   work.state_bytes(P - _tensor_sharded(work) * (1 - 1 / n)),
                   compute * (1 - _tensor_sharded(work) / P * (1 - 1 / n))),
        "pipeline": (pp_sends, (2 if n > 2 else 1) * micro_batches if n > 1 else 0,
                     work.state_bytes(P / n), compute / n / (1 - bubble)),
    }  # fmt: skip
    table = []
    for name, (sent, calls, held, seconds) in rows.items():
        comm = calls * link.alpha + link.beta * sent if n > 1 else 0.0
        table.append({"strategy": name, "sent MB": sent / 1e6, "messages": calls,
                      "held MB": held / 1e6, "fits": held <= memory_bytes,
                      "compute ms": 1e3 * seconds, "communication ms": 1e3 * comm,
                      "step ms": 1e3 * (seconds + comm)})  # fmt: skip
    return pd.DataFrame(table).set_index("strategy")


def sweep_links(work: Workload, workers: int, bandwidths: list[float], alpha: float,
                memory_bytes: float, micro_batches: int = 8) -> pd.DataFrame:  # fmt: skip
    """Modelled step time of each strategy at each link bandwidth (bytes per second), with the
    latency ``alpha``: one row per bandwidth, one column per strategy (NaN where it does not
    fit the memory)."""
    rows = []
    for bandwidth in bandwidths:
        table = costs(work, workers, AlphaBeta(alpha, 1 / bandwidth), memory_bytes, micro_batches)
        step = table["step ms"].where(table["fits"])
        rows.append({"bandwidth": bandwidth, **step.to_dict()})
    return pd.DataFrame(rows).set_index("bandwidth")
