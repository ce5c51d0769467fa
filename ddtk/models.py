"""Small models shared by the notebooks, tests and benchmarks.

They are sized for a laptop: a training step on digits takes milliseconds on
one core, so a 4-rank run finishes in seconds and still shows the real
behaviour (communication, stragglers, convergence).

>>> from ddtk.models import build_model
>>> model = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=0)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MLP", "MODELS", "LinearModel", "SmallCNN", "build_model", "count_parameters"]


class MLP(nn.Sequential):
    """Flatten, then ``Linear -> ReLU`` per hidden layer, then a linear head."""

    def __init__(self, input_dim: int, hidden_dims: Sequence[int] = (64, 32), output_dim: int = 10):
        layers: list[nn.Module] = [nn.Flatten()]
        widths = [input_dim, *hidden_dims]
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], output_dim))
        super().__init__(*layers)


class SmallCNN(nn.Sequential):
    """Two 3x3 convolutions and two linear layers, for 1x8x8 digits (38,282 parameters at the defaults)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16, side: int = 8):
        super().__init__(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (side // 2) ** 2, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )


class LinearModel(nn.Sequential):
    """Flatten and one linear layer: logistic or linear regression, with a convex loss."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__(nn.Flatten(), nn.Linear(input_dim, output_dim))


MODELS = ("mlp", "cnn", "linear")


def build_model(
    name: str,
    input_shape: Sequence[int] = (1, 8, 8),
    num_classes: int = 10,
    seed: int | None = 0,
    hidden_dims: Sequence[int] = (64, 32),
) -> nn.Module:
    """Build a model by name with seeded initial weights (the same on every rank for the same seed).

    ``name`` is ``"mlp"``, ``"cnn"`` (needs a ``(C, H, W)`` input shape) or
    ``"linear"``. ``num_classes`` is the output width (1 for regression).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if seed is not None:
        torch.manual_seed(seed)
    input_dim = math.prod(input_shape)
    if name == "mlp":
        return MLP(input_dim, hidden_dims, num_classes)
    if name == "linear":
        return LinearModel(input_dim, num_classes)
    if len(input_shape) != 3 or input_shape[1] != input_shape[2] or input_shape[1] < 2:
        raise ValueError(
            "the cnn needs a square (channels, side, side) input shape with side >= 2, "
            f"got {tuple(input_shape)}"
        )
    return SmallCNN(input_shape[0], num_classes, side=input_shape[1])


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
