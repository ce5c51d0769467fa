"""Data-parallel training that checkpoints on a preemption notice and resumes there.

:func:`train` is one rank of a :func:`ddtk.launch` job. It resumes from the newest
committed checkpoint in ``run_dir`` (:func:`ddtk.checkpoint.latest`), trains the
recovery problem (:mod:`ddtk.recovery.common`) with gradients averaged by
``ctx.all_reduce``, commits every ``every`` steps, and listens for a notice
(:mod:`ddtk.faults.preemption`): ``SIGTERM`` or ``SIGUSR1`` sets a flag; at the next
step boundary all ranks agree to stop (one ``MAX`` all-reduce), rank 0 commits the
checkpoint of that step (``ddtk.checkpoint.save``: temporary files, fsync, rename,
manifest last), every rank passes a barrier, and :func:`train` returns, so the
rank process exits with status 0. Started again on the same ``run_dir``, it
resumes at exactly that step; the data of a step is a function of the step, so
the resumed run ends bitwise equal to an uninterrupted one.

Each rank reports its progress to the launcher (``ctx.report``) as dicts with an
``event`` of ``"start"``, ``"step"``, ``"save"`` (a commit begins) and ``"commit"``,
and its ``pid``, ``step`` and time ``t``: a notebook sends the notice from its
``on_report`` callback and draws the timeline from them. ``ballast_mb`` adds a
tensor of that size to every checkpoint, standing in for the rest of a large
model's state: the save becomes as slow as a bigger model's, the steps do not.
``notice_at=(rank, step, "SIGTERM")`` makes that rank send itself the signal just
before that step (a notice at a known moment, for tests).

>>> import ddtk, tempfile
>>> run = tempfile.mkdtemp()
>>> out = ddtk.launch(train, 2, args=(run, 6), kwargs={"notice_at": (1, 3, "SIGUSR1")},
...                   echo=False, timeout=120)
>>> [(o["start"], o["stop"], o["preempted"], o["timeline"]["signal"]) for o in out]
[(0, 3, True, None), (0, 3, True, 'SIGUSR1')]
>>> ckpt.latest(run).name  # committed at the step both ranks agreed on; a restart resumes there
'step-000003'
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

import ddtk.checkpoint as ckpt
from ddtk.faults.preemption import (
    PreemptionHandler,
    PreemptionTimeline,
    agree_to_stop,
    signal_from_name,
)
from ddtk.recovery.common import build, fingerprint, local_batch, loss_fn

__all__ = ["dp_step", "train"]


def dp_step(ctx: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
            batch_size: int, seed: int) -> float:  # fmt: skip
    """One data-parallel step on this rank's share of step ``step``'s batch; the local loss.

    The gradients travel as one flat tensor: a sum all-reduce, then division by the
    world size (exact for 1 and 2 ranks, so the result matches
    :func:`ddtk.recovery.common.reference` bit for bit there).
    """
    x, y = local_batch(step, ctx.rank, ctx.world_size, batch_size, seed)
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    params = list(model.parameters())
    flat = ctx.all_reduce(torch.cat([p.grad.reshape(-1) for p in params])) / ctx.world_size
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()
    return float(loss.detach())


def _commit(ctx: Any, run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            step: int, ballast: torch.Tensor | None, keep_last: int | None) -> None:  # fmt: skip
    """Rank 0 commits step ``step``; every rank waits until it is committed."""
    ctx.report({"event": "save", "rank": ctx.rank, "pid": os.getpid(), "step": step,
                "t": time.time()})  # fmt: skip
    if ctx.rank == 0:
        state = ckpt.capture(model, optimizer, step=step, rng=False, copy=False)
        if ballast is not None:
            state.tensors["ballast"] = ballast
        ckpt.save(run_dir, state, step, world_size=ctx.world_size, keep_last=keep_last)
    ctx.barrier()  # nobody goes on (or exits) before the commit is on disk
    ctx.report({"event": "commit", "rank": ctx.rank, "pid": os.getpid(), "step": step,
                "t": time.time()})  # fmt: skip


def _check(steps: Any, every: Any, batch_size: Any, world_size: int, ballast_mb: Any) -> None:
    for name, value, low in (("steps", steps, 0), ("every", every, 0),
                             ("batch_size", batch_size, 1), ("ballast_mb", ballast_mb, 0)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not divisible by {world_size} ranks")


def train(
    ctx: Any,
    run_dir: str | os.PathLike[str],
    steps: int,
    *,
    every: int = 5,
    seed: int = 0,
    batch_size: int = 24,
    step_sleep: float = 0.0,
    ballast_mb: int = 0,
    keep_last: int | None = 3,
    notice_at: tuple[int, int, str] | None = None,
) -> dict[str, Any]:
    """Train until ``steps`` steps are done or a notice stops every rank; commit; return.

    Returns this rank's ``start`` and ``stop`` steps, whether it was ``preempted``, the
    model's ``fingerprint`` and its :class:`PreemptionTimeline` as ``timeline``.
    ``every=0`` commits only on a notice and at the end.
    """
    _check(steps, every, batch_size, ctx.world_size, ballast_mb)
    run_dir = Path(run_dir)
    torch.set_num_threads(1)
    ballast = torch.zeros(ballast_mb << 18) if ballast_mb else None  # float32: 4 bytes each
    # Installed for the rest of the process: once the checkpoint is committed the rank is on
    # its way out, and a repeated notice (or a launcher's clean-up SIGTERM) changes nothing.
    notice = PreemptionHandler().install()
    model, optimizer = build(seed)
    start, committed = 0, None  # committed: the step whose checkpoint is on disk
    if ckpt.latest(run_dir) is not None:  # every rank reads the same committed files
        start = committed = ckpt.load(run_dir, model, optimizer, rng=False).step
    step = start
    timeline = PreemptionTimeline(ctx.rank)
    ctx.report({"event": "start", "rank": ctx.rank, "pid": os.getpid(), "step": step,
                "t": time.time()})  # fmt: skip
    while True:
        if notice_at is not None and tuple(notice_at[:2]) == (ctx.rank, step):
            os.kill(os.getpid(), signal_from_name(notice_at[2]))
        preempted = agree_to_stop(ctx, notice.requested)  # the step boundary
        if preempted or step >= steps:
            break
        dp_step(ctx, model, optimizer, step, batch_size, seed)
        step += 1
        ctx.report({"event": "step", "rank": ctx.rank, "pid": os.getpid(), "step": step,
                    "t": time.time()})  # fmt: skip
        if every and step % every == 0:
            _commit(ctx, run_dir, model, optimizer, step, ballast, keep_last)
            committed = step
        if step_sleep:
            time.sleep(step_sleep)
    timeline.step, timeline.boundary = step, time.time()
    if committed != step:
        _commit(ctx, run_dir, model, optimizer, step, ballast, keep_last)
    timeline.committed = time.time()
    timeline.signal, timeline.received = notice.signal_name, notice.received_at
    timeline.exit = time.time()
    return {"rank": ctx.rank, "start": start, "stop": step, "preempted": preempted,
            "fingerprint": fingerprint(model), "timeline": timeline.as_dict()}  # fmt: skip
