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

:class:`ParameterServer` (:mod:`ddtk.parallel.ps_store`) is the server-side store, usable
without processes, and explains clocks and staleness.
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

from typing import Any

from ddtk.parallel import ps_runtime
from ddtk.parallel.ps_store import MODES, ParameterServer, assign_shards, check_mode, check_roles
from ddtk.parallel.ps_trainer import ParameterServerTrainer

__all__ = [
    "MODES",
    "ParameterServer",
    "ParameterServerTrainer",
    "assign_shards",
    "check_mode",
    "check_roles",
    "run_parameter_server",
]


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
    plan = ps_runtime.Plan(
        mode=mode, steps=steps, lr=float(lr), batch_size=batch_size, servers=servers,
        workers=workers, max_staleness=max_staleness, straggler=straggler,
        step_delay=float(step_delay), model=model, dataset=dataset, seed=seed,
        trace_every=trace_every,
    )  # fmt: skip
    return ps_runtime.run(ctx, plan)
