"""What every torch recipe of the CNN shares, so each recipe file holds only what its framework changes.

The recipes (``cnn_single``, ``cnn_ddp``, ``cnn_horovod``, ``cnn_deepspeed``,
``cnn_ddtk``) take the same command line, warm the learning rate up the same way
and evaluate the same way; their ``main`` functions are where they differ, and
:func:`ddtk.frameworks.recipes.lines_changed` counts exactly that.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def build_parser(description: str) -> argparse.ArgumentParser:
    """The command line shared by every recipe (sizes are per process)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="samples per process per step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate for one process")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--checkpoint", default=None, help="save the final model here")
    p.add_argument("--json", default=None, help="write the final metrics here")
    return p


def parse_checked(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv`` and refuse values no recipe can train with, naming the flags."""
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or args.warmup_epochs < 0:
        p.error("--epochs and --batch-size must be >= 1, --lr > 0 and --warmup-epochs >= 0")
    return args


def warmup_lr(step: int, steps_per_epoch: int, lr: float, warmup_epochs: float) -> float:
    """Linear warm-up from ``lr / steps`` to ``lr`` over the first ``warmup_epochs``, then flat.

    >>> [round(warmup_lr(s, 4, 0.4, 1.0), 2) for s in range(6)]
    [0.1, 0.2, 0.3, 0.4, 0.4, 0.4]
    >>> warmup_lr(0, 4, 0.4, 0.0)
    0.4
    """
    warmup_steps = warmup_epochs * steps_per_epoch
    return lr if step >= warmup_steps else lr * (step + 1) / warmup_steps


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Summed cross-entropy and number of correct predictions on ``(x, y)``."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
    model.train()
    loss = nn.functional.cross_entropy(logits, y, reduction="sum").item()
    return loss, float((logits.argmax(1) == y).sum())
