"""The parameter server behind the trainer interface that every ddtk strategy shares.

:class:`ParameterServerTrainer` runs the protocol of :mod:`ddtk.parallel.ps_runtime`
once per epoch on the data each worker is given, so ``fit``, ``evaluate`` and the
callbacks work as for data parallelism; the consistency modes are explained in
:mod:`ddtk.parallel.parameter_server`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ddtk.parallel import ps_runtime
from ddtk.parallel.callbacks import Callback
from ddtk.parallel.ps_runtime import Roles
from ddtk.parallel.ps_store import assign_shards, check_mode, check_roles
from ddtk.parallel.trainer import DistributedTrainer, batches

__all__ = ["ParameterServerTrainer"]


# Passed to DistributedTrainer as the optimiser so that it builds none: building a torch
# optimiser imports torch._dynamo, about a second per rank, for an object no rank would use.
_SERVER_SIDE_SGD: Any = object()


class ParameterServerTrainer(DistributedTrainer):
    """The parameter server behind the shared trainer interface: servers serve, workers train.

    Every rank constructs it with the same arguments. Ranks ``0 .. num_servers-1``
    are servers (the tensors sharded across them by :func:`assign_shards`), the
    others are workers. :meth:`train_epoch`, called on every rank, is one pass over
    each worker's data: each batch is one pull, one gradient and one push, under the
    consistency rule of ``mode``. The servers apply plain SGD (``value -= lr *
    grad``), so there is no momentum and no custom optimiser. At construction and at
    the end of every epoch each server broadcasts its shard, so every rank's model
    holds the servers' parameters and :meth:`get_parameters`, :meth:`predict` and
    :meth:`evaluate` work on every rank.

    Args (beyond :class:`~ddtk.parallel.trainer.DistributedTrainer`'s ``lr``,
    ``batch_size``, ``loss``, ``callbacks``, ``progress`` and ``seed``):
        mode: ``"sync"``, ``"async"`` or ``"ssp"``; ``max_staleness`` is the ssp bound.
        num_servers: how many ranks serve (at least one rank must be left to work).
        straggler: ``(worker_rank, seconds)``: that worker sleeps this long every step.
        step_delay: seconds every worker sleeps every step.

    Sync mode needs the same number of batches on every worker (``train_epoch``
    checks, on every rank, before any step); in async and ssp mode the counts may
    differ and an epoch ends when every worker has finished its pass. Callbacks get
    ``on_step`` on the workers (a server takes no steps) and ``on_epoch`` on every
    rank. Each server serves, from the next epoch on, what its own model holds: to
    change the parameters with :meth:`set_parameters`, call it on every rank.
    ``worker_index`` is this rank's position among the workers (None on a server),
    handy to pick its share of the data.

    >>> import ddtk
    >>> from ddtk.data import DataPartitioner, load_dataset
    >>> from ddtk.models import build_model
    >>> from ddtk.parallel.parameter_server import ParameterServerTrainer
    >>> def train(ctx):   # rank 0 serves, ranks 1 and 2 work
    ...     ds = load_dataset("digits")
    ...     ps = ParameterServerTrainer(ctx, build_model("linear"), lr=0.5, mode="async")
    ...     if ps.worker_index is None:   # a server needs no data
    ...         x, y = ds.x[:0], ds.y[:0]
    ...     else:
    ...         part = DataPartitioner(len(ds), len(ps.workers), "shuffled")
    ...         x, y = ds.subset(part.get_indices(ps.worker_index))
    ...     ps.fit(x, y, epochs=2)
    ...     return ps.evaluate(x, y)["accuracy"]   # over the workers' data, on every rank
    >>> accuracies = ddtk.launch(train, world_size=3, echo=False)
    >>> len(set(accuracies)) == 1 and accuracies[0] > 0.8
    True
    """

    def __init__(
        self,
        ctx: Any,
        model: nn.Module,
        lr: float = 0.05,
        batch_size: int = 32,
        *,
        mode: str = "sync",
        max_staleness: int | None = None,
        num_servers: int = 1,
        straggler: tuple[int, float] | None = None,
        step_delay: float = 0.0,
        loss: str = "cross_entropy",
        callbacks: Sequence[Callback] = (),
        progress: bool = False,
        seed: int = 0,
    ):
        check_mode(mode, max_staleness)
        servers, workers = check_roles(ctx.world_size, num_servers, straggler, step_delay)
        super().__init__(
            ctx, model, lr=lr, batch_size=batch_size, loss=loss, optimizer=_SERVER_SIDE_SGD,
            callbacks=callbacks, progress=progress, seed=seed,
        )  # fmt: skip
        self.optimizer = None  # the servers' stores apply the updates; no rank has an optimiser
        sizes = {name: p.numel() for name, p in model.named_parameters()}
        self.roles = Roles(mode, max_staleness, float(lr), servers, workers,
                           assign_shards(sizes, num_servers))  # fmt: skip
        self.mode, self.max_staleness = mode, max_staleness
        self.servers, self.workers = servers, workers
        self.is_server = ctx.rank in servers
        self.worker_index = None if self.is_server else workers.index(ctx.rank)
        self.delay = float(step_delay)
        if straggler is not None and straggler[0] == ctx.rank:
            self.delay += float(straggler[1])
        # Every rank starts from the servers' parameters.
        self._share_parameters(self._own_shard() if self.is_server else None)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Not available: a parameter-server step involves the servers; use :meth:`train_epoch`."""
        raise NotImplementedError(
            "a parameter-server step needs the servers too: call train_epoch (or fit) on every rank"
        )

    def train_epoch(self, local_data: torch.Tensor, local_labels: torch.Tensor) -> dict[str, float]:
        """One pass over every worker's data; call on every rank (a server's data is ignored).

        Workers take their batches in the order of :func:`~ddtk.parallel.trainer.batches`
        with seed ``seed + epoch``. Returns ``epoch``, ``loss`` (this worker's mean
        training loss; on a server, that of every worker), ``samples`` (this rank's),
        ``seconds``, and ``train_loss`` (over every worker's steps), ``updates`` (applied
        by the servers), ``gradients`` (pushed by the workers) and
        ``max_staleness_observed``, all the same on every rank, and ``wait_seconds`` (this
        rank: a worker waiting for its pulls, a server waiting for requests).
        """
        self._check_data(local_data, local_labels)
        t0 = time.perf_counter()
        self._check_batch_counts(0 if self.is_server else len(local_labels))
        self.model.train()
        if self.is_server:
            out = ps_runtime.serve(self.ctx, self.roles, self.model)
            mine = [out["updates"], 0, max(out["staleness"], default=0), 0.0, 0]
            self._share_parameters(out["values"])
        else:
            stream = batches(local_data, local_labels, self.batch_size, seed=self.seed + self.epoch)
            out = ps_runtime.work(
                self.ctx, self.roles, self.model, self.loss_fn, stream, self.delay, self._step_done
            )
            mine = [0, out["steps"], 0, out["loss_sum"], out["samples"]]
            self._share_parameters(None)
        totals = torch.stack(self.ctx.all_gather(torch.tensor(mine, dtype=torch.float64)))
        seen_all = totals[:, 4].sum().item()
        train_loss = totals[:, 3].sum().item() / seen_all if seen_all else float("nan")
        seen = 0 if self.is_server else out["samples"]
        self._last_samples = seen
        if self.is_server:
            self.last_loss = train_loss
        else:
            self.last_loss = out["loss_sum"] / seen if seen else float("nan")
        self.epoch += 1
        return {
            "epoch": self.epoch,
            "loss": self.last_loss,
            "samples": seen,
            "seconds": time.perf_counter() - t0,
            "train_loss": train_loss,
            "updates": int(totals[:, 0].max().item()),
            "gradients": int(totals[:, 1].sum().item()),
            "max_staleness_observed": int(totals[:, 2].max().item()),
            "wait_seconds": out["wait_seconds"],
        }

    def _step_done(self, loss: float) -> None:
        self.step_count += 1
        self._emit("on_step", {"step": self.step_count, "epoch": self.epoch + 1, "loss": loss})

    def _check_batch_counts(self, samples: int) -> None:
        """Sync mode: every worker must take the same number of steps, or the rounds never end."""
        mine = torch.tensor([-(-samples // self.batch_size)], dtype=torch.int64)
        counts = [int(c.item()) for c in self.ctx.all_gather(mine)]
        per_worker = {w: counts[w] for w in self.workers}
        if self.mode == "sync" and len(set(per_worker.values())) > 1:
            listed = ", ".join(f"rank {w}: {c}" for w, c in per_worker.items())
            raise ValueError(
                f"mode='sync' needs the same number of batches on every worker, got {listed} "
                f"(batch_size={self.batch_size}); give the workers equal shares of the data, "
                "or use mode='async' or 'ssp'"
            )

    def _own_shard(self) -> dict[str, torch.Tensor]:
        shard = set(self.roles.shard_of(self.ctx.rank))
        return {n: p.detach() for n, p in self.model.named_parameters() if n in shard}

    def _share_parameters(self, own: dict[str, torch.Tensor] | None) -> None:
        """Each server broadcasts its shard (``own`` on a server); every rank loads them all."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for server, names in zip(self.servers, self.roles.shards):
                mine = self.ctx.rank == server
                flat = torch.cat([own[n].reshape(-1) for n in names]) if mine else None
                flat = self.ctx.broadcast(flat, root=server)
                for name, part in zip(names, flat.split([params[n].numel() for n in names])):
                    params[name].copy_(part.view_as(params[name]))
