"""Metrics callbacks: how a trainer tells the outside world what it is doing.

A trainer calls ``on_step(trainer, metrics)`` after every optimisation step and
``on_epoch(trainer, metrics)`` after every epoch (``metrics`` is a plain dict of
numbers). Three callbacks cover the course's needs:

* :class:`History` keeps every metric in lists, for plots after the run
  (return ``history.as_dict()`` from the rank function).
* :class:`Report` forwards metrics from rank 0 to the process that called
  :func:`ddtk.launch`, while the ranks run: pass ``on_report=`` to ``launch``
  and plot live in the notebook (see :class:`ddtk.viz.live.LivePlot`).
* :class:`Lambda` wraps two plain functions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

__all__ = ["Callback", "History", "Lambda", "Report"]

Metrics = dict[str, float]


class Callback:
    """Base class: override either hook; both do nothing by default."""

    def on_step(self, trainer: Any, metrics: Metrics) -> None:
        """Called after each optimisation step with at least ``step`` and ``loss``."""

    def on_epoch(self, trainer: Any, metrics: Metrics) -> None:
        """Called after each epoch with at least ``epoch`` and ``loss``."""


class History(Callback):
    """Records every metric: ``history.steps["loss"]`` is the list of step losses."""

    def __init__(self) -> None:
        self.steps: dict[str, list[float]] = defaultdict(list)
        self.epochs: dict[str, list[float]] = defaultdict(list)

    def on_step(self, trainer: Any, metrics: Metrics) -> None:
        for k, v in metrics.items():
            self.steps[k].append(v)

    def on_epoch(self, trainer: Any, metrics: Metrics) -> None:
        for k, v in metrics.items():
            self.epochs[k].append(v)

    def as_dict(self) -> dict[str, dict[str, list[float]]]:
        """Plain, picklable ``{"steps": {...}, "epochs": {...}}``."""
        return {"steps": dict(self.steps), "epochs": dict(self.epochs)}


class Report(Callback):
    """Sends metrics to the launching process with ``ctx.report`` (rank 0 only by default).

    ``every`` thins out step reports (every n-th step); epoch reports are always sent.
    Each report is ``{"kind": "step" | "epoch", **metrics}``.
    """

    def __init__(self, every: int = 1, all_ranks: bool = False):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.all_ranks = every, all_ranks

    def _send(self, trainer: Any, kind: str, metrics: Metrics) -> None:
        if self.all_ranks or trainer.ctx.rank == 0:
            trainer.ctx.report({"kind": kind, **metrics})

    def on_step(self, trainer: Any, metrics: Metrics) -> None:
        if int(metrics.get("step", 0)) % self.every == 0:
            self._send(trainer, "step", metrics)

    def on_epoch(self, trainer: Any, metrics: Metrics) -> None:
        self._send(trainer, "epoch", metrics)


class Lambda(Callback):
    """A callback from functions: ``Lambda(on_step=lambda trainer, m: print(m))``."""

    def __init__(
        self,
        on_step: Callable[[Any, Metrics], None] | None = None,
        on_epoch: Callable[[Any, Metrics], None] | None = None,
    ):
        self._step, self._epoch = on_step, on_epoch

    def on_step(self, trainer: Any, metrics: Metrics) -> None:
        if self._step:
            self._step(trainer, metrics)

    def on_epoch(self, trainer: Any, metrics: Metrics) -> None:
        if self._epoch:
            self._epoch(trainer, metrics)
