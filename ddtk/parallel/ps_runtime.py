"""The parameter-server protocol on real ranks: what servers and workers send each other.

One implementation serves both users of the protocol: :func:`run` (behind
:func:`~ddtk.parallel.parameter_server.run_parameter_server`, an experiment with
a fixed gradient budget) and
:class:`~ddtk.parallel.parameter_server.ParameterServerTrainer` (one pass over
each worker's data per epoch). :func:`serve` is a server rank's loop, :func:`work`
a worker rank's; :class:`Roles` is what they agree on.

Ranks ``servers`` hold the parameters (one :class:`ParameterServer` store each,
for their shard of the tensors); ranks ``workers`` compute gradients. Three tags
keep the traffic apart:

* ``TAG_REQUEST`` (worker to server): :class:`Pull` ("I want to compute my step
  ``clock``"), :class:`Push` (the gradients of a step for this server's tensors)
  and :class:`Done` (no more messages from this worker). A server receives them
  all from any rank with one ``ctx.recv(None, TAG_REQUEST)``; messages from one
  worker arrive in the order it sent them, so a worker's push of step ``c`` is
  always in the store before its pull of step ``c + 1``.
* ``TAG_REPLY`` (server to worker): :class:`Params` (the shard's current values
  and versions) or :class:`Stop`.
* ``TAG_RESULT`` (to the lead server, rank ``servers[0]``, once at the end of a
  :func:`run`): every other server's shard and statistics, every worker's summary.

A worker's step: take its next batch (none left: it is done); pull from the lead
server, which grants the step, or says :class:`Stop` once a gradient budget is
handed out; then pull from the other servers; compute; push to every server. A
server answers a pull only when its store's consistency rule allows the read
(:meth:`ParameterServer.can_read`), so in sync and ssp mode a worker that is too
far ahead simply waits for its reply. Shutdown: a worker that runs out of batches
sends :class:`Done` to every server (one that got :class:`Stop`, to the other
servers); a done worker no longer holds the global clock back
(:meth:`ParameterServer.finish`), so workers with fewer batches never block the
others; a server stops serving once every worker is stopped or done. Every
message sent is received, so collectives may follow at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ddtk.data import DataPartitioner, load_dataset, train_test_split
from ddtk.models import build_model
from ddtk.parallel.ps_store import ParameterServer, assign_shards
from ddtk.parallel.trainer import batches

TAG_REQUEST, TAG_REPLY, TAG_RESULT = 401, 402, 403


@dataclass(frozen=True)
class Roles:
    """What every rank of one parameter-server job agrees on: who serves which tensors, who works."""

    mode: str
    max_staleness: int | None
    lr: float
    servers: list[int]
    workers: list[int]
    shards: list[list[str]]  # shards[i]: the parameter names servers[i] holds

    def shard_of(self, rank: int) -> list[str]:
        """The parameter names server ``rank`` holds."""
        return self.shards[self.servers.index(rank)]


@dataclass(frozen=True)
class Plan:
    """Everything every rank must agree on for one run (built by ``run_parameter_server``)."""

    mode: str
    steps: int
    lr: float
    batch_size: int
    servers: list[int]
    workers: list[int]
    max_staleness: int | None = None
    straggler: tuple[int, float] | None = None
    step_delay: float = 0.0
    model: str = "mlp"
    dataset: str = "digits"
    seed: int = 0
    trace_every: int | None = None


@dataclass(frozen=True)
class Pull:
    clock: int  # the step the worker is about to compute


@dataclass(frozen=True)
class Push:
    clock: int
    grads: dict[str, torch.Tensor]
    versions: dict[str, int]  # the versions the gradients were computed on


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Params:
    values: dict[str, torch.Tensor]
    versions: dict[str, int]


@dataclass(frozen=True)
class Stop:
    pass


# -- server side -------------------------------------------------------------------------
def serve(
    ctx: Any,
    roles: Roles,
    model: nn.Module,
    budget: int | None = None,
    trace_every: int | None = None,
) -> dict[str, Any]:
    """Serve this rank's shard, starting from ``model``'s values, until every worker stopped.

    ``budget`` (lead server only): how many steps to grant in all before answering
    :class:`Stop`; None grants every pull, and the workers end by running out of
    batches. ``trace_every``: keep a copy of the shard every that many updates.

    Returns the shard's final ``values`` by name, ``updates`` (applied to the shard),
    ``staleness`` (of each read granted), ``update_delays``, ``seconds`` served,
    ``wait_seconds`` (spent waiting for requests) and ``trace``
    (``(seconds, updates, values)`` snapshots).
    """
    shard = roles.shard_of(ctx.rank)
    store = ParameterServer(roles.workers, roles.mode, roles.max_staleness)
    for name, p in model.named_parameters():
        if name in shard:
            store.set_parameters(name, p)
    server = _Server(ctx, store, shard, roles.lr, budget, trace_every)
    wait = 0.0
    while len(server.stopped) < len(roles.workers):
        t0 = time.perf_counter()
        msg = ctx.recv(None, TAG_REQUEST)  # from whichever worker speaks first
        wait += time.perf_counter() - t0
        server.receive(msg.src, msg.payload)
        server.answer_waiting()
    return {
        "seconds": time.perf_counter() - server.start,
        "wait_seconds": wait,
        "values": {n: store.get_parameters(n) for n in shard},
        "updates": store.version(shard[0]),
        "staleness": server.staleness,
        "update_delays": server.delays,
        "trace": server.trace,
    }


class _Server:
    """What one server rank tracks while it serves: the held-back pulls and the statistics."""

    def __init__(
        self,
        ctx: Any,
        store: ParameterServer,
        shard: list[str],
        lr: float,
        budget: int | None,
        trace_every: int | None,
    ):
        self.ctx, self.store, self.shard, self.lr = ctx, store, shard, lr
        self.budget, self.granted = budget, 0  # Stop once `budget` steps are granted
        self.waiting: list[int] = []  # workers whose pull the consistency rule holds back
        self.stopped: set[int] = set()
        self.staleness: list[int] = []  # of each read granted, so of each gradient applied here
        self.delays: list[int] = []
        self.trace_every, self.next_snapshot = trace_every, 0
        self.trace: list[tuple[float, int, dict[str, torch.Tensor]]] = []
        self.start = time.perf_counter()
        self.snapshot()

    def receive(self, worker: int, request: Pull | Push | Done) -> None:
        if isinstance(request, Push):
            self.delays += _apply(self.store, worker, request, self.lr)
            self.snapshot()
        elif isinstance(request, Pull):
            if request.clock != self.store.clock(worker):  # impossible unless messages got lost
                raise RuntimeError(f"worker {worker} pulls for step {request.clock} "
                                   f"but pushed {self.store.clock(worker)} steps")  # fmt: skip
            self.waiting.append(worker)
        else:
            self.stop(worker)

    def stop(self, worker: int) -> None:
        self.stopped.add(worker)
        self.store.finish(worker)

    def answer_waiting(self) -> None:
        """Reply to every held-back pull the budget ends or the consistency rule now allows."""
        still = []
        for w in self.waiting:
            if self.granted == self.budget:
                self.ctx.send(Stop(), w, TAG_REPLY)
                self.stop(w)
            elif self.store.can_read(w):
                self.staleness.append(self.store.staleness(w))
                values = {n: self.store.get_parameters(n) for n in self.shard}
                versions = {n: self.store.version(n) for n in self.shard}
                self.ctx.send(Params(values, versions), w, TAG_REPLY)
                self.granted += 1
            else:
                still.append(w)
        self.waiting = still

    def snapshot(self) -> None:
        """With ``trace_every``: copy the shard when another ``trace_every`` updates are in."""
        version = self.store.version(self.shard[0])
        if self.trace_every is None or version < self.next_snapshot:
            return
        values = {n: self.store.get_parameters(n) for n in self.shard}
        self.trace.append((time.perf_counter() - self.start, version, values))
        self.next_snapshot = (version // self.trace_every + 1) * self.trace_every


def _apply(store: ParameterServer, worker: int, push: Push, lr: float) -> list[int]:
    """Put a worker's gradients into the store, advance its clock, apply what is ready.

    Returns the update delays of the gradients applied (those of the shard's first
    tensor: all the shard's tensors are updated together).
    """
    for name, grad in push.grads.items():
        store.accumulate_gradient(name, grad, worker, push.versions[name])
    store.tick(worker)
    applied = [store.apply_gradients(name, lr) for name in push.grads if store.ready(name)]
    return applied[0] if applied else []


# -- worker side -------------------------------------------------------------------------
def work(
    ctx: Any,
    roles: Roles,
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    stream: Iterable[tuple[torch.Tensor, torch.Tensor]],
    delay: float = 0.0,
    on_step: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """For each batch of ``stream``: pull, compute the gradient, push; until it ends or a server says stop.

    ``delay`` seconds of sleep per step simulate a slower worker; ``on_step(loss)``
    is called after each push. Returns ``steps``, ``wait_seconds`` (spent waiting for
    pulls), ``losses`` (one per step) and ``samples``/``loss_sum`` (sample-weighted).
    """
    params = dict(model.named_parameters())
    clock, wait, losses, samples, loss_sum, stopped = 0, 0.0, [], 0, 0.0, False
    for xb, yb in stream:
        t0 = time.perf_counter()
        reply = _pull(ctx, roles.servers, clock)
        wait += time.perf_counter() - t0
        if reply is None:
            stopped = True
            break
        with torch.no_grad():
            for name, value in reply.values.items():
                params[name].copy_(value)
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        losses.append(loss.item())
        samples, loss_sum = samples + len(yb), loss_sum + losses[-1] * len(yb)
        if delay:
            time.sleep(delay)
        for server, names in zip(roles.servers, roles.shards):
            grads = {n: params[n].grad for n in names}
            ctx.send(Push(clock, grads, {n: reply.versions[n] for n in names}), server, TAG_REQUEST)
        clock += 1
        if on_step is not None:
            on_step(losses[-1])
    for server in roles.servers[1:] if stopped else roles.servers:
        ctx.send(Done(), server, TAG_REQUEST)
    return {
        "steps": clock,
        "wait_seconds": wait,
        "losses": losses,
        "samples": samples,
        "loss_sum": loss_sum,
    }


def _pull(ctx: Any, servers: list[int], clock: int) -> Params | None:
    """Ask the lead server for step ``clock``, then the others; None if the lead says stop."""
    ctx.send(Pull(clock), servers[0], TAG_REQUEST)
    first = ctx.recv(servers[0], TAG_REPLY).payload
    if isinstance(first, Stop):
        return None
    for server in servers[1:]:
        ctx.send(Pull(clock), server, TAG_REQUEST)
    parts = [first] + [ctx.recv(server, TAG_REPLY).payload for server in servers[1:]]
    return Params(
        {n: v for p in parts for n, v in p.values.items()},
        {n: v for p in parts for n, v in p.versions.items()},
    )


# -- run_parameter_server: a fixed gradient budget on a named dataset ----------------------
def run(ctx: Any, plan: Plan) -> dict[str, Any] | None:
    """Run ``plan`` on this rank: serve if it is a server rank, work otherwise."""
    train, test, model = _setup(plan)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    roles = Roles(
        plan.mode, plan.max_staleness, plan.lr, plan.servers, plan.workers,
        assign_shards(sizes, len(plan.servers)),
    )  # fmt: skip
    ctx.barrier()  # every rank is set up: the clock starts now
    out = None
    if ctx.rank == plan.servers[0]:
        lead = serve(ctx, roles, model, plan.steps * len(plan.workers), plan.trace_every)
        out = _summarise(ctx, plan, model, test, lead)
    elif ctx.rank in plan.servers:
        ctx.send(serve(ctx, roles, model, None, plan.trace_every), plan.servers[0], TAG_RESULT)
    else:
        part = DataPartitioner(len(train), len(plan.workers), "shuffled", plan.seed)
        x, y = train.subset(part.get_indices(plan.workers.index(ctx.rank)))
        delay = plan.step_delay
        if plan.straggler is not None and plan.straggler[0] == ctx.rank:
            delay += plan.straggler[1]
        stream = _batch_stream(x, y, plan.batch_size, plan.seed)
        summary = work(ctx, roles, model, nn.functional.cross_entropy, stream, delay)
        ctx.send(summary, plan.servers[0], TAG_RESULT)
    ctx.barrier()  # nobody starts another run while this run's messages are in flight
    return out


def _setup(plan: Plan) -> tuple[Any, Any, nn.Module]:
    """The train and held-out splits and the initial model, the same on every rank."""
    ds = load_dataset(plan.dataset, seed=plan.seed)
    if ds.num_classes < 2:
        raise ValueError(f"the parameter server trains classifiers; {plan.dataset!r} is not one")
    train, test = train_test_split(ds, test_fraction=0.2, seed=plan.seed)
    if len(train) // len(plan.workers) < plan.batch_size:
        raise ValueError(
            f"each of the {len(plan.workers)} workers gets about {len(train) // len(plan.workers)} "
            f"training samples, fewer than batch_size={plan.batch_size}"
        )
    model = build_model(plan.model, ds.input_shape, ds.num_classes, seed=plan.seed)
    return train, test, model


def _summarise(
    ctx: Any, plan: Plan, model: nn.Module, test: Any, lead: dict[str, Any]
) -> dict[str, Any]:
    """On the lead server: collect the other shards and the workers' summaries, evaluate."""
    shards = [lead] + [ctx.recv(s, TAG_RESULT).payload for s in plan.servers[1:]]
    workers = {w: ctx.recv(w, TAG_RESULT).payload for w in plan.workers}
    values = {n: v for shard in shards for n, v in shard["values"].items()}
    params = {name: values[name] for name, _ in model.named_parameters()}  # the model's order
    accuracy, test_loss = _evaluate(model, params, test)
    staleness = [s for shard in shards for s in shard["staleness"]]
    gradients = sum(s["steps"] for s in workers.values())
    seconds = lead["seconds"]
    out = {
        "mode": plan.mode,
        "max_staleness": plan.max_staleness,
        "num_servers": len(plan.servers),
        "num_workers": len(plan.workers),
        "straggler": plan.straggler,
        "wall_seconds": seconds,
        "updates": lead["updates"],
        "gradients": gradients,
        "updates_per_second": lead["updates"] / seconds,
        "gradients_per_second": gradients / seconds,
        "accuracy": accuracy,
        "test_loss": test_loss,
        "staleness": staleness,
        "staleness_histogram": [staleness.count(k) for k in range(max(staleness, default=-1) + 1)],
        "max_staleness_observed": max(staleness, default=0),
        "update_delays": [d for shard in shards for d in shard["update_delays"]],
        "worker_steps": {w: s["steps"] for w, s in workers.items()},
        "worker_wait_seconds": {w: s["wait_seconds"] for w, s in workers.items()},
        "worker_losses": {w: s["losses"] for w, s in workers.items()},
        "parameters": params,
    }
    if plan.trace_every is not None:
        out["trace"] = _trace(model, test, shards, (seconds, lead["updates"], accuracy, test_loss))
    return out


def _trace(
    model: nn.Module,
    test: Any,
    shards: list[dict[str, Any]],
    final: tuple[float, int, float, float],
) -> dict[str, list[float]]:
    """Held-out accuracy of the snapshots every server took at the same update counts, then the end."""
    snapshots = [{v: (t, values) for t, v, values in shard["trace"]} for shard in shards]
    trace: dict[str, list[float]] = {"seconds": [], "updates": [], "accuracy": [], "test_loss": []}
    for v in sorted(set.intersection(*(set(s) for s in snapshots))):
        values = {n: x for s in snapshots for n, x in s[v][1].items()}
        point = (snapshots[0][v][0], v, *_evaluate(model, values, test))
        for key, value in zip(trace, point):
            trace[key].append(value)
    if not trace["updates"] or trace["updates"][-1] != final[1]:
        for key, value in zip(trace, final):
            trace[key].append(value)
    return trace


def _evaluate(model: nn.Module, params: dict[str, torch.Tensor], test: Any) -> tuple[float, float]:
    """Held-out accuracy and cross-entropy of ``model`` with ``params`` loaded into it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
        logits = model(test.x)
    accuracy = float((logits.argmax(1) == test.y).float().mean())
    return accuracy, float(nn.functional.cross_entropy(logits, test.y))


def _batch_stream(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Full batches for ever: epoch e is ``batches(x, y, batch_size, seed + e, drop_last=True)``."""
    epoch = 0
    while True:
        yield from batches(x, y, batch_size, seed=seed + epoch, drop_last=True)
        epoch += 1
