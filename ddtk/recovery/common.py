"""What every automatic-recovery driver shares: model, data, fingerprint, clock, reference.

The recovery drivers (torchrun elastic, Horovod Elastic, Ray Train) train the
same tiny problem so their results can be compared with each other and with one
uninterrupted single-process :func:`reference`:

* :func:`build`: a deterministic MLP (16 -> 32 -> 4) and SGD with momentum;
* :func:`global_batch`: the batch of a step, a pure function of ``(seed, step)``,
  so a restarted worker (or a different number of workers) sees the same data;
* :func:`local_batch`: a rank's contiguous slice of it;
* :func:`fingerprint`: sha256 of the parameters, for bitwise comparisons;
* :class:`RecoveryClock`: crash time and first step after the restart, in files;
* :func:`kill_self_once`: SIGKILL the calling process, once per marker file.

>>> import torch
>>> model, opt = build(seed=0)
>>> fingerprint(model) == fingerprint(build(seed=0)[0])
True
>>> x, y = global_batch(3)
>>> x.shape, y.shape
(torch.Size([32, 16]), torch.Size([32]))
>>> torch.equal(local_batch(3, rank=1, world_size=2)[0], x[16:])
True
>>> fingerprint(reference(2, world_size=2)) == fingerprint(reference(2, world_size=2))
True
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ddtk.checkpoint.atomic import atomic_write_bytes

__all__ = [
    "HIDDEN",
    "IN_FEATURES",
    "LR",
    "MOMENTUM",
    "NUM_CLASSES",
    "RecoveryClock",
    "build",
    "check_training_args",
    "fingerprint",
    "global_batch",
    "kill_self_once",
    "local_batch",
    "loss_fn",
    "reference",
    "training_parser",
]

IN_FEATURES, HIDDEN, NUM_CLASSES = 16, 32, 4
LR, MOMENTUM = 0.05, 0.9


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def build(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small MLP (16 -> 32 -> 4) initialised from ``seed`` and SGD (lr 0.05, momentum 0.9).

    The initialisation draws from a forked global RNG, so calling it leaves the
    caller's random state untouched and gives the same weights in every process.
    """
    _check_int("seed", seed, 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, NUM_CLASSES)
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    return model, optimizer


def loss_fn(output: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy over the batch (the loss every driver and the reference use)."""
    return nn.functional.cross_entropy(output, target)


def global_batch(step: int, batch_size: int = 32, seed: int = 0) -> tuple[Tensor, Tensor]:
    """The global batch of ``step``: inputs ``(batch_size, 16)`` and labels in ``0..3``.

    Generated from its own ``torch.Generator`` seeded with ``(seed, step)``, so it
    does not depend on who computes it, on the global RNG, or on earlier steps.
    The labels come from a fixed linear teacher, so the loss can go down.
    """
    _check_int("step", step, 0)
    _check_int("batch_size", batch_size, 1)
    _check_int("seed", seed, 0)
    teacher = torch.Generator().manual_seed(seed * 7919 + 17)
    weights = torch.randn(IN_FEATURES, NUM_CLASSES, generator=teacher)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch_size, IN_FEATURES, generator=gen)
    y = (x @ weights).argmax(dim=1)
    return x, y


def local_batch(
    step: int, rank: int, world_size: int, batch_size: int = 32, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Rank ``rank``'s contiguous slice (``batch_size // world_size`` rows) of the global batch."""
    _check_int("world_size", world_size, 1)
    _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    _check_int("batch_size", batch_size, 1)
    if batch_size % world_size:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by world_size {world_size}; "
            f"every rank needs an equal share of the global batch"
        )
    x, y = global_batch(step, batch_size, seed)
    share = batch_size // world_size
    return x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]


def fingerprint(model: nn.Module) -> str:
    """sha256 (hex) of the bytes of every parameter, in ``named_parameters`` order."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class RecoveryClock:
    """Wall-clock time from a crash to the first training step completed after the restart.

    Two small JSON files in ``directory`` (written atomically, so they survive
    the kill that follows): ``crash.json`` is written by :meth:`mark_crash` just
    before a process kills itself; ``resume.json`` by the first
    :meth:`mark_resume` after that crash. Processes share the clock through the
    files, so the crash and the resume may be measured by different processes
    on one machine (timestamps are ``time.time()``).

    >>> import tempfile
    >>> clock = RecoveryClock(tempfile.mkdtemp())
    >>> clock.mark_resume(3), clock.recovery_seconds()
    (False, None)
    >>> clock.mark_crash()
    >>> clock.mark_resume(5), clock.mark_resume(6)
    (True, False)
    >>> clock.resumed_step(), clock.recovery_seconds() >= 0
    (5, True)
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)
        self.crash_file = self.directory / "crash.json"
        self.resume_file = self.directory / "resume.json"

    def mark_crash(self) -> None:
        """Record now as the crash time (overwrites an earlier crash and forgets its resume)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.resume_file.unlink(missing_ok=True)
        atomic_write_bytes(self.crash_file, json.dumps({"time": time.time()}).encode())

    def mark_resume(self, step: int) -> bool:
        """Record ``step`` and now as the first step after the crash; True if this call did it.

        Does nothing (returns False) when no crash was recorded or a resume already was.
        """
        if not self.crash_file.exists() or self.resume_file.exists():
            return False
        payload = {"step": int(step), "time": time.time()}
        atomic_write_bytes(self.resume_file, json.dumps(payload).encode())
        return True

    def _read(self, path: Path) -> dict | None:
        return json.loads(path.read_bytes()) if path.exists() else None

    def crash_time(self) -> float | None:
        """The ``time.time()`` of the recorded crash, or None."""
        crash = self._read(self.crash_file)
        return None if crash is None else float(crash["time"])

    def resumed_step(self) -> int | None:
        """The step recorded by the first :meth:`mark_resume` after the crash, or None."""
        resume = self._read(self.resume_file)
        return None if resume is None else int(resume["step"])

    def recovery_seconds(self) -> float | None:
        """Seconds from the crash to the first step after the restart, or None if either is missing."""
        crash, resume = self._read(self.crash_file), self._read(self.resume_file)
        if crash is None or resume is None:
            return None
        return float(resume["time"]) - float(crash["time"])


def kill_self_once(marker: str | os.PathLike[str], clock: RecoveryClock | None = None) -> bool:
    """SIGKILL this process the first time it is called for ``marker``; afterwards return False.

    The marker file is created (atomically, fsynced) before the kill, so the
    restarted process finds it and goes on; ``clock.mark_crash()`` is called
    just before the signal. SIGKILL cannot be caught: no ``finally`` block, no
    atexit handler and no buffered write of this process runs, as in a real crash.
    """
    marker = Path(marker)
    if marker.exists():
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(marker, json.dumps({"pid": os.getpid(), "time": time.time()}).encode())
    if clock is not None:
        clock.mark_crash()
    os.kill(os.getpid(), signal.SIGKILL)
    return True  # not reached: SIGKILL ends the process


def reference(
    steps: int,
    world_size: int,
    batch_size: int = 32,
    seed: int = 0,
    *,
    world_sizes: Sequence[int] | None = None,
) -> nn.Module:
    """The model after ``steps`` uninterrupted data-parallel steps, computed in one process.

    Each step computes every rank's gradient on its :func:`local_batch` (mean
    loss over the local rows), scales each by ``1 / world_size`` and adds them
    in rank order, then takes the SGD step, which is what DDP (scale, then sum
    all-reduce) and Horovod (sum all-reduce, then scale) do. It runs with one
    intra-op thread, like the workers.

    When it is bitwise equal to a distributed run: for ``world_size`` 1 and 2.
    Scaling by 1/2 is exact in floating point, and a sum of two terms is the
    same in any order, so ``g0/2 + g1/2 == (g0 + g1)/2`` bit for bit; the
    local forward/backward is the same computation on the same rows. For
    ``world_size >= 3`` the all-reduce adds in an order of its own (ring,
    chunked), and 1/3 is not exact: the result is only close (a few ulps per step,
    growing slowly with the number of steps). A run whose world size changes
    midway (elastic) is close, not equal, to the reference of either size;
    ``world_sizes`` (one size per step, overriding ``world_size``) reproduces
    such a run, bitwise where every size is 1 or 2.
    """
    _check_int("steps", steps, 0)
    sizes = [world_size] * steps if world_sizes is None else list(world_sizes)
    if len(sizes) != steps:
        raise ValueError(f"world_sizes has {len(sizes)} entries for {steps} steps")
    for size in set(sizes) | {world_size}:
        _check_int("world_size", size, 1)
        if batch_size % size:
            raise ValueError(
                f"batch_size {batch_size} is not divisible by world_size {size}; "
                f"every rank needs an equal share of the global batch"
            )
    model, optimizer = build(seed)
    params = list(model.parameters())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step, world_size in enumerate(sizes):
            total: list[Tensor] | None = None
            for rank in range(world_size):
                x, y = local_batch(step, rank, world_size, batch_size, seed)
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                grads = [p.grad.detach().clone() * (1.0 / world_size) for p in params]
                total = grads if total is None else [t + g for t, g in zip(total, grads)]
            for p, g in zip(params, total or []):
                p.grad = g
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model


def training_parser(prog: str, description: str, dir_help: str) -> argparse.ArgumentParser:
    """The options every recovery driver shares: where, how long, how often, whom to kill."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--dir", required=True, type=Path, help=dir_help)
    p.add_argument("--steps", type=int, default=40, help="total training steps")
    p.add_argument("--every", type=int, default=10, help="commit every K steps")
    p.add_argument("--batch-size", type=int, default=32, help="global batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-rank", type=int, default=None, help="rank that SIGKILLs itself once")
    p.add_argument("--kill-step", type=int, default=None, help="step before which it dies")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def check_training_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject bad combinations of the shared options with a message naming them."""
    if args.steps < 1 or args.every < 1:
        p.error(f"--steps and --every must be >= 1, got {args.steps} and {args.every}")
    if (args.kill_rank is None) != (args.kill_step is None):
        p.error("--kill-rank and --kill-step go together")
    if args.kill_step is not None and not 0 <= args.kill_step < args.steps:
        p.error(f"--kill-step must be in 0..{args.steps - 1}, got {args.kill_step}")
