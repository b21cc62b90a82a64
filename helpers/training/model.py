"""The reference model: a 561-1024-1024-6 ReLU MLP for the 561 UCI HAR features."""

from __future__ import annotations

from torch import nn

N_FEATURES = 561
N_CLASSES = 6
HIDDEN = 1024


def make_mlp(
    n_features: int = N_FEATURES,
    hidden: int = HIDDEN,
    n_classes: int = N_CLASSES,
    hidden_layers: int = 2,
) -> nn.Sequential:
    """Build the reference MLP (or a wider or deeper one). Seed torch (``torch.manual_seed(0)``)
    before calling it so that every worker starts from the same weights."""
    if hidden_layers < 1 or hidden < 1:
        raise ValueError(f"an MLP needs at least 1 hidden layer of width at least 1, got "
                         f"{hidden_layers} of width {hidden}")
    layers: list[nn.Module] = [nn.Linear(n_features, hidden), nn.ReLU()]
    for _ in range(hidden_layers - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, n_classes))


def parameter_count(
    n_features: int = N_FEATURES,
    hidden: int = HIDDEN,
    n_classes: int = N_CLASSES,
    hidden_layers: int = 2,
) -> int:
    """Parameters of ``make_mlp`` with these sizes, counted from its shape: no model is built, so
    no random numbers are drawn (a module constant computed at import must not move the seed)."""
    widths = [n_features] + [hidden] * hidden_layers + [n_classes]
    return sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))


# The reference MLP's float32 gradients, all-reduced every step: 4 bytes a parameter, 6,524,952
GRADIENT_BYTES = 4 * parameter_count()


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (1,631,238 for the reference MLP)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of gradient data parallelism all-reduces every step (float32: 4 per parameter)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
