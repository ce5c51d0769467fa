"""Synchronous data parallelism with bucketed, overlapped gradient averaging (what DDP does).

Every rank holds a full replica of the model and trains on its own share of each
global batch. After backward, each gradient must be the average over ranks, so
the replicas take identical steps and never drift apart. Doing that naively (one
all-reduce per parameter, after backward) is slow for two reasons, and DDP's
answer to both is reproduced here:

* **Buckets.** Many small all-reduces pay the per-message latency (alpha) many
  times. Parameters are grouped, in reverse order of registration (roughly the
  order backward produces their gradients), into flat buckets of about
  ``bucket_mb`` megabytes, and each bucket is one all-reduce.
* **Overlap.** A bucket is sent as soon as the last gradient in it is produced,
  by a hook on each parameter, while backward goes on computing the gradients
  of earlier layers. A single communication thread runs the collectives in
  bucket order, the same order on every rank, whatever order the gradients
  became ready in. At the end of backward (an autograd engine callback) the
  trainer waits for the outstanding buckets and writes the averages back to
  ``param.grad``, so ``loss.backward()`` returns with averaged gradients, as
  with DDP.

Gradient accumulation uses :meth:`DataParallel.no_sync`: backward passes inside
it only accumulate locally, and the next pass outside it averages the sum.
With ``compression=`` each bucket goes through a compressor's ``aggregate``
instead of a plain all-reduce (see :mod:`ddtk.compression`).

>>> import ddtk
>>> from ddtk.data import load_dataset, DataPartitioner
>>> from ddtk.models import build_model
>>> from ddtk.parallel.data_parallel import DataParallel
>>> def train(ctx):
...     ds = load_dataset("digits")
...     x, y = ds.subset(DataPartitioner(len(ds), ctx.world_size).get_indices(ctx.rank))
...     dp = DataParallel(ctx, build_model("cnn", seed=ctx.rank), lr=0.1)  # rank 0's weights win
...     dp.fit(x, y, epochs=2)
...     return dp.evaluate(x, y)["accuracy"]
>>> accuracies = ddtk.launch(train, world_size=2)   # the same on both ranks
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ddtk.parallel.trainer import DistributedTrainer

__all__ = ["Bucket", "DataParallel", "assign_buckets"]


@dataclass
class Bucket:
    """A group of parameters whose gradients travel as one flat tensor."""

    index: int
    params: list[nn.Parameter]
    numel: int
    pending: int = 0  # gradients still to come in this backward pass
    future: Future | None = None
    ready: set[int] = field(default_factory=set)  # ids of parameters whose gradient is in


def assign_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Group ``params`` in reverse order into buckets of at least one parameter and about ``bucket_bytes``.

    A bucket is closed as soon as it reaches ``bucket_bytes``, so a parameter larger
    than the cap gets a bucket of its own, like DDP's ``bucket_cap_mb``.
    """
    buckets: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in reversed(params):
        if buckets[-1] and size >= bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
    return [b for b in buckets if b]


class DataParallel(DistributedTrainer):
    """Synchronous data-parallel SGD: averaged gradients, in buckets, overlapped with backward.

    Args (beyond :class:`~ddtk.parallel.trainer.DistributedTrainer`'s):
        bucket_mb: bucket size cap in megabytes (DDP's ``bucket_cap_mb``, 25 by default).
        algorithm: the ddtk all-reduce used for buckets (``"ring"``, ``"tree"``...,
            or ``"torch"`` for torch.distributed's own).
        overlap: launch each bucket from backward hooks (True) or all of them after
            backward finishes (False): the "no overlap" baseline.
        compression: a :class:`ddtk.compression.Compressor` or a spec such as
            ``"ef+topk:0.01"``; each bucket is averaged by
            ``compression.aggregate(ctx, flat, key=bucket_index)``.
        broadcast_parameters: copy rank 0's parameters and buffers to every rank first.

    ``stats`` counts, per bucket, how many times it was reduced, and the seconds the
    main thread spent waiting for communication at the end of backward.
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Module,
        *args: Any,
        bucket_mb: float = 25.0,
        algorithm: str = "ring",
        overlap: bool = True,
        compression: Any = None,
        broadcast_parameters: bool = True,
        **kwargs: Any,
    ):
        super().__init__(ctx, model, *args, **kwargs)
        from ddtk.comm.context import ALL_REDUCE_ALGORITHMS

        if algorithm not in ALL_REDUCE_ALGORITHMS:
            raise ValueError(
                f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALL_REDUCE_ALGORITHMS)}"
            )
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
        from ddtk.compression import get_compressor

        self.algorithm, self.overlap = algorithm, overlap
        self.compression = None if compression is None else get_compressor(compression)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no parameters that require gradients")
        if broadcast_parameters:
            self._broadcast_state()
        groups = assign_buckets(params, int(bucket_mb * 2**20))
        self.buckets = [Bucket(i, g, sum(p.numel() for p in g)) for i, g in enumerate(groups)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._names = {id(p): n for n, p in model.named_parameters()}
        self._sync = True
        self._in_backward = False
        self._lock = threading.Lock()
        self._comm = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ddtk-dp-comm")
        self._next_launch = 0
        self.stats: dict[str, Any] = {
            "reductions": [0] * len(self.buckets),
            "wait_seconds": 0.0,
            "backward_passes": 0,
        }
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    # -- public ---------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Forward, backward (gradients averaged across ranks on the way), optimiser step."""
        self.optimizer.zero_grad()
        loss = self.local_loss(x, y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the next one outside averages the sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def close(self) -> None:
        """Remove the hooks and stop the communication thread (also done when the object is collected)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._comm.shutdown(wait=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- backward machinery -----------------------------------------------------------------
    def _on_grad_ready(self, p: nn.Parameter) -> None:
        """Post-accumulate-grad hook: count the gradient in; launch full buckets in order."""
        if not self._sync:
            return
        with self._lock:
            if not self._in_backward:
                self._start_backward()
            bucket = self._bucket_of[id(p)]
            if id(p) in bucket.ready:
                raise RuntimeError(
                    f"parameter {self._names.get(id(p), '?')} produced a gradient twice in one backward "
                    "pass; DataParallel (like DDP) supports each parameter being used once per pass"
                )
            bucket.ready.add(id(p))
            bucket.pending -= 1
            if self.overlap:
                self._launch_ready_buckets()

    def _start_backward(self) -> None:
        self._in_backward = True
        self._next_launch = 0
        for b in self.buckets:
            b.pending, b.ready, b.future = len(b.params), set(), None
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _launch_ready_buckets(self, inline: bool = False) -> None:
        """Submit buckets in index order, stopping at the first one still waiting for gradients.

        ``inline`` (end of backward, nothing left to overlap with): wait for the buckets
        already on the communication thread, then reduce the rest on this thread, which
        saves a hand-over per bucket. The order of the collectives stays the bucket order.
        """
        # The last bucket is ready when backward ends: handing it to the thread would
        # only add a hand-over, so it waits for the inline pass.
        last = len(self.buckets) if inline else len(self.buckets) - 1
        while self._next_launch < last and self.buckets[self._next_launch].pending == 0:
            b = self.buckets[self._next_launch]
            flat = torch.cat([p.grad.reshape(-1) for p in b.params])
            if inline:
                for earlier in self.buckets[: self._next_launch]:
                    earlier.future.result()  # type: ignore[union-attr]
                b.future = Future()
                b.future.set_result(self._average(flat, b.index))
            else:
                b.future = self._comm.submit(self._average, flat, b.index)
            self._next_launch += 1

    def _finish_backward(self) -> None:
        """End of backward: fill missing gradients with zeros, launch the rest, wait, write back."""
        import time

        with self._lock:
            for b in self.buckets:
                for p in b.params:
                    if (
                        id(p) not in b.ready
                    ):  # unused in this pass: it contributes zeros, like DDP's
                        if p.grad is None:  # find_unused_parameters=True
                            p.grad = torch.zeros_like(p)
                        b.ready.add(id(p))
                        b.pending -= 1
            t0 = time.perf_counter()
            self._launch_ready_buckets(inline=True)
            try:
                for b in self.buckets:
                    self._write_back(b, b.future.result())  # type: ignore[union-attr]
            finally:
                self.stats["wait_seconds"] += time.perf_counter() - t0
                self.stats["backward_passes"] += 1
                self._in_backward = False

    def _average(self, flat: torch.Tensor, index: int) -> torch.Tensor:
        """Runs on the communication thread: the mean of ``flat`` over ranks."""
        self.stats["reductions"][index] += 1
        if self.compression is not None:
            return self.compression.aggregate(self.ctx, flat, key=index)
        total = self.ctx.all_reduce(flat, algorithm=self.algorithm, out=flat)  # flat is ours
        return total.div_(self.ctx.world_size)

    @staticmethod
    def _write_back(bucket: Bucket, flat: torch.Tensor) -> None:
        offset = 0
        for p in bucket.params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def _broadcast_state(self) -> None:
        """Make every replica start from rank 0's parameters and buffers (one broadcast per dtype)."""
        if self.ctx.world_size == 1:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in [*self.model.parameters(), *self.model.buffers()]:
            by_dtype.setdefault(t.dtype, []).append(t)
        for dtype in sorted(by_dtype, key=str):  # the same order on every rank
            tensors = by_dtype[dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
            flat = self.ctx.broadcast(flat if self.ctx.rank == 0 else None, root=0)
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
