"""Pipeline parallelism: an ``nn.Sequential`` cut into stages, one stage per rank.

Rank ``s`` keeps layers ``[a_s, b_s)`` of the model. A batch is cut into ``m``
micro-batches; stage ``s`` receives each micro-batch's activation from rank
``s - 1``, runs its layers, and sends the result to rank ``s + 1``. The last
stage computes the loss. Backward goes the other way: each stage receives the
gradient of its output, back-propagates through its layers, and sends the
gradient of its input to the previous rank. Which forward or backward a stage
runs next is the *schedule* (:mod:`ddtk.parallel.pipeline_schedules`:
``naive``, ``gpipe``, ``1f1b``).

Why the gradients equal the single-process model's: micro-batch ``i`` of
``b_i`` samples out of ``B`` contributes ``loss_i * b_i / B`` to the loss, so with a
mean-reduced loss (``nn.CrossEntropyLoss()``, ``nn.MSELoss()``) the sum over
micro-batches is exactly the loss of the whole batch, and the gradients that
accumulate in each stage are those of the whole batch. Micro-batches may be
uneven (``torch.tensor_split``); a batch smaller than ``m`` raises ValueError.

Messages use ``ctx.send``/``ctx.recv`` with tag ``2 i`` (+ :data:`TAG_BASE`) for the
activation of micro-batch ``i`` and ``2 i + 1`` for its gradient.

Every step records a :class:`~ddtk.parallel.pipeline_schedules.Timeline` in
:attr:`PipelineParallel.timeline`: each forward and backward with its start and
end (seconds after a barrier that all ranks pass together), and the number of
micro-batches whose activations the stage holds. :mod:`ddtk.viz.pipeline` draws it.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ddtk.parallel.pipeline_schedules import (
    SCHEDULES,
    Timeline,
    bubble_fraction,
    check_schedule,
    schedule_order,
    theoretical_bubble,
)

__all__ = [
    "SCHEDULES", "TAG_BASE", "PipelineParallel", "bubble_fraction", "partition",
    "theoretical_bubble",
]  # fmt: skip

TAG_BASE = 1 << 19  # pipeline tags live in [TAG_BASE, USER_TAG_LIMIT)
PARTITIONS = ("parameters", "layers")


def partition(
    model: nn.Sequential,
    num_stages: int,
    balance: Sequence[int] | None = None,
    split_points: Sequence[int] | None = None,
    by: str = "parameters",
) -> list[tuple[int, int]]:
    """The ``[start, end)`` layer range of each stage.

    ``balance`` gives the number of layers per stage; ``split_points`` the index
    of the first layer of stages 1..p-1. Without either, the cut minimises the
    largest stage's parameter count (``by="parameters"``, ties broken by layer
    count) or layer count (``by="layers"``, ties broken by parameters).

    >>> model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2), nn.ReLU(), nn.Linear(2, 2))
    >>> [sum(p.numel() for p in layer.parameters()) for layer in model]
    [288, 0, 66, 0, 6]
    >>> partition(model, 2), partition(model, 2, by="layers"), partition(model, 2, split_points=[3])
    ([(0, 1), (1, 5)], [(0, 2), (2, 5)], [(0, 3), (3, 5)])
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"pipeline parallelism needs an nn.Sequential, got {type(model).__name__}")
    n = len(model)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an integer >= 1, got {num_stages!r}")
    if num_stages > n:
        raise ValueError(
            f"cannot split a model of {n} layers into {num_stages} stages: each stage needs at "
            "least one layer (use fewer ranks or a model with more layers)"
        )
    if balance is not None and split_points is not None:
        raise ValueError("give balance or split_points, not both")
    if balance is not None:
        if len(balance) != num_stages or any(int(b) < 1 for b in balance) or sum(balance) != n:
            raise ValueError(
                f"balance must list {num_stages} positive layer counts summing to {n}, got {list(balance)}"
            )
        split_points = [sum(balance[:k]) for k in range(1, num_stages)]
    if split_points is not None:
        cuts = [0, *split_points, n]
        if len(cuts) != num_stages + 1 or any(a >= b for a, b in itertools.pairwise(cuts)):
            raise ValueError(
                f"split_points must be {num_stages - 1} increasing layer indices in (0, {n}), "
                f"got {list(split_points)}"
            )
        return list(itertools.pairwise(cuts))
    if by not in PARTITIONS:
        raise ValueError(f"unknown partition {by!r}; choose one of {', '.join(PARTITIONS)}")
    params = [sum(p.numel() for p in layer.parameters()) for layer in model]
    return _min_max_cut(params, num_stages, by == "layers")


def _min_max_cut(params: list[int], k: int, layers_first: bool) -> list[tuple[int, int]]:
    """Contiguous cut of the layers into ``k`` parts minimising the largest part's cost (DP)."""
    n = len(params)
    prefix = [0]
    for w in params:
        prefix.append(prefix[-1] + w)

    def cost(a: int, b: int) -> tuple[int, int]:
        w, c = prefix[b] - prefix[a], b - a
        return (c, w) if layers_first else (w, c)

    # best[j][s]: (cost, previous cut) of splitting the first j layers into s parts
    best: list[list[Any]] = [[None] * (k + 1) for _ in range(n + 1)]
    best[0][0] = ((0, 0), 0)
    for s in range(1, k + 1):
        for j in range(s, n - (k - s) + 1):
            options = [
                (max(best[i][s - 1][0], cost(i, j)), i)
                for i in range(s - 1, j)
                if best[i][s - 1] is not None
            ]
            best[j][s] = min(options)
    cuts, j = [n], n
    for s in range(k, 0, -1):
        j = best[j][s][1]
        cuts.append(j)
    cuts.reverse()
    return list(itertools.pairwise(cuts))


class PipelineParallel:
    """One pipeline stage on each rank of ``ctx``; :meth:`train_step` runs a whole batch.

    Every rank passes the same model (built from the same seed) and keeps only its
    stage, :attr:`stage` (layers :attr:`layers`). ``loss_fn`` must reduce by mean.
    Gradients accumulate in :attr:`stage`'s parameters; an optimiser over
    ``pipe.stage.parameters()`` passed to :meth:`train_step` applies them.

    >>> import ddtk, torch
    >>> from torch import nn
    >>> def run(ctx):
    ...     torch.manual_seed(0)
    ...     model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ...     pipe = PipelineParallel(ctx, model, nn.MSELoss(), num_microbatches=3)
    ...     loss = pipe.train_step(torch.ones(6, 4), torch.zeros(6, 2))
    ...     return pipe.layers, pipe.timeline.order, round(loss, 4)
    >>> for result in ddtk.launch(run, world_size=2, timeout=60, echo=False):
    ...     print(result)
    ((0, 1), ['F0', 'F1', 'B0', 'F2', 'B1', 'B2'], 0.0255)
    ((1, 3), ['F0', 'B0', 'F1', 'B1', 'F2', 'B2'], 0.0255)
    >>> torch.manual_seed(0)  # the same model on one process gives the same loss  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> round(nn.MSELoss()(model(torch.ones(6, 4)), torch.zeros(6, 2)).item(), 4)
    0.0255
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Sequential,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        num_microbatches: int = 1,
        schedule: str = "1f1b",
        balance: Sequence[int] | None = None,
        split_points: Sequence[int] | None = None,
        partition_by: str = "parameters",
        broadcast_loss: bool = True,
    ):
        check_schedule(schedule, num_microbatches)
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        if 2 * num_microbatches > (1 << 20) - TAG_BASE:
            raise ValueError(f"num_microbatches={num_microbatches} is too large for the tag space")
        self.ctx = ctx
        self.num_stages = ctx.world_size
        self.rank = ctx.rank
        ranges = partition(model, self.num_stages, balance, split_points, partition_by)
        self.layers: tuple[int, int] = ranges[self.rank]
        # a plain Sequential of this stage's layers (slicing a subclass would call its __init__)
        named = list(model.named_children())[self.layers[0] : self.layers[1]]
        self.stage = nn.Sequential(OrderedDict(named)).to(ctx.device)
        self.loss_fn = loss_fn
        self.num_microbatches = num_microbatches
        self.schedule = schedule
        self.broadcast_loss = broadcast_loss
        self.order = schedule_order(schedule, self.rank, self.num_stages, num_microbatches)
        self.timeline = Timeline(rank=self.rank)
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.num_stages - 1

    def train_step(
        self,
        x: torch.Tensor | None = None,
        y: torch.Tensor | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> float | None:
        """Forward and backward of one batch through the pipeline; then ``optimizer.step()``.

        ``x`` is needed on the first stage and ``y`` on the last; other ranks may pass
        them or None. Gradients are zeroed first, so after the call they are those
        of the whole batch. Returns the batch's loss (on every rank if
        ``broadcast_loss``, else on the last stage and None elsewhere).
        """
        xs, ys, total = self._split_inputs(x, y)
        self.stage.zero_grad(set_to_none=True)
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        loss_sum = 0.0
        self.ctx.barrier()  # a common time origin for every rank's timeline
        t0 = time.perf_counter()
        self.timeline = Timeline(rank=self.rank)
        for kind, i in self.order:
            if kind == "F":
                inp = xs[i] if self.is_first else self._recv(self.rank - 1, 2 * i)
                start = self._now(t0)
                out = self.stage(inp)
                if self.is_last:
                    out = self._micro_loss(out, ys[i], total)
                    loss_sum += float(out.detach())
                self.timeline.record("F", i, start, self._now(t0))
                if not self.is_last:
                    self.ctx.send(out.detach(), self.rank + 1, tag=TAG_BASE + 2 * i)
                inputs[i], outputs[i] = inp, out
            else:
                grad = None if self.is_last else self._recv(self.rank + 1, 2 * i + 1)
                start = self._now(t0)
                inp, out = inputs.pop(i), outputs.pop(i)
                if out.requires_grad:
                    torch.autograd.backward(out, grad)
                self.timeline.record("B", i, start, self._now(t0))
                if not self.is_first:
                    g = inp.grad if inp.grad is not None else torch.zeros_like(inp)
                    self.ctx.send(g, self.rank - 1, tag=TAG_BASE + 2 * i + 1)
        if optimizer is not None:
            optimizer.step()
        return self._loss(loss_sum)

    # -- helpers ---------------------------------------------------------------------
    def _split_inputs(
        self, x: torch.Tensor | None, y: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """Micro-batches of x (first stage) and y (last stage), checked before any message."""
        m, xs, ys, total = self.num_microbatches, [], [], 0
        for name, t, needed in (("x", x, self.is_first), ("y", y, self.is_last)):
            if not needed:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"stage {self.rank} needs {name} as a tensor, got {type(t).__name__}"
                )
            if t.dim() == 0 or len(t) < m:
                raise ValueError(
                    f"{name} has {0 if t.dim() == 0 else len(t)} samples; it cannot be split into "
                    f"num_microbatches={m} non-empty micro-batches"
                )
        if self.is_first:
            xs = list(torch.tensor_split(x.to(self.ctx.device), m))  # type: ignore[union-attr]
        if self.is_last:
            ys = list(torch.tensor_split(y.to(self.ctx.device), m))  # type: ignore[union-attr]
            total = len(y)  # type: ignore[arg-type]
        return xs, ys, total

    def _micro_loss(self, out: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
        if len(out) != len(y):
            raise ValueError(
                f"a micro-batch reached the last stage with {len(out)} samples but its labels have "
                f"{len(y)}: x and y must hold the same number of samples"
            )
        return self.loss_fn(out, y) * (len(y) / total)

    def _recv(self, src: int, tag: int) -> torch.Tensor:
        t = self.ctx.recv(src, tag=TAG_BASE + tag).payload
        return t.requires_grad_() if t.is_floating_point() else t

    def _now(self, t0: float) -> float:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        return time.perf_counter() - t0

    def _loss(self, loss_sum: float) -> float | None:
        if not self.broadcast_loss:
            return loss_sum if self.is_last else None
        value = torch.tensor([loss_sum], dtype=torch.float64) if self.is_last else None
        return float(self.ctx.broadcast(value, root=self.num_stages - 1)[0])
