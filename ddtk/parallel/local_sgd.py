"""Local SGD: every rank takes H optimiser steps on its own data, then the models are averaged.

Stich, "Local SGD Converges Fast and Communicates Little" (ICLR 2019); Lin et al.,
"Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020). Synchronous data
parallelism all-reduces the gradients after every step. Local SGD all-reduces the
*parameters* only every ``H`` steps (``sync_every``), which cuts communication by a
factor of H. With ``H = 1`` and plain SGD, averaging the models
``w - lr * g_i`` gives ``w - lr * mean(g_i)``: exactly one synchronous step on the
concatenated batch. Lin et al.'s *post-local SGD* starts with ``H = 1`` for
``warmup_steps`` steps and only then goes local.

Optimiser state (momentum buffers) stays local; only the parameters are averaged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddtk.parallel.trainer import DistributedTrainer

__all__ = ["LocalSGD"]


class LocalSGD(DistributedTrainer):
    """Local SGD with parameter averaging (an all-reduce) every ``sync_every`` steps.

    Args:
        sync_every: H, local steps between two averagings (1 = synchronous SGD).
        warmup_steps: average after every step for this many first steps (post-local SGD).
        average_at_epoch_end: also average at the end of an epoch if steps are pending,
            so that evaluation and checkpoints see one model.
        Other arguments as for :class:`~ddtk.parallel.trainer.DistributedTrainer`.

    The initial model is broadcast from rank 0. Every rank must take the same number
    of steps per epoch (equal local data sizes), because averaging is a collective.

    Example:
        >>> import ddtk
        >>> from ddtk.data import DataPartitioner, load_dataset
        >>> from ddtk.models import build_model
        >>> from ddtk.parallel.local_sgd import LocalSGD
        >>> def run(ctx):
        ...     ds = load_dataset("digits")
        ...     part = DataPartitioner(1792, ctx.world_size, "shuffled").get_indices(ctx.rank)
        ...     x, y = ds.subset(part)
        ...     trainer = LocalSGD(ctx, build_model("mlp"), lr=0.1, batch_size=16, sync_every=8)
        ...     trainer.fit(x, y, epochs=5)
        ...     return trainer.sync_count, trainer.evaluate(x, y)["accuracy"]
        >>> syncs, acc = ddtk.launch(run, world_size=2)[0]
        >>> syncs, acc > 0.9   # 5 epochs x 56 steps / 8
        (35, True)
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Module,
        lr: float = 0.05,
        batch_size: int = 32,
        sync_every: int = 4,
        warmup_steps: int = 0,
        average_at_epoch_end: bool = True,
        **kwargs: Any,
    ):
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"sync_every (H) must be an integer >= 1, got {sync_every!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        super().__init__(ctx, model, lr=lr, batch_size=batch_size, **kwargs)
        self.sync_every, self.warmup_steps = sync_every, warmup_steps
        self.average_at_epoch_end = average_at_epoch_end
        self.sync_count = 0  # all-reduces of the parameters so far
        self.pending_steps = 0  # local steps since the last averaging
        self.set_parameters(ctx.broadcast(self.get_parameters(), root=0))

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One local SGD step; average the models when H local steps have accumulated."""
        self.optimizer.zero_grad()
        loss = self.local_loss(x, y)
        loss.backward()
        self.optimizer.step()
        self.pending_steps += 1
        period = 1 if self.step_count < self.warmup_steps else self.sync_every
        if self.pending_steps >= period:
            self.average()
        return loss.item()

    def average(self) -> None:
        """Replace every rank's parameters by their mean over the ranks (one all-reduce)."""
        self.set_parameters(self.ctx.all_reduce(self.get_parameters(), op="avg"))
        self.sync_count += 1
        self.pending_steps = 0

    def end_epoch(self) -> None:
        """Average the steps left over since the last averaging, if ``average_at_epoch_end``."""
        if self.average_at_epoch_end and self.pending_steps:
            self.average()

    def train_epoch(self, local_data: torch.Tensor, local_labels: torch.Tensor) -> dict[str, float]:
        """One local pass over this rank's data; the metrics add ``syncs`` (all-reduces so far)."""
        return super().train_epoch(local_data, local_labels) | {"syncs": self.sync_count}
