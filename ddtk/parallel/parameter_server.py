"""Parameter server: servers hold the model, workers pull weights and push gradients.

The parameter-server architecture (Li et al., "Scaling Distributed Machine
Learning with the Parameter Server", OSDI 2014) splits the ranks in two roles.
*Servers* own the parameters, possibly sharded by tensor across several server
ranks. *Workers* own the data: each step a worker pulls the current weights,
computes a gradient on a batch of its partition and pushes it back; the servers
apply it. The consistency model decides when a worker may read again:

* ``"sync"`` (bulk synchronous): the server waits for one gradient from every
  worker, averages them, takes one step, and only then lets the workers pull.
  This is exactly synchronous SGD on the union of the workers' batches. Every
  read is fresh (staleness 0), but each step runs at the pace of the slowest
  worker: one straggler slows everyone.
* ``"async"`` (the Downpour/Hogwild idea; Recht et al., "Hogwild!", NIPS 2011):
  the server applies each gradient alone as it arrives, and a worker pulls
  whatever is current. No worker ever waits for another, so throughput is (up
  to the server's own speed) the sum of the workers' speeds; the price is
  staleness. A fast worker reads
  weights that lack many of a slow worker's updates, and a slow worker's
  gradient lands on weights that moved on long ago. Staleness is unbounded
  and grows with the spread of worker speeds, and the stable learning rate
  shrinks as it grows.
* ``"ssp"`` (stale synchronous parallel; Ho et al., "More Effective Distributed
  ML via a Stale Synchronous Parallel Parameter Server", NIPS 2013): gradients
  are applied as they arrive, as in async, but a worker may run at most
  ``max_staleness`` steps ahead of the slowest one; beyond that it blocks until
  the slow one catches up. It interpolates between the two: ``max_staleness=0``
  waits like sync (though each gradient is still applied alone), an infinite
  bound is async. Fast workers keep working through a short hiccup of another
  worker, and Ho et al. prove SGD still converges for any finite bound. Against a
  straggler that is slow at every step, though, ssp runs at nearly the
  straggler's pace, as sync does: the fast workers soon reach the bound and wait.

**Clocks and staleness.** A worker's clock is the number of steps it has
pushed; the global clock is the slowest worker's clock, so parameters read at
global clock ``v`` contain at least every worker's gradients of steps
``0 .. v-1``. A
gradient of a worker's step ``c`` that was computed on parameters read at global
clock ``v`` has *staleness* ``c - v``: synchronous SGD would compute it on the
parameters of clock ``c``, and it may miss up to ``c - v`` steps of the slower
workers' updates. The read rule of every mode is the same, ``c - v <=
bound``, with bound 0 (sync), ``max_staleness`` (ssp) or none (async), so the
staleness recorded for sync is always 0 and for ssp never above
``max_staleness``. The server also records each gradient's *update delay*: the
number of updates applied between the worker's read and this gradient (the
delay of the async SGD analyses).

:class:`ParameterServer` is the server-side store, usable without processes.
The protocol itself (:mod:`ddtk.parallel.ps_runtime`) runs on the ranks of a
:func:`ddtk.launch` in two ways: :class:`ParameterServerTrainer` offers it
through the trainer interface every ddtk strategy shares (``train_epoch``,
``fit``, ``evaluate``...) on data you give it, and :func:`run_parameter_server`
runs a whole experiment on a named dataset and returns the metrics a notebook
plots:

>>> import ddtk
>>> from ddtk.parallel.parameter_server import run_parameter_server
>>> def compare(ctx, straggler):   # rank 0 serves, ranks 1-3 work, rank 3 is slow
...     runs = {"sync": run_parameter_server(ctx, "sync", steps=30, straggler=straggler),
...             "async": run_parameter_server(ctx, "async", steps=30, straggler=straggler),
...             "ssp": run_parameter_server(ctx, "ssp", max_staleness=2, steps=30,
...                                         straggler=straggler)}
...     return runs if ctx.rank == 0 else None
>>> runs = ddtk.launch(compare, world_size=4, args=((3, 0.02),), echo=False)[0]
>>> sorted(runs["ssp"]["worker_steps"])
[1, 2, 3]
>>> runs["ssp"]["max_staleness_observed"] <= 2
True
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ddtk.data import balance_workload
from ddtk.parallel.callbacks import Callback
from ddtk.parallel.trainer import DistributedTrainer, batches

__all__ = [
    "MODES",
    "ParameterServer",
    "ParameterServerTrainer",
    "assign_shards",
    "run_parameter_server",
]

MODES = ("sync", "async", "ssp")


def check_mode(mode: Any, max_staleness: Any) -> int | None:
    """Validate a mode and its staleness bound; return the read bound (None: unbounded)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode != "ssp":
        if max_staleness is not None:
            raise ValueError(f"max_staleness only applies to mode='ssp', not mode={mode!r}")
        return 0 if mode == "sync" else None
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int):
        raise ValueError(f"mode='ssp' needs an integer max_staleness >= 0, got {max_staleness!r}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return max_staleness


class ParameterServer:
    """The server-side store: parameters by name, gradients received, and the workers' clocks.

    Args:
        workers: the worker ranks that push gradients (or their number ``n``: ranks ``0..n-1``).
        mode: ``"sync"``, ``"async"`` or ``"ssp"`` (see the module docstring).
        max_staleness: how many steps a worker may run ahead of the slowest one (ssp only).

    In sync mode ``ready(name)`` is true once every worker pushed one gradient for
    ``name`` in the current round, and :meth:`apply_gradients` takes one step with
    their average; in async and ssp modes it is true as soon as one gradient
    arrived, and each gradient is applied as its own update.

    >>> import torch
    >>> ps = ParameterServer(workers=[1, 2], mode="sync")
    >>> ps.set_parameters("w", torch.zeros(2))
    >>> ps.accumulate_gradient("w", torch.tensor([1.0, 2.0]), worker_rank=1)
    >>> ps.ready("w")
    False
    >>> ps.accumulate_gradient("w", torch.tensor([3.0, 4.0]), worker_rank=2)
    >>> ps.apply_gradients("w", lr=0.5)   # update delays of the gradients applied
    [0, 0]
    >>> ps.get_parameters("w")
    tensor([-1.0000, -1.5000])
    """

    def __init__(
        self, workers: int | Sequence[int], mode: str = "sync", max_staleness: int | None = None
    ):
        self.bound = check_mode(mode, max_staleness)
        self.mode, self.max_staleness = mode, max_staleness
        if isinstance(workers, int) and not isinstance(workers, bool):
            workers = range(workers)
        self.workers = sorted(int(w) for w in workers)
        if not self.workers or len(set(self.workers)) != len(self.workers):
            raise ValueError(f"workers must be distinct ranks, at least one, got {workers!r}")
        self._values: dict[str, torch.Tensor] = {}
        self._versions: dict[str, int] = {}
        self._pending: dict[str, list[tuple[int, torch.Tensor, int]]] = {}  # (worker, grad, read)
        self._clocks = dict.fromkeys(self.workers, 0)
        self._finished: set[int] = set()

    # -- parameters ----------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Parameter names, in the order they were first set."""
        return list(self._values)

    def set_parameters(self, name: str, tensor: torch.Tensor) -> None:
        """Store a copy of ``tensor`` under ``name`` (a new name starts at version 0).

        An existing name keeps its version and pending gradients, so the shape must not change.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"parameters must be a torch.Tensor, got {type(tensor).__name__}")
        if name in self._values and tensor.shape != self._values[name].shape:
            raise ValueError(
                f"parameter {name!r} has shape {tuple(self._values[name].shape)}; "
                f"cannot replace it with shape {tuple(tensor.shape)}"
            )
        self._values[name] = tensor.detach().clone()
        self._versions.setdefault(name, 0)
        self._pending.setdefault(name, [])

    def get_parameters(self, name: str) -> torch.Tensor:
        """A copy of the current value of ``name``."""
        return self._value(name).clone()

    def version(self, name: str) -> int:
        """Number of updates applied to ``name`` so far."""
        self._value(name)
        return self._versions[name]

    # -- gradients -----------------------------------------------------------------------
    def accumulate_gradient(
        self, name: str, grad: torch.Tensor, worker_rank: int, version: int | None = None
    ) -> None:
        """Receive ``worker_rank``'s gradient for ``name``, computed on ``version`` (default: the current one).

        Raises ValueError for an unknown name or worker, a wrong shape, a version from
        the future, and in sync mode for a stale version or a second gradient from the
        same worker in one round (it would otherwise be counted twice).
        """
        value = self._value(name)
        if worker_rank not in self._clocks:
            raise ValueError(f"unknown worker {worker_rank!r}; the workers are {self.workers}")
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"gradients must be a torch.Tensor, got {type(grad).__name__}")
        if grad.shape != value.shape:
            raise ValueError(
                f"gradient for {name!r} from worker {worker_rank} has shape {tuple(grad.shape)}, "
                f"expected {tuple(value.shape)}"
            )
        current = self._versions[name]
        version = current if version is None else version
        if not 0 <= version <= current:
            raise ValueError(
                f"gradient for {name!r} claims version {version}; current is {current}"
            )
        if self.mode == "sync":
            if version != current:
                raise ValueError(
                    f"sync mode: worker {worker_rank}'s gradient for {name!r} was computed on "
                    f"version {version}, but this round updates version {current}"
                )
            if any(w == worker_rank for w, _, _ in self._pending[name]):
                raise ValueError(
                    f"worker {worker_rank} already pushed a gradient for {name!r} in this round"
                )
        self._pending[name].append((worker_rank, grad.detach().to(value.dtype), version))

    def ready(self, name: str) -> bool:
        """True when :meth:`apply_gradients` may run: all workers in (sync), any gradient (async, ssp)."""
        self._value(name)
        needed = len(self.workers) if self.mode == "sync" else 1
        return len(self._pending[name]) >= needed

    def apply_gradients(self, name: str, lr: float) -> list[int]:
        """Apply the gradients received for ``name`` (``value -= lr * grad``); return their update delays.

        Sync: one update with the average over workers, summed in worker order.
        Async and ssp: one update per gradient, in arrival order.
        """
        if not self.ready(name):
            missing = sorted(set(self.workers) - {w for w, _, _ in self._pending[name]})
            raise RuntimeError(f"{name!r} is not ready: no gradient yet from workers {missing}")
        value, pending = self._values[name], self._pending[name]
        if self.mode == "sync":
            grads = [g for _, g, _ in sorted(pending, key=lambda p: p[0])]
            value -= lr * torch.stack(grads).mean(0)
            delays = [0] * len(grads)
            self._versions[name] += 1
        else:
            delays = []
            for _, grad, read in pending:
                delays.append(self._versions[name] - read)
                value -= lr * grad
                self._versions[name] += 1
        self.clear_gradients(name)
        return delays

    def clear_gradients(self, name: str) -> None:
        """Drop the gradients received for ``name`` and not applied."""
        self._value(name)
        self._pending[name] = []

    # -- clocks: when may a worker read? -------------------------------------------------
    def clock(self, worker_rank: int) -> int:
        """Number of steps ``worker_rank`` has finished (pushed)."""
        if worker_rank not in self._clocks:
            raise ValueError(f"unknown worker {worker_rank!r}; the workers are {self.workers}")
        return self._clocks[worker_rank]

    @property
    def global_clock(self) -> int:
        """The slowest unfinished worker's clock: every worker's steps before it are in the parameters.

        Finished workers (:meth:`finish`) have all their steps in, so they do not hold it back.
        """
        active = [c for w, c in self._clocks.items() if w not in self._finished]
        return min(active) if active else max(self._clocks.values())

    def tick(self, worker_rank: int) -> None:
        """Record that ``worker_rank`` pushed all its gradients of one step."""
        self._clocks[worker_rank] = self.clock(worker_rank) + 1

    def finish(self, worker_rank: int) -> None:
        """Record that ``worker_rank`` will push no more steps, so it stops holding the others back.

        In async and ssp mode workers may take different numbers of steps (an epoch of
        unequal partitions): once one is done, the ssp bound is measured against the
        slowest worker still running. In sync mode every round needs every worker, so
        all workers must take the same number of steps.
        """
        self.clock(worker_rank)
        self._finished.add(worker_rank)

    def staleness(self, worker_rank: int) -> int:
        """Staleness of a read by ``worker_rank`` now: its clock minus the global clock."""
        return self.clock(worker_rank) - self.global_clock

    def can_read(self, worker_rank: int) -> bool:
        """The consistency rule: may ``worker_rank`` pull now, to compute its next step?"""
        return self.bound is None or self.staleness(worker_rank) <= self.bound

    def _value(self, name: str) -> torch.Tensor:
        if name not in self._values:
            raise ValueError(
                f"unknown parameter {name!r}; known: {', '.join(self._values) or 'none'}"
            )
        return self._values[name]


def assign_shards(sizes: Mapping[str, int], num_servers: int) -> list[list[str]]:
    """Split parameter names across ``num_servers`` servers, balancing the elements each one holds.

    Greedy LPT (:func:`ddtk.data.balance_workload`): largest tensor first, each to
    the least-loaded server. Each server's names keep the order of ``sizes``.
    """
    if isinstance(num_servers, bool) or not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be an integer >= 1, got {num_servers!r}")
    if num_servers > len(sizes):
        raise ValueError(
            f"num_servers={num_servers} exceeds the model's {len(sizes)} parameter tensors; "
            "every server needs at least one"
        )
    names = list(sizes)
    assignment, _ = balance_workload([sizes[n] for n in names], num_servers)
    return [[names[i] for i in sorted(tasks)] for tasks in assignment]


def check_roles(
    world_size: int, num_servers: Any, straggler: Any, step_delay: Any
) -> tuple[list[int], list[int]]:
    """Validate the split into server and worker ranks; return ``(servers, workers)``."""
    if isinstance(num_servers, bool) or not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be an integer >= 1, got {num_servers!r}")
    if world_size < num_servers + 1:
        raise ValueError(
            f"a parameter server needs num_servers={num_servers} server rank(s) and at least one "
            f"worker: world_size must be >= {num_servers + 1}, got {world_size}"
        )
    workers = list(range(num_servers, world_size))
    if straggler is not None and (
        len(straggler) != 2 or straggler[0] not in workers or not straggler[1] >= 0
    ):
        raise ValueError(
            f"straggler must be (worker_rank, seconds >= 0) with a worker rank in {workers}, "
            f"got {straggler!r}"
        )
    if not step_delay >= 0:
        raise ValueError(f"step_delay must be >= 0 seconds, got {step_delay!r}")
    return list(range(num_servers)), workers


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
        from ddtk.parallel.ps_runtime import Roles

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
        from ddtk.parallel import ps_runtime

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


def run_parameter_server(
    ctx: Any,
    mode: str = "sync",
    steps: int = 100,
    lr: float = 0.3,
    batch_size: int = 32,
    max_staleness: int | None = None,
    num_servers: int = 1,
    straggler: tuple[int, float] | None = None,
    step_delay: float = 0.0,
    model: str = "mlp",
    dataset: str = "digits",
    seed: int = 0,
    trace_every: int | None = None,
) -> dict[str, Any] | None:
    """Train ``model`` on ``dataset`` with a parameter server; call it on every rank inside ``ddtk.launch``.

    Ranks ``0 .. num_servers-1`` are servers (the tensors sharded across them,
    balanced by size), the other ranks are workers, each with its own partition of
    the training split. The run ends after ``steps * num_workers`` gradients in all
    (``steps`` rounds in sync mode; in async and ssp fast workers take more of them).

    Args:
        mode: ``"sync"``, ``"async"`` or ``"ssp"``; ``max_staleness`` is the ssp bound.
        steps, lr, batch_size: the gradient budget per worker, the SGD step, the local batch.
        straggler: ``(worker_rank, seconds)``: that worker sleeps this long every step.
        step_delay: seconds every worker sleeps every step (a stand-in for a larger model).
        model, dataset, seed: :func:`ddtk.models.build_model` name, :func:`ddtk.data.load_dataset`
            name (a fifth of it is held out for the accuracy), and the seed of everything.
        trace_every: also return ``trace``, the held-out accuracy over time: the servers
            copy the parameters every ``trace_every`` updates (and at the start), and the
            copies are evaluated after the run, so the servers' pace is not disturbed.

    Returns, on rank 0, a dict: ``mode``, ``wall_seconds``, ``updates`` and ``gradients``
    applied, ``updates_per_second``, ``gradients_per_second``, held-out ``accuracy`` and
    ``test_loss``, ``staleness`` (one entry per gradient applied on each server),
    ``staleness_histogram`` (counts by staleness), ``max_staleness_observed``,
    ``update_delays``, ``worker_steps``, ``worker_wait_seconds`` (time spent waiting for
    pulls) and ``worker_losses`` (training loss of every step), by worker rank, and the
    final ``parameters`` by name. With ``trace_every``, ``trace`` holds the lists
    ``seconds`` (since the start, on the lead server), ``updates``, ``accuracy`` and
    ``test_loss``, ending with the final state. Other ranks return None.

    >>> import ddtk
    >>> from ddtk.parallel.parameter_server import run_parameter_server
    >>> out = ddtk.launch(run_parameter_server, 3, kwargs=dict(mode="ssp", max_staleness=2,
    ...                   steps=40, straggler=(2, 0.02), trace_every=20), echo=False)[0]
    >>> out["max_staleness_observed"] <= 2
    True
    >>> out["trace"]["updates"]
    [0, 20, 40, 60, 80]
    """
    check_mode(mode, max_staleness)
    for name, value, low in (("steps", steps, 1), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if trace_every is not None and (
        isinstance(trace_every, bool) or not isinstance(trace_every, int) or trace_every < 1
    ):
        raise ValueError(f"trace_every must be an integer >= 1 or None, got {trace_every!r}")
    servers, workers = check_roles(ctx.world_size, num_servers, straggler, step_delay)
    from ddtk.parallel import ps_runtime  # the runtime builds on the store defined here

    plan = ps_runtime.Plan(
        mode=mode, steps=steps, lr=float(lr), batch_size=batch_size, servers=servers,
        workers=workers, max_staleness=max_staleness, straggler=straggler,
        step_delay=float(step_delay), model=model, dataset=dataset, seed=seed,
        trace_every=trace_every,
    )  # fmt: skip
    return ps_runtime.run(ctx, plan)
