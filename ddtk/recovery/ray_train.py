"""Training that survives a killed worker under Ray Train: DDP, reported checkpoints, restarts.

Ray Train (the V2 API) starts a group of worker actors that each run
:func:`train_loop`. When any worker dies, the controller stops the whole group
and, while ``FailureConfig(max_failures=N)`` allows, starts a new one; every new
worker gets the latest *registered* checkpoint from ``ray.train.get_checkpoint()``.
A checkpoint is registered once all workers called ``ray.train.report`` for it
and the controller has collected the report (it polls every couple of seconds);
a report still in flight when a worker dies is lost, like an uncommitted write.

Here rank 0 writes each checkpoint with :func:`ddtk.checkpoint.save` (atomic
files, checksummed manifest written last, weights-only tensors) and hands the
``step-NNNNNN`` directory to ``ray.train.report``; the other ranks report
``None``. All ranks then wait for ``ray.train.get_all_reported_checkpoints``
with ``CheckpointConsistencyMode.COMMITTED``, so when training goes past a
commit every rank knows that a restart resumes from it. A restarted worker
loads it with :func:`ddtk.checkpoint.load` (verified, ``weights_only=True``)
before ``prepare_model`` wraps the model in DDP. The data of step ``s`` is a
pure function of ``s`` (:func:`~ddtk.recovery.common.local_batch`), so the
resumed run recomputes the lost steps on the same batches and, with two
workers, ends bitwise equal to :func:`~ddtk.recovery.common.reference`.

Steps are counted from 0; the checkpoint of step ``N`` holds the state after
``N`` completed steps, so the first step after resuming from it is step ``N``.

From a notebook (starts a local Ray session if none is running)::

    from ddtk.recovery.ray_train import run
    result = run(steps=12, every=4, kill_step=10, storage="/tmp/ray-recovery")

or ``python -m ddtk.recovery.ray_train --steps 12 --every 4 --kill-step 10``.
On a cluster, call :func:`run` after ``ray.init(address="auto")`` with a
``storage`` every node can reach (NFS path, or ``s3://...`` for the Ray
checkpoints; the small bookkeeping files in ``work`` need a shared file system).

>>> parse_args(["--steps", "12", "--every", "4", "--kill-step", "10"]).kill_step
10
>>> _check_run_args(steps=12, every=4, kill_step=12, kill_rank=1, num_workers=2,
...                 batch_size=32, max_failures=2)
Traceback (most recent call last):
...
ValueError: kill_step must be in 0..11 (a step index), got 12
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint import atomic_write_bytes, capture, load, save
from ddtk.recovery.common import (
    RecoveryClock,
    build,
    fingerprint,
    kill_self_once,
    local_batch,
    loss_fn,
)

__all__ = ["main", "parse_args", "run", "train_loop"]

COMMIT_TIMEOUT_S = 120.0


def _append(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line (opened per write, so a SIGKILL loses nothing already written)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _commit(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    rank: int,
    world: int,
    loss: float,
    wait: bool,
) -> None:
    """Report the checkpoint of ``step`` (written by rank 0) and wait until Ray committed it."""
    import ray.train

    name = f"step-{step:06d}"
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            path = save(
                tmp, capture(model, optimizer, step=step, rng=False), step, world_size=world
            )
            checkpoint = ray.train.Checkpoint.from_directory(str(path))
        ray.train.report(
            {"step": step, "loss": loss}, checkpoint=checkpoint, checkpoint_dir_name=name
        )
    if wait:
        ray.train.get_all_reported_checkpoints(
            consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED,
            timeout_s=COMMIT_TIMEOUT_S,
        )


def train_loop(config: dict[str, Any]) -> None:
    """The per-worker training function given to ``TorchTrainer``.

    ``config``: ``steps``, ``every``, ``work`` (a directory shared by all workers
    for the kill marker, the recovery clock and the logs), and optionally
    ``kill_step``/``kill_rank`` (that rank SIGKILLs itself before that step, on
    the first attempt only), ``batch_size``, ``seed``, ``wait_commit``.
    Writes ``work/starts.log`` (one line per worker-group start), ``commits.log``,
    ``steps-rank{r}.log`` and, at the end, ``final.json``.
    """
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    steps, every = int(config["steps"]), int(config["every"])
    batch_size, seed = int(config.get("batch_size", 32)), int(config.get("seed", 0))
    kill_step, kill_rank = config.get("kill_step"), config.get("kill_rank", 1)
    wait = bool(config.get("wait_commit", True))
    work = Path(config["work"])
    clock = RecoveryClock(work)

    model, optimizer = build(seed)
    start, resumed_from = 0, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = load(directory, model, optimizer, rng=False).step
        resumed_from = checkpoint.path
    ddp = ray.train.torch.prepare_model(model)
    if rank == 0:
        _append(
            work / "starts.log",
            {"start": start, "world_size": world, "checkpoint": resumed_from, "time": time.time()},
        )
    loss = float("nan")
    for step in range(start, steps):
        if rank == kill_rank and step == kill_step:
            kill_self_once(work / f"killed-rank{rank}-step{step}", clock)
        x, y = local_batch(step, rank, world, batch_size, seed)
        optimizer.zero_grad(set_to_none=True)
        out = loss_fn(ddp(x), y)
        out.backward()
        optimizer.step()
        loss = out.detach().item()
        _append(work / f"steps-rank{rank}.log", {"step": step, "time": time.time()})
        if rank == 0 and step == start:
            clock.mark_resume(step)
        if (step + 1) % every == 0 or step + 1 == steps:
            _commit(model, optimizer, step + 1, rank, world, loss, wait)
            if rank == 0:
                _append(work / "commits.log", {"step": step + 1, "time": time.time()})
    prints: list[str | None] = [None] * world
    dist.all_gather_object(prints, fingerprint(model))
    if len(set(prints)) != 1:
        raise RuntimeError(f"ranks disagree on the final model: {prints}")
    if rank == 0:
        final = {
            "fingerprint": prints[0],
            "steps": steps,
            "world_size": world,
            "start_step": start,
            "last_loss": loss,
        }
        atomic_write_bytes(work / "final.json", json.dumps(final, indent=1).encode())


def _check_run_args(
    *,
    steps: int,
    every: int,
    kill_step: int | None,
    kill_rank: int,
    num_workers: int,
    batch_size: int,
    max_failures: int,
    keep_last: int | None = None,
) -> None:
    """Raise ValueError naming the first bad argument of :func:`run`."""
    for name, value, low in (
        ("steps", steps, 1),
        ("every", every, 1),
        ("num_workers", num_workers, 1),
        ("batch_size", batch_size, 1),
        ("max_failures", max_failures, -1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"keep_last must be None or an integer >= 1, got {keep_last!r}")
    if batch_size % num_workers:
        raise ValueError(f"batch_size {batch_size} is not divisible by num_workers {num_workers}")
    if kill_step is not None:
        if not isinstance(kill_step, int) or not 0 <= kill_step < steps:
            raise ValueError(
                f"kill_step must be in 0..{steps - 1} (a step index), got {kill_step!r}"
            )
        if not isinstance(kill_rank, int) or not 0 <= kill_rank < num_workers:
            raise ValueError(f"kill_rank must be in 0..{num_workers - 1}, got {kill_rank!r}")
        if max_failures == 0:
            raise ValueError(
                "a kill needs max_failures >= 1, or the run fails instead of restarting"
            )


def run(
    steps: int = 40,
    every: int = 10,
    kill_step: int | None = None,
    *,
    storage: str | os.PathLike[str],
    max_failures: int = 2,
    kill_rank: int = 1,
    num_workers: int = 2,
    batch_size: int = 32,
    seed: int = 0,
    name: str | None = None,
    work: str | os.PathLike[str] | None = None,
    keep_last: int | None = None,
    wait_commit: bool = True,
) -> dict[str, Any]:
    """Train with ``TorchTrainer`` (gloo DDP on CPU), killing one worker once; returns a summary.

    ``storage`` is the Ray ``storage_path`` (a local directory here; on a cluster a
    directory shared by all nodes, or a URI such as ``s3://bucket/runs``); the run's
    checkpoints land in ``storage/name/step-NNNNNN``. ``work`` is the directory for
    the kill marker, the recovery clock and the logs; it must be shared by all
    workers (default ``storage/name-work``; required when ``storage`` is a URI).
    ``max_failures=-1`` restarts without limit; ``keep_last`` keeps only the newest
    checkpoints (``CheckpointConfig(num_to_keep=)``); ``wait_commit=False`` goes on
    after ``ray.train.report`` without waiting for the commit, so a crash just after
    a report may resume from the checkpoint before it.
    Starts (and shuts down) a local Ray session when none is running. Raises
    ValueError for bad arguments (before Ray starts) and RuntimeError when training
    fails (e.g. more failures than ``max_failures``).

    The summary: ``fingerprint`` (final parameters), ``steps``, ``world_size``,
    ``restarts`` (worker-group starts minus one), ``starts`` (first step of every
    start), ``resumed_from`` (the checkpoint Ray gave each start), ``commits``
    (committed checkpoint steps, in order), ``resumed_step``
    and ``recovery_seconds`` (crash to first completed step after the restart,
    None without a crash), ``steps_run`` (steps computed by rank 0, repeats
    included), ``checkpoint`` (the last one Ray registered), ``fit_seconds``.
    """
    _check_run_args(
        steps=steps,
        every=every,
        kill_step=kill_step,
        kill_rank=kill_rank,
        num_workers=num_workers,
        batch_size=batch_size,
        max_failures=max_failures,
        keep_last=keep_last,
    )
    name = name or f"ddtk-recovery-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    storage, work = _locations(storage, name, work)
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from ddtk.frameworks.ray_procs import init_local

    work.mkdir(parents=True)
    config = {
        "steps": steps,
        "every": every,
        "kill_step": kill_step,
        "kill_rank": kill_rank,
        "batch_size": batch_size,
        "seed": seed,
        "work": str(work),
        "wait_commit": wait_commit,
    }
    started = not ray.is_initialized()
    if started:
        # A fresh local session, never a cluster that happens to run on this machine
        # (ray.init() without an address would attach to it, and reject num_cpus).
        init_local(num_cpus=max(2, num_workers), include_dashboard=False)
    try:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=False),
            run_config=ray.train.RunConfig(
                name=name,
                storage_path=storage,
                failure_config=ray.train.FailureConfig(max_failures=max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=keep_last),
            ),
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        fit_seconds = time.perf_counter() - t0
    finally:
        if started:
            ray.shutdown()
    if result.error is not None:
        raise RuntimeError(f"Ray Train run {name!r} failed: {result.error}") from result.error
    return _summary(work, result, fit_seconds)


def _locations(
    storage: str | os.PathLike[str], name: str, work: str | os.PathLike[str] | None
) -> tuple[str, Path]:
    """The Ray ``storage_path`` and the work directory; refuse to reuse an existing run."""
    uri = "://" in str(storage)
    if uri and work is None:
        raise ValueError(f"storage {storage!r} is a URI: pass work= (a shared directory) too")
    if not uri:
        storage = str(Path(storage).resolve())
        if (Path(storage) / name).exists():
            raise ValueError(f"a run named {name!r} already exists in {storage}; pick another name")
    work = Path(work).resolve() if work is not None else Path(storage) / f"{name}-work"
    if work.exists():
        raise ValueError(f"the work directory {work} already exists; pick another name or work")
    return str(storage), work


def _summary(work: Path, result: Any, fit_seconds: float) -> dict[str, Any]:
    """Collect what the workers wrote into ``work`` and what Ray returned."""
    final_path = work / "final.json"
    if not final_path.exists():
        raise RuntimeError(f"training ended without writing {final_path}")
    final = json.loads(final_path.read_text())
    start_lines = _read_lines(work / "starts.log")
    starts = [r["start"] for r in start_lines]
    clock = RecoveryClock(work)
    return {
        "fingerprint": final["fingerprint"],
        "steps": final["steps"],
        "world_size": final["world_size"],
        "restarts": len(starts) - 1,
        "starts": starts,
        "resumed_from": [r["checkpoint"] for r in start_lines],
        "commits": [r["step"] for r in _read_lines(work / "commits.log")],
        "resumed_step": clock.resumed_step(),
        "recovery_seconds": clock.recovery_seconds(),
        "steps_run": [r["step"] for r in _read_lines(work / "steps-rank0.log")],
        "last_loss": final["last_loss"],
        "checkpoint": None if result.checkpoint is None else str(result.checkpoint.path),
        "fit_seconds": fit_seconds,
        "work": str(work),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of ``python -m ddtk.recovery.ray_train``."""
    p = argparse.ArgumentParser(prog="ddtk.recovery.ray_train", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="total training steps")
    p.add_argument("--every", type=int, default=10, help="report a checkpoint every K steps")
    p.add_argument("--kill-step", type=int, default=None, help="step before which a worker dies")
    p.add_argument("--kill-rank", type=int, default=1, help="the worker that SIGKILLs itself")
    p.add_argument("--workers", type=int, default=2, help="number of Ray Train workers")
    p.add_argument("--max-failures", type=int, default=2, help="FailureConfig(max_failures=)")
    p.add_argument("--keep-last", type=int, default=None, help="checkpoints kept (default: all)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--storage",
        default=None,
        help="Ray storage_path, a directory or URI (default: a new temporary directory)",
    )
    p.add_argument(
        "--no-wait-commit",
        action="store_true",
        help="go on after ray.train.report without waiting until Ray committed the checkpoint",
    )
    p.add_argument("--work", type=Path, default=None, help="shared directory for logs and clock")
    p.add_argument("--address", default=None, help="Ray address to connect to (default: local)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run once, print the summary as JSON and whether it matches the reference; exit status."""
    from ddtk.recovery.common import reference

    args = parse_args(argv)
    storage = args.storage or tempfile.mkdtemp(prefix="ddtk-ray-")
    if args.address is not None:
        import ray

        ray.init(address=args.address)
    try:
        result = run(
            args.steps,
            args.every,
            args.kill_step,
            storage=storage,
            max_failures=args.max_failures,
            kill_rank=args.kill_rank,
            num_workers=args.workers,
            batch_size=args.batch_size,
            seed=args.seed,
            work=args.work,
            keep_last=args.keep_last,
            wait_commit=not args.no_wait_commit,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ref = fingerprint(reference(args.steps, args.workers, args.batch_size, args.seed))
    result["equals_reference"] = result["fingerprint"] == ref
    result["reference_is_exact"] = args.workers <= 2  # see common.reference
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
