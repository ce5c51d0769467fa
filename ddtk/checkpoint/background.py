"""Asynchronous checkpoints: snapshot in the training loop, write in a background thread.

A synchronous :func:`ddtk.checkpoint.store.save` stops training for as long as
the disk takes. :class:`AsyncCheckpointer` stops it only for the snapshot (a
copy of the tensors to CPU memory: pinned buffers filled with non-blocking
copies and one synchronisation on CUDA, a clone on CPU) and hands the copy to
one writer thread, which calls the same ``save`` (atomic files, manifest last),
so a crash during a background write leaves at most an uncommitted directory
that :func:`~ddtk.checkpoint.store.latest` ignores.

At most one write is in flight: a ``save`` while the previous one is still
writing waits for it; that wait is the stall the training loop sees, recorded in
:attr:`AsyncCheckpointer.stats` next to the snapshot and write times. A failed
background write is never lost: it is raised, chained in a
:class:`~ddtk.checkpoint.atomic.CheckpointError` naming the step, at the next
``save``, ``wait`` or ``close``.

>>> import tempfile, torch
>>> from ddtk.checkpoint import capture, latest
>>> from ddtk.checkpoint.background import AsyncCheckpointer
>>> run = tempfile.mkdtemp()
>>> model = torch.nn.Linear(2, 2)
>>> with AsyncCheckpointer(run, keep_last=1) as ckpt:
...     ckpt.save(capture(model, step=1), 1)
...     ckpt.save(capture(model, step=2), 2)
...     ckpt.wait().name
'step-000002'
>>> latest(run).name, ckpt.stats.saves
('step-000002', 2)
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint import store
from ddtk.checkpoint.atomic import CheckpointError
from ddtk.checkpoint.digest import limit_hash_threads
from ddtk.checkpoint.retention import check_policy
from ddtk.checkpoint.state import CheckpointState

__all__ = ["AsyncCheckpointer", "CheckpointerStats", "snapshot"]

Writer = Callable[..., Path]
"""``writer(directory, state, step, *, world_size=, keep_last=, keep_every=) -> Path``."""


@dataclass
class CheckpointerStats:
    """Seconds of the last save: snapshot and stall (in the caller), write (in the background)."""

    snapshot_s: float = 0.0
    stall_s: float = 0.0
    write_s: float = 0.0
    saves: int = 0
    total_stall_s: float = 0.0
    total_snapshot_s: float = 0.0


def snapshot(obj: Any, pinned: dict[str, torch.Tensor] | None = None, _key: str = "") -> Any:
    """A CPU copy of nested dicts/lists/tuples of tensors, safe to write while training goes on.

    CUDA tensors are copied into pinned CPU buffers (reused from ``pinned`` when
    shape and dtype match) with non-blocking copies, followed by one
    synchronisation in :func:`_snapshot_state`; CPU tensors are cloned.
    """
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu":
            return t.clone()
        buf = None if pinned is None else pinned.get(_key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            if pinned is not None:
                pinned[_key] = buf
        buf.copy_(t, non_blocking=True)
        return buf
    if isinstance(obj, dict):
        return {k: snapshot(v, pinned, f"{_key}/{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(snapshot(v, pinned, f"{_key}/{i}") for i, v in enumerate(obj))
    return obj


def _has_cuda(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.device.type == "cuda"
    if isinstance(obj, dict):
        return any(_has_cuda(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_has_cuda(v) for v in obj)
    return False


def _lower_priority(nice: int | None) -> None:
    """Raise the calling thread's nice value (Linux schedules threads separately; else a no-op)."""
    if nice is None or not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))


class AsyncCheckpointer:
    """Save checkpoints in one background thread; the caller waits only for the snapshot.

    ``directory``, ``keep_last``, ``keep_every`` and ``world_size`` are passed to
    ``writer`` (default :func:`ddtk.checkpoint.store.save`; the incremental
    :func:`ddtk.checkpoint.incremental.save_incremental` fits too). With
    ``clone_cpu=False`` CPU tensors are not copied again: right for states made
    by :func:`~ddtk.checkpoint.state.capture`, which already clones, and wrong for
    a state that shares tensors with a model still training. ``writer_nice``
    (default 10, None to leave it) lowers the writer thread's CPU priority, so
    that on a machine with few cores hashing and serialising yield to the
    training thread instead of slowing its steps; the write takes a little longer.

    >>> import tempfile, torch, ddtk
    >>> from ddtk.checkpoint import capture, load
    >>> def train(ctx, run):
    ...     model = torch.nn.Linear(2, 1)
    ...     with AsyncCheckpointer(f"{run}/rank{ctx.rank}") as ckpt:
    ...         for step in range(1, 4):
    ...             ckpt.save(capture(model, step=step), step)
    ...     return load(f"{run}/rank{ctx.rank}").step
    >>> ddtk.launch(train, 2, args=(tempfile.mkdtemp(),), timeout=120, echo=False)
    [3, 3]
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        world_size: int = 1,
        writer: Writer | None = None,
        clone_cpu: bool = True,
        writer_nice: int | None = 10,
    ):
        check_policy(keep_last, keep_every)
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        if writer_nice is not None and (
            not isinstance(writer_nice, int) or isinstance(writer_nice, bool)
            or not 0 <= writer_nice <= 19
        ):  # fmt: skip
            raise ValueError(f"writer_nice must be None or an integer 0..19, got {writer_nice!r}")
        if writer is not None and not callable(writer):
            raise TypeError(f"writer must be callable, got {type(writer).__name__}")
        self.directory = Path(directory)
        self.keep_last, self.keep_every, self.world_size = keep_last, keep_every, world_size
        self.writer = writer
        self.clone_cpu = bool(clone_cpu)
        self.writer_nice = writer_nice
        self.stats = CheckpointerStats()
        self._thread: threading.Thread | None = None
        self._error: tuple[int, BaseException] | None = None
        self._last: Path | None = None
        self._pinned: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ public API
    def save(self, state: CheckpointState, step: int) -> None:
        """Snapshot ``state`` and write it as the checkpoint of ``step`` in the background.

        Waits first for a write still in flight (the stall); raises the error of a
        failed earlier write, in which case ``state`` is not saved.
        """
        if self._closed:
            raise CheckpointError("save() on a closed AsyncCheckpointer")
        if not isinstance(state, CheckpointState):
            raise TypeError(
                f"state must be a CheckpointState (see capture()), got {type(state).__name__}"
            )
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        with self._lock:
            start = time.perf_counter()
            self._join()
            stall = time.perf_counter() - start
            self.stats.stall_s = stall
            self.stats.total_stall_s += stall
            self._raise_pending()
            start = time.perf_counter()
            copy = self._snapshot_state(state)
            self.stats.snapshot_s = time.perf_counter() - start
            self.stats.total_snapshot_s += self.stats.snapshot_s
            self.stats.saves += 1
            self._thread = threading.Thread(
                target=self._write, args=(copy, step), name=f"ddtk-checkpoint-{step}"
            )
            self._thread.start()

    def wait(self) -> Path | None:
        """Wait for the write in flight; return the last committed path (None before any)."""
        with self._lock:
            self._join()
            self._raise_pending()
            return self._last

    def close(self) -> None:
        """Finish the write in flight and refuse further saves; raises a pending error."""
        with self._lock:
            self._join()
            self._closed = True
            self._pinned.clear()
            self._raise_pending()

    @property
    def in_flight(self) -> bool:
        """True while a background write runs."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _snapshot_state(self, state: CheckpointState) -> CheckpointState:
        """Copy the tensors to CPU (pinned buffers + one sync on CUDA); meta is deep-copied as JSON."""
        import copy

        cuda = _has_cuda(state.tensors)
        if cuda or self.clone_cpu:
            tensors = snapshot(state.tensors, self._pinned)
        else:
            tensors = dict(state.tensors)
        if cuda:
            torch.cuda.synchronize()
        return CheckpointState(tensors, copy.deepcopy(state.meta))

    def _write(self, state: CheckpointState, step: int) -> None:
        """Body of the writer thread: write, remember the path or the error."""
        start = time.perf_counter()
        _lower_priority(self.writer_nice)
        writer = self.writer if self.writer is not None else store.save
        try:
            with limit_hash_threads(1):  # leave the other cores to training
                path = writer(
                    self.directory,
                    state,
                    step,
                    world_size=self.world_size,
                    keep_last=self.keep_last,
                    keep_every=self.keep_every,
                )
        except BaseException as exc:
            self._error = (step, exc)
        else:
            self._last = Path(path)
        finally:
            self.stats.write_s = time.perf_counter() - start

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _raise_pending(self) -> None:
        if self._error is None:
            return
        step, exc = self._error
        self._error = None
        raise CheckpointError(
            f"the background checkpoint of step {step} in {self.directory} failed: "
            f"{type(exc).__name__}: {exc}; it was not committed (older checkpoints are intact)"
        ) from exc
