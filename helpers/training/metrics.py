"""What a trained model is judged by: test accuracy, and checksums that compare replicas."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from helpers.data import HARData


def weights_checksum(model: nn.Module) -> float:
    """Sum of every weight in float64, as in the reference article: equal replicas, equal sums."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))

def weights_digest(model: nn.Module) -> str:
    """SHA-256 of every weight's bytes: replicas are identical only if these match exactly."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

def final_weights(model: nn.Module) -> np.ndarray:
    """Every weight flattened into one float64 vector, for comparing two trainings."""
    return np.concatenate([p.detach().double().numpy().ravel() for p in model.parameters()])

@torch.no_grad()
def correct_per_sample(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """For each sample, whether its highest-scoring class is the label (a paired test of two
    models, McNemar's, needs this, not only the fraction)."""
    model.eval()
    with torch.no_grad():
        correct = model(X).argmax(dim=1) == y
    model.train()
    return correct


def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of samples whose highest-scoring class is the label."""
    return correct_per_sample(model, X, y).float().mean().item()

def accuracy_on_test(data: HARData) -> Callable[[nn.Module], float]:
    """A function giving a model's accuracy on the test split."""
    X_test, y_test = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    return lambda model: accuracy(model, X_test, y_test)
