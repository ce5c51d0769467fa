"""Elastic averaging SGD (EASGD): workers explore locally, held to a center by an elastic force.

Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD" (NeurIPS
2015). Each worker i keeps its own parameters x_i, and a center variable x~ is
shared by all of them. Every ``tau`` local SGD steps, worker and center pull
towards each other with the same force (the symmetric elastic update), with
``alpha = eta * rho``::

    d_i  = x_i - x~                  (computed from the values before the update)
    x_i <- x_i - alpha * d_i
    x~  <- x~  + alpha * sum_i d_i   (one all-reduce of the d_i)

This is synchronous EASGD: all workers exchange at the same time. Every rank keeps
an identical copy of x~, because the all-reduce gives every rank the same sum, so
no rank acts as a parameter server. The paper writes ``beta = p * alpha`` for the
center's moving rate and uses ``beta = 0.9``. That is the default here
(``alpha = 0.9 / world_size``). ``beta`` must stay <= 1; beyond that the center
would overshoot the workers' average. Small rho (a weak force) lets the workers
explore further from the center.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddtk.parallel.trainer import DistributedTrainer

__all__ = ["ElasticAveraging"]


class ElasticAveraging(DistributedTrainer):
    """Synchronous EASGD: local SGD steps, and an elastic exchange with the center every ``tau`` steps.

    Args:
        tau: local steps between two elastic updates (the communication period).
        rho: elastic coefficient; ``alpha = lr * rho``. Give ``rho`` or ``alpha``, not both;
            neither means ``alpha = 0.9 / world_size`` (the paper's beta = 0.9).
        alpha: the moving rate directly.
        Other arguments as for :class:`~ddtk.parallel.trainer.DistributedTrainer`.

    :meth:`evaluate` scores the center variable by default (the model EASGD returns);
    ``evaluate(x, y, use_center=False)`` scores each rank's own worker.

    Example:
        >>> import ddtk
        >>> from ddtk.data import DataPartitioner, load_dataset
        >>> from ddtk.models import build_model
        >>> from ddtk.parallel.elastic import ElasticAveraging
        >>> def run(ctx):
        ...     ds = load_dataset("digits")
        ...     x, y = ds.subset(DataPartitioner(len(ds), ctx.world_size, "shuffled").get_indices(ctx.rank))
        ...     easgd = ElasticAveraging(ctx, build_model("mlp"), lr=0.3, batch_size=16, tau=4)
        ...     easgd.fit(x[: len(x) // 16 * 16], y[: len(y) // 16 * 16], epochs=6)
        ...     return easgd.evaluate(x, y)["accuracy"]
        >>> ddtk.launch(run, world_size=3)[0] > 0.9
        True
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Module,
        lr: float = 0.05,
        batch_size: int = 32,
        tau: int = 4,
        rho: float | None = None,
        alpha: float | None = None,
        **kwargs: Any,
    ):
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau (communication period) must be an integer >= 1, got {tau!r}")
        if rho is not None and alpha is not None:
            raise ValueError("give rho (alpha = lr * rho) or alpha, not both")
        if rho is not None and rho <= 0:
            raise ValueError(f"rho must be > 0, got {rho}")
        alpha = lr * rho if rho is not None else alpha
        alpha = 0.9 / ctx.world_size if alpha is None else alpha
        if not 0 < alpha * ctx.world_size <= 1:
            raise ValueError(
                f"alpha must be > 0 with beta = world_size * alpha <= 1; got alpha={alpha:g}, "
                f"beta={alpha * ctx.world_size:g} for {ctx.world_size} workers"
            )
        super().__init__(ctx, model, lr=lr, batch_size=batch_size, **kwargs)
        self.tau, self.alpha = tau, alpha
        self.exchanges = 0  # elastic updates (all-reduces) so far
        self.pending_steps = 0  # local steps since the last elastic update
        self.center = ctx.broadcast(self.get_parameters(), root=0)
        self.set_parameters(self.center.clone())

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One local SGD step on the worker; every ``tau``-th step is followed by the elastic update."""
        self.optimizer.zero_grad()
        loss = self.local_loss(x, y)
        loss.backward()
        self.optimizer.step()
        self.pending_steps += 1
        if self.pending_steps == self.tau:
            self.elastic_update()
        return loss.item()

    def elastic_update(self) -> None:
        """Move the worker towards the center and the center towards the workers (one all-reduce)."""
        x = self.get_parameters()
        diff = x - self.center
        total = self.ctx.all_reduce(diff)
        self.set_parameters(x - self.alpha * diff)
        self.center = self.center + self.alpha * total
        self.exchanges += 1
        self.pending_steps = 0

    def get_center(self) -> torch.Tensor:
        """The center variable x~ as a flat vector (a copy; the same on every rank)."""
        return self.center.clone()

    @torch.no_grad()
    def evaluate(
        self, x: torch.Tensor, y: torch.Tensor, use_center: bool = True
    ) -> dict[str, float]:
        """Global loss and accuracy of the center (default) or of each rank's worker."""
        if not use_center:
            return super().evaluate(x, y)
        worker = self.get_parameters()
        self.set_parameters(self.center.clone())
        try:
            return super().evaluate(x, y)
        finally:
            self.set_parameters(worker)

    def train_epoch(self, local_data: torch.Tensor, local_labels: torch.Tensor) -> dict[str, float]:
        """One pass of local steps; the metrics add ``exchanges`` and ``distance_to_center``."""
        metrics = super().train_epoch(local_data, local_labels)
        gap = float(((self.get_parameters() - self.center) ** 2).sum())
        return metrics | {"exchanges": self.exchanges, "distance_to_center": gap}
