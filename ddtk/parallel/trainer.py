"""The small trainer interface every ddtk training strategy shares.

From the course's reference design: ``train_epoch(local_data, local_labels)``,
``get_parameters()``, ``set_parameters()``, ``predict()``, and a global loss and
accuracy computed with all-reduce. A strategy subclasses
:class:`DistributedTrainer` and implements :meth:`train_step` (one
optimisation step on one local batch); the base class supplies the epoch loop,
seeded shuffling, progress bars on rank 0, callbacks and evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from ddtk.parallel.callbacks import Callback

__all__ = ["DistributedTrainer", "batches", "loss_function"]

LOSSES = ("cross_entropy", "mse")


def loss_function(name: str) -> nn.Module:
    """``"cross_entropy"`` for classification, ``"mse"`` for regression."""
    if name == "cross_entropy":
        return nn.CrossEntropyLoss()
    if name == "mse":
        return nn.MSELoss()
    raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")


def batches(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    seed: int | None = None,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches of ``(x, y)``, in a seeded random order when ``seed`` is given."""
    n = len(y)
    order = (
        torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        if seed is not None
        else torch.arange(n)
    )
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = order[start : start + batch_size]
        yield x[idx], y[idx]


class DistributedTrainer:
    """Base class of the training strategies. One instance lives on each rank.

    Args:
        ctx: this rank's :class:`ddtk.DistributedContext`.
        model: the local replica (or shard) of the model.
        lr: learning rate of the default optimiser (plain SGD, optional momentum).
        batch_size: local mini-batch size used by :meth:`train_epoch`.
        loss: ``"cross_entropy"`` or ``"mse"``.
        optimizer: a ready torch optimiser over ``model.parameters()`` instead of SGD.
        callbacks: :class:`~ddtk.parallel.callbacks.Callback` objects (``on_step``, ``on_epoch``).
        progress: show a tqdm bar on rank 0 in :meth:`fit`.
        seed: base seed of the per-epoch shuffles (the same on every rank).
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Module,
        lr: float = 0.05,
        batch_size: int = 32,
        loss: str = "cross_entropy",
        momentum: float = 0.0,
        optimizer: torch.optim.Optimizer | None = None,
        callbacks: Sequence[Callback] = (),
        progress: bool = False,
        seed: int = 0,
    ):
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.ctx, self.model = ctx, model
        self.lr, self.batch_size, self.seed = lr, batch_size, seed
        self.loss_name = loss
        self.loss_fn = loss_function(loss)
        self.optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        self.callbacks = list(callbacks)
        self.progress = progress
        self.step_count = 0
        self.epoch = 0
        self.last_loss = float("nan")
        self._last_samples = 0

    # -- the part each strategy provides ------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimisation step on one local batch; returns the local loss."""
        raise NotImplementedError

    def end_epoch(self) -> None:
        """Hook for strategies that synchronise once per epoch (Local SGD, federated rounds)."""

    # -- shared machinery -----------------------------------------------------------------
    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of the local model on ``(x, y)``, with the graph (for backward)."""
        return self.loss_fn(self.model(x), y)

    def train_epoch(self, local_data: torch.Tensor, local_labels: torch.Tensor) -> dict[str, float]:
        """One pass over this rank's data in a seeded order; returns ``{"epoch", "loss", "samples", "seconds"}``.

        Every rank must call it with the same number of batches (equal partition sizes,
        or ``drop_last``-style trimming) when the strategy synchronises per step.
        """
        self._check_data(local_data, local_labels)
        t0, total, seen = time.perf_counter(), 0.0, 0
        self.model.train()
        for x, y in batches(local_data, local_labels, self.batch_size, seed=self.seed + self.epoch):
            loss = self.train_step(x, y)
            self.step_count += 1
            total, seen = total + loss * len(y), seen + len(y)
            self._emit("on_step", {"step": self.step_count, "epoch": self.epoch + 1, "loss": loss})
        self.end_epoch()
        self.last_loss = total / max(seen, 1)
        self._last_samples = seen
        self.epoch += 1
        return {
            "epoch": self.epoch,
            "loss": self.last_loss,
            "samples": seen,
            "seconds": time.perf_counter() - t0,
        }

    def fit(
        self,
        local_data: torch.Tensor,
        local_labels: torch.Tensor,
        epochs: int,
        eval_data: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> list[dict[str, float]]:
        """Run ``epochs`` epochs; after each, evaluate globally on ``eval_data`` (this rank's share of it).

        Returns one metrics dict per epoch (also passed to ``on_epoch``); rank 0 shows a progress bar.
        """
        from tqdm.auto import tqdm

        out = []
        bar = tqdm(
            range(epochs),
            desc=type(self).__name__,
            disable=not (self.progress and self.ctx.rank == 0),
        )
        for _ in bar:
            metrics = self.train_epoch(local_data, local_labels)
            if eval_data is not None:
                ev = self.evaluate(*eval_data)
                metrics |= {"eval_loss": ev["loss"], "accuracy": ev["accuracy"]}
            bar.set_postfix(
                {k: f"{v:.4g}" for k, v in metrics.items() if k in ("loss", "accuracy")}
            )
            self._emit("on_epoch", metrics)
            out.append(metrics)
        return out

    def get_parameters(self) -> torch.Tensor:
        """All parameters as one flat vector (a copy)."""
        return parameters_to_vector(self.model.parameters()).detach().clone()

    def set_parameters(self, params: torch.Tensor) -> None:
        """Copy a flat vector produced by :meth:`get_parameters` into the model (the vector is not kept)."""
        n = sum(p.numel() for p in self.model.parameters())
        if params.numel() != n:
            raise ValueError(f"expected a flat vector of {n} parameters, got {params.numel()}")
        flat = params.detach().reshape(-1)
        offset = 0
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Model outputs (logits for classification) in eval mode, without gradients."""
        was = self.model.training
        self.model.eval()
        try:
            return self.model(x)
        finally:
            self.model.train(was)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Global loss and accuracy over every rank's ``(x, y)``, by one all-reduce of sums.

        Each rank passes its own share; the result is the same on every rank and
        equals the metric over the concatenated data. Accuracy is NaN for regression.
        """
        self._check_data(x, y)
        out = self.predict(x)
        if self.loss_name == "mse" and out.shape != y.shape:
            raise ValueError(
                f"model outputs have shape {tuple(out.shape)} but targets {tuple(y.shape)}; they must match for mse"
            )
        loss_sum = self.loss_fn(out, y).item() * len(y) if len(y) else 0.0
        correct = (
            float((out.argmax(1) == y).sum())
            if self.loss_name == "cross_entropy" and len(y)
            else 0.0
        )
        totals = self.ctx.all_reduce(
            torch.tensor([loss_sum, correct, float(len(y))], dtype=torch.float64)
        )
        n = max(totals[2].item(), 1.0)
        acc = totals[1].item() / n if self.loss_name == "cross_entropy" else float("nan")
        return {"loss": totals[0].item() / n, "accuracy": acc, "samples": totals[2].item()}

    def get_local_loss(self) -> float:
        """Mean training loss of this rank over its last epoch."""
        return self.last_loss

    def get_global_loss(self) -> float:
        """Per-sample mean training loss over every rank's last epoch (one all-reduce; call on every rank)."""
        seen = float(self._last_samples)
        loss_sum = self.last_loss * seen if seen else 0.0
        t = self.ctx.all_reduce(torch.tensor([loss_sum, seen], dtype=torch.float64))
        return t[0].item() / t[1].item() if t[1].item() else float("nan")

    def _emit(self, hook: str, metrics: dict[str, float]) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, metrics)

    @staticmethod
    def _check_data(x: torch.Tensor, y: torch.Tensor) -> None:
        if len(x) != len(y):
            raise ValueError(f"data and labels differ in length: {len(x)} samples, {len(y)} labels")
