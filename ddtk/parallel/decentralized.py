"""Decentralized SGD (D-PSGD) and gossip averaging: no all-reduce, only messages to neighbours.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms? A
Case Study for Decentralized Parallel Stochastic Gradient Descent" (NeurIPS 2017).
The ranks sit on a graph given by a doubly stochastic mixing matrix W (rows and
columns sum to 1). In each step, every rank computes a gradient at its own model,
replaces its model by the weighted average of its neighbours' models, and applies
the gradient::

    x_i <- sum_j W_ij x_j - lr * grad f_i(x_i)

Each rank only talks to its neighbours, with point-to-point send and recv. A ring
costs two messages per rank per step, whatever the number of ranks. With ``lr = 0``
this is pure gossip, ``X_k = W^k X_0``. Because W is doubly stochastic, the
average of the ranks' models is preserved, and every model converges to that
average at a rate set by the second-largest eigenvalue of W. The *consensus
distance* ``mean_i ||x_i - x_bar||^2`` measures how far the ranks are from
agreeing. Computing it takes an all-reduce, so it is recorded only when
``track_consensus=True``: measurement, not part of the algorithm.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
from torch import nn

from ddtk.parallel.trainer import DistributedTrainer

__all__ = ["Decentralized", "mixing_matrix"]

TOPOLOGIES = ("ring", "complete")
_TAG = 4242


def mixing_matrix(topology: Any, world_size: int) -> torch.Tensor:
    """The float64 mixing matrix of ``"ring"``, ``"complete"`` or a given square matrix, checked.

    Ring: weight 1/3 on self and on each of the two neighbours (with 2 ranks the two
    neighbours are the same rank, which gets 2/3). Complete: 1/n everywhere. A given
    matrix must be ``world_size`` x ``world_size``, non-negative, doubly stochastic and
    connected, so that gossip reaches the average.
    """
    n = world_size
    if isinstance(topology, str):
        if topology == "complete":
            return torch.full((n, n), 1.0 / n, dtype=torch.float64)
        if topology != "ring":
            raise ValueError(
                f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)} "
                "or pass a doubly stochastic mixing matrix"
            )
        w = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            for j in (i - 1, i, i + 1):
                w[i, j % n] += 1.0 / 3.0
        return w if n > 1 else torch.ones(1, 1, dtype=torch.float64)
    w = torch.as_tensor(np.asarray(topology, dtype=np.float64))
    if w.shape != (n, n):
        raise ValueError(
            f"the mixing matrix must be {n}x{n} (world_size), got shape {tuple(w.shape)}"
        )
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError("the mixing matrix must have finite, non-negative entries")
    for axis, name in ((1, "row"), (0, "column")):
        sums = w.sum(axis)
        bad = (sums - 1).abs() > 1e-6
        if bad.any():
            i = int(bad.nonzero()[0])
            raise ValueError(
                f"the mixing matrix must be doubly stochastic: {name} {i} sums to {sums[i]:.6g}, not 1"
            )
    _check_connected(w)
    return w


def _check_connected(w: torch.Tensor) -> None:
    """Raise unless every rank can reach every other through non-zero weights."""
    n, seen, todo = len(w), {0}, deque([0])
    linked = (w + w.T) > 0
    while todo:
        i = todo.popleft()
        for j in linked[i].nonzero().flatten().tolist():
            if j not in seen:
                seen.add(j)
                todo.append(j)
    if len(seen) < n:
        cut = sorted(set(range(n)) - seen)
        raise ValueError(
            f"the mixing matrix graph is not connected: ranks {cut} never mix with rank 0"
        )


class Decentralized(DistributedTrainer):
    """D-PSGD on a topology: local gradient, then a gossip step with the neighbours only.

    Args:
        topology: ``"ring"``, ``"complete"`` or a doubly stochastic world_size x world_size matrix.
        track_consensus: record the consensus distance after every step in :attr:`consensus`
            (costs two all-reduces per step; the training path itself uses none).
        Other arguments as for :class:`~ddtk.parallel.trainer.DistributedTrainer`.

    Models are not broadcast at the start: build them with the same seed to start in
    agreement, or differently to watch gossip pull them together. :meth:`evaluate` scores
    each rank's own model on its share of the data.

    Example:
        >>> import ddtk, torch
        >>> from ddtk.models import build_model
        >>> from ddtk.parallel.decentralized import Decentralized
        >>> def run(ctx):
        ...     model = build_model("linear", input_shape=(4,), num_classes=2, seed=ctx.rank)
        ...     return Decentralized(ctx, model, topology="ring", track_consensus=True).gossip(10)
        >>> distances = ddtk.launch(run, world_size=4)[0]   # 11 values, decaying
        >>> distances[-1] < distances[0] / 100
        True
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Module,
        lr: float = 0.05,
        batch_size: int = 32,
        topology: Any = "ring",
        track_consensus: bool = False,
        **kwargs: Any,
    ):
        self.mixing = mixing_matrix(topology, ctx.world_size)
        super().__init__(ctx, model, lr=lr, batch_size=batch_size, **kwargs)
        r, row, col = ctx.rank, self.mixing[ctx.rank], self.mixing[:, ctx.rank]
        self.in_neighbors = [j for j in range(ctx.world_size) if j != r and row[j] > 0]
        self.out_neighbors = [j for j in range(ctx.world_size) if j != r and col[j] > 0]
        self.track_consensus = track_consensus
        self.consensus: list[float] = []  # consensus distance after each step, when tracked

    def mix(self) -> None:
        """One gossip step, ``x_i <- sum_j W_ij x_j``: send to out-neighbours, receive from in-neighbours."""
        x = self.get_parameters()
        for j in self.out_neighbors:
            self.ctx.send(x, j, tag=_TAG)  # buffered: every rank sends before it receives
        acc = self.mixing[self.ctx.rank, self.ctx.rank] * x.double()
        for j in self.in_neighbors:
            acc += self.mixing[self.ctx.rank, j] * self.ctx.recv(j, tag=_TAG).payload.double()
        self.set_parameters(acc)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Gradient at the local model, gossip with the neighbours, then the SGD step on the mixed model."""
        self.optimizer.zero_grad()
        loss = self.local_loss(x, y)
        loss.backward()
        self.mix()
        self.optimizer.step()
        if self.track_consensus:
            self.consensus.append(self.consensus_distance())
        return loss.item()

    def gossip(self, steps: int) -> list[float]:
        """``steps`` pure gossip steps (no gradient); returns the consensus distances, initial one
        first (``steps + 1`` values), when ``track_consensus`` is on, else an empty list."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        out = [self.consensus_distance()] if self.track_consensus else []
        for _ in range(steps):
            self.mix()
            if self.track_consensus:
                out.append(self.consensus_distance())
        self.consensus += out
        return out

    def consensus_distance(self) -> float:
        """``mean_i ||x_i - x_bar||^2`` over the ranks (two all-reduces; for measurement only)."""
        x = self.get_parameters().double()
        mean = self.ctx.all_reduce(x, op="avg")
        dist = self.ctx.all_reduce(((x - mean) ** 2).sum().reshape(1))
        return dist.item() / self.ctx.world_size

    def train_epoch(self, local_data: torch.Tensor, local_labels: torch.Tensor) -> dict[str, float]:
        """One pass over this rank's data; the metrics add the last consensus distance when tracked."""
        metrics = super().train_epoch(local_data, local_labels)
        return metrics | ({"consensus": self.consensus[-1]} if self.consensus else {})
