"""The parameter server's store: parameters by name, the gradients received, and the workers' clocks.

It holds no process and sends no message, so it can be read, tested and
stepped through in one process; :mod:`ddtk.parallel.ps_runtime` puts one store
on every server rank. The consistency modes are explained in
:mod:`ddtk.parallel.parameter_server`.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ddtk.data import balance_workload

__all__ = ["MODES", "ParameterServer", "assign_shards", "check_mode", "check_roles"]

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
        mode: ``"sync"``, ``"async"`` or ``"ssp"`` (see :mod:`ddtk.parallel.parameter_server`).
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
