"""Gradient accumulation: one optimiser step from several micro-batches.

When a batch does not fit in memory, split it into ``k`` micro-batches, run
forward and backward on each (gradients add up in ``param.grad``) and step the
optimiser once. For the result to equal the step on the whole batch, each
micro-batch's mean loss is weighted by its share of the samples,
``len(micro) / len(batch)`` (``1/k`` when they are equal), so the summed
gradient is the gradient of the batch's mean loss even when the sizes differ.

With :class:`~ddtk.parallel.data_parallel.DataParallel`, averaging gradients
after every micro-batch would send ``k`` times the bytes for nothing: all but
the last backward run inside ``dp.no_sync()``, and the last one averages the
accumulated sum across ranks, as with DDP. Each rank weights by its own batch,
so the step equals one process on the concatenated global batch when every
rank's batch has the same size (the usual data-parallel contract).

>>> import torch
>>> from ddtk.models import build_model
>>> from ddtk.parallel.accumulation import GradientAccumulator
>>> model = build_model("mlp", seed=0)
>>> acc = GradientAccumulator(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=4)
>>> x, y = torch.randn(10, 1, 8, 8), torch.randint(0, 10, (10,))
>>> loss = acc.step(x, y)          # micro-batches of 3, 3, 2 and 2 samples, one SGD step
>>> [len(mb) for mb, _ in acc.split(x, y)]
[3, 3, 2, 2]
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ddtk.parallel.trainer import loss_function

__all__ = ["GradientAccumulator"]


class GradientAccumulator:
    """Accumulate gradients over ``steps`` micro-batches per optimiser step.

    Args:
        model: the module to train (``dp.model`` with DataParallel).
        optimizer: its optimiser.
        steps: number of micro-batches :meth:`step` splits a batch into.
        loss: ``"cross_entropy"`` or ``"mse"``, as for the trainers.
        data_parallel: a :class:`~ddtk.parallel.data_parallel.DataParallel` wrapping
            ``model``; its ``no_sync()`` skips the averaging of all but the last micro-batch.

    ``micro_batches_seen`` and ``optimizer_steps`` count what was done.

    Example on two ranks (rank 0's weights are broadcast, each rank feeds its own data)::

        >>> import ddtk
        >>> def train(ctx):
        ...     from ddtk.models import build_model
        ...     from ddtk.parallel.data_parallel import DataParallel
        ...     dp = DataParallel(ctx, build_model("mlp", seed=0), lr=0.1)
        ...     acc = GradientAccumulator.from_data_parallel(dp, steps=2)
        ...     g = torch.Generator().manual_seed(ctx.rank)
        ...     acc.step(torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g))
        ...     return dp.stats["reductions"]            # one averaging per bucket, not two
        >>> ddtk.launch(train, world_size=2, echo=False, timeout=120)
        [[1], [1]]
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        steps: int,
        loss: str = "cross_entropy",
        data_parallel: Any = None,
    ):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        if data_parallel is not None and data_parallel.model is not model:
            raise ValueError("data_parallel must wrap the same model object that is given")
        self.model, self.optimizer, self.steps = model, optimizer, steps
        self.loss_fn = loss_function(loss)
        self.data_parallel = data_parallel
        self.micro_batches_seen = 0
        self.optimizer_steps = 0

    @classmethod
    def from_data_parallel(cls, dp: Any, steps: int) -> GradientAccumulator:
        """An accumulator over a DataParallel trainer's model, optimiser and loss."""
        return cls(dp.model, dp.optimizer, steps, loss=dp.loss_name, data_parallel=dp)

    def split(self, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(x, y)`` cut into ``steps`` consecutive micro-batches (sizes differ by at most one)."""
        if len(x) != len(y):
            raise ValueError(f"data and labels differ in length: {len(x)} samples, {len(y)} labels")
        if len(y) < self.steps:
            raise ValueError(f"a batch of {len(y)} samples cannot make {self.steps} micro-batches")
        return list(
            zip(torch.tensor_split(x, self.steps), torch.tensor_split(y, self.steps), strict=True)
        )

    def backward(self, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """Forward and backward on each micro-batch, adding to ``param.grad``; returns the batch's mean loss.

        Each micro-batch's loss is weighted by its share of the samples. With
        DataParallel only the last backward averages across ranks.
        """
        sizes = [len(y) for _, y in micro_batches]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"need at least one non-empty micro-batch, got sizes {sizes}")
        total, loss_sum = sum(sizes), 0.0
        for i, (x, y) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            sync = (
                contextlib.nullcontext()
                if self.data_parallel is None or last
                else self.data_parallel.no_sync()
            )
            with sync:
                loss = self.loss_fn(self.model(x), y)
                (loss * (len(y) / total)).backward()
            loss_sum += loss.item() * len(y)
            self.micro_batches_seen += 1
        return loss_sum / total

    def step_micro_batches(
        self, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> float:
        """Zero the gradients, accumulate over ``micro_batches``, step the optimiser once."""
        self.optimizer.zero_grad()
        loss = self.backward(micro_batches)
        self.optimizer.step()
        self.optimizer_steps += 1
        return loss

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimiser step on the batch ``(x, y)``, split into ``steps`` micro-batches."""
        return self.step_micro_batches(self.split(x, y))
