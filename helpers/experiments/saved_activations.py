"""What autograd keeps for the backward, counted while it keeps it: the activations of each
micro-batch (notebook 09: a pipeline stage's, under GPipe and 1F1B) and the low-precision copies
of the weights autocast saves, through ``torch.autograd.graph.saved_tensors_hooks``."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks


class _Held:
    """A saved tensor, counted while the autograd graph keeps it (released with the graph)."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor: torch.Tensor, key: tuple, meter: SavedActivations):
        self.tensor, self.key, self.meter = tensor, key, meter
        meter._take(key, tensor)

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedActivations:
    """The tensors an autograd graph saves for its backward, per micro-batch, and their peak:
    the bytes of activations, of weight copies, and the number of micro-batches whose
    activations are alive at once.

    The parameters themselves (every ``Linear`` saves its weight for its input gradient) are
    left out: they are held anyway. A saved tensor of a weight's shape (or its transpose's) but
    another storage is a *weight copy* (autocast's bf16 weights), counted apart. A tensor saved
    twice (a ReLU's output is also the next layer's input) counts once, and a view (a
    micro-batch of the input batch) counts its own elements, not its storage's."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        weights = [tuple(p.shape) for p in params if p.dim() == 2]
        self.shapes = set(weights) | {shape[::-1] for shape in weights}  # addmm saves w.t()
        # (micro-batch, address, elements, copy?): [references, bytes]
        self.live: dict[tuple, list[int]] = {}
        self.peak_bytes = 0  # activations
        self.peak_copy_bytes = 0  # weight copies
        self.peak_micro_batches = 0

    def hooks(self, micro_batch: int = 0) -> saved_tensors_hooks:
        """The hooks to record a forward under: ``with meter.hooks(i): output = model(x)``."""

        def pack(tensor: torch.Tensor) -> Any:
            if tensor.untyped_storage().data_ptr() in self.params:
                return tensor
            copy = tuple(tensor.shape) in self.shapes
            return _Held(tensor, (micro_batch, tensor.data_ptr(), tensor.numel(), copy), self)

        def unpack(held: Any) -> torch.Tensor:
            return held.tensor if isinstance(held, _Held) else held

        return saved_tensors_hooks(pack, unpack)

    def _take(self, key: tuple, tensor: torch.Tensor) -> None:
        entry = self.live.setdefault(key, [0, tensor.numel() * tensor.element_size()])
        entry[0] += 1
        copies = sum(e[1] for k, e in self.live.items() if k[3])
        self.peak_copy_bytes = max(self.peak_copy_bytes, copies)
        activations = sum(e[1] for k, e in self.live.items() if not k[3])
        self.peak_bytes = max(self.peak_bytes, activations)
        alive = {k[0] for k in self.live if not k[3]}
        self.peak_micro_batches = max(self.peak_micro_batches, len(alive))

    def _release(self, key: tuple) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                del self.live[key]
