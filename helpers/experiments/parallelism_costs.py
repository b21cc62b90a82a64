"""Which parallelism when (notebook 09, section 4): for an MLP of given widths, a global batch,
``N`` workers, a link ``t = alpha + beta * bytes`` (notebooks 02 and 05) and a memory per worker,
what data parallelism (DDP), FSDP, tensor parallelism (Megatron's pairs) and pipeline
parallelism (1F1B, the best-balanced stages the layers allow) each send, hold and cost per
training step.

The byte counts are the ones notebook 09 counts through the dispatcher for the course's MLP;
the times are a model: compute divided by ``N`` (and stretched by the pipeline's bubble), plus
every message's ``alpha + beta * bytes`` with no overlap, an upper bound where DDP and FSDP hide
some of it behind the backward (notebook 07)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import pandas as pd

from helpers.dist.comm_model import AlphaBeta, ring_factor
from helpers.experiments.memory import STATE_COPIES

STRATEGIES = ("data (DDP)", "FSDP", "tensor", "pipeline")


@dataclass(frozen=True)
class Workload:
    """An MLP (input, hidden..., output widths), trained at ``global_batch`` with ``optimizer``
    in float32, its step computing ``seconds_per_sample_parameter`` per sample and parameter on
    one worker (forward, backward and update: about 6 floating-point operations). Its state and
    what DDP and FSDP send are ``value_bytes`` per value; the activations that tensor and
    pipeline parallelism send are ``activation_bytes`` each (2 under bf16 autocast, which
    leaves the parameters and gradients float32), ``value_bytes`` if None."""

    widths: tuple[int, ...]
    global_batch: int
    seconds_per_sample_parameter: float
    optimizer: str = "adam"
    value_bytes: int = 4
    activation_bytes: int | None = None

    @property
    def activation_value_bytes(self) -> int:
        return self.value_bytes if self.activation_bytes is None else self.activation_bytes

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
        messages.append(work.global_batch * work.widths[first + 2] * work.activation_value_bytes)
        if first > 0:
            messages.append(work.global_batch * work.widths[first] * work.activation_value_bytes)
    return messages


def _tensor_sharded(work: Workload) -> int:
    """Parameters the plan splits: every weight of a pair, and the column-parallel layer's bias
    (the row-parallel layer's bias stays whole: DTensor adds a 1/N share of it on each worker
    before the all-reduce, Megatron-LM all of it after)."""
    hidden = len(work.layers) - 1
    return sum(a * b + (b if i % 2 == 0 else 0)
               for i, (a, b) in enumerate(work.layers[: hidden - hidden % 2]))  # fmt: skip


def pipeline_split(work: Workload, stages: int) -> tuple[list[int], list[int]]:
    """The cut of the layers into ``stages`` consecutive stages whose largest has the fewest
    parameters (a pipeline runs at its slowest stage's pace, and an MLP's compute per sample is
    its parameters'): the widths of the activations that cross each cut, and each stage's
    parameters. With fewer layers than stages, one layer per stage and the last cut's width
    repeated for the missing cuts (not a real split)."""
    sizes = [a * b + b for a, b in work.layers]
    groups = min(stages, len(sizes))
    prefix = [0, *itertools.accumulate(sizes)]

    @functools.cache
    def best(start: int, k: int) -> tuple[int, tuple[int, ...]]:
        """The largest stage and the cuts of layers ``start:`` into ``k`` stages."""
        if k == 1:
            return prefix[-1] - prefix[start], ()
        options = []
        for end in range(start + 1, len(sizes) - k + 2):
            largest, cuts = best(end, k - 1)
            options.append((max(prefix[end] - prefix[start], largest), (end, *cuts)))
        return min(options)

    cuts = list(best(0, groups)[1])
    bounds = [0, *cuts, len(sizes)]
    stage_parameters = [prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)]
    widths = [work.widths[c] for c in cuts]
    widths += [work.widths[-2]] * (stages - 1 - len(widths))
    return widths, stage_parameters


def costs(work: Workload, workers: int, link: AlphaBeta, memory_bytes: float,
          micro_batches: int = 8, gloo: bool = False) -> pd.DataFrame:  # fmt: skip
    """One row per strategy at ``workers``: bytes each worker sends per step (on a ring, the
    most-sending stage for the pipeline), messages per step, bytes of parameters, gradients and
    optimizer state it holds (the largest stage's for the pipeline) and whether they fit
    ``memory_bytes``, and the modelled seconds of compute, communication and the step. The
    pipeline's compute is its largest stage's, stretched by the bubble. ``gloo``: FSDP's
    reduce-scatter sends a whole all-reduce's bytes, as Gloo's does (notebook 08,
    tests/test_wire.py), not the ring's half."""
    n, P, v = workers, work.parameters, work.value_bytes
    compute = work.seconds_per_sample_parameter * work.global_batch * P
    ring = ring_factor(n)
    per_layer_calls = len(work.layers)
    tp_messages = tensor_messages(work)
    cuts, stage_parameters = pipeline_split(work, n)
    pp_message = work.global_batch * max(cuts, default=0) * work.activation_value_bytes
    largest_stage = max(stage_parameters)
    pp_sends = (2 if n > 2 else 1) * pp_message if n > 1 else 0
    bubble = (n - 1) / (micro_batches + n - 1)
    rows = {
        "data (DDP)": (ring * v * P, 1, work.state_bytes(P), compute / n),
        "FSDP": ((2.0 if gloo else 1.5) * ring * v * P, 3 * per_layer_calls,
                 work.state_bytes(P / n), compute / n),
        "tensor": (ring * sum(tp_messages), len(tp_messages),
                   work.state_bytes(P - _tensor_sharded(work) * (1 - 1 / n)),
                   compute * (1 - _tensor_sharded(work) / P * (1 - 1 / n))),
        "pipeline": (pp_sends, (2 if n > 2 else 1) * micro_batches if n > 1 else 0,
                     work.state_bytes(largest_stage), compute * largest_stage / P / (1 - bubble)),
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
                memory_bytes: float, micro_batches: int = 8,
                gloo: bool = False) -> pd.DataFrame:  # fmt: skip
    """Modelled step time of each strategy at each link bandwidth (bytes per second), with the
    latency ``alpha``: one row per bandwidth, one column per strategy (NaN where it does not
    fit the memory). ``gloo`` as in ``costs``."""
    rows = []
    for bandwidth in bandwidths:
        table = costs(work, workers, AlphaBeta(alpha, 1 / bandwidth), memory_bytes,
                      micro_batches, gloo)
        step = table["step ms"].where(table["fits"])
        rows.append({"bandwidth": bandwidth, **step.to_dict()})
    return pd.DataFrame(rows).set_index("bandwidth")
