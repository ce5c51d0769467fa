"""Fault injectors: make a rank die, raise, lag or hang, and damage files, on purpose.

A training loop calls one :class:`FaultPlan` once per step (``plan.maybe_fail(ctx,
step)``); the plan asks each of its injectors whether this rank fails at this
step. File faults (:func:`corrupt_file`, :func:`truncate_file`) damage a
checkpoint on disk, and :func:`crash_during` kills the process in the middle of
a chosen call (say the n-th ``os.replace`` of a checkpoint commit). Together
they let a test or a notebook check what a recovery scheme promises.

>>> import ddtk
>>> from ddtk.faults import FaultPlan, raise_at_step
>>> def train(ctx, plan):
...     for step in range(3):
...         plan.maybe_fail(ctx, step)
...     return "done"
>>> plan = FaultPlan(raise_at_step(rank=1, step=2, exc=ValueError("injected")))
>>> try:
...     ddtk.launch(train, world_size=2, args=(plan,), timeout=60, echo=False)
... except ddtk.RankError as err:
...     print(err.rank, "ValueError: injected" in err.traceback)
1 True
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

_FOREVER = 10**7  # seconds a hung rank sleeps: far beyond any timeout


class Injector(Protocol):
    """Anything a :class:`FaultPlan` can hold: called once per step on every rank."""

    def __call__(self, ctx: Any, step: int) -> None: ...


def _check_rank_step(rank: Any, step: Any) -> None:
    for name, value in (("rank", rank), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _check_seconds(seconds: Any, name: str = "seconds") -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"{name} must be a number >= 0, got {seconds!r}")


@dataclass(frozen=True)
class KillAtStep:
    """SIGKILL rank ``rank`` when it reaches step ``step``: no cleanup, no message, like a lost node.

    >>> import ddtk
    >>> def train(ctx, fault):
    ...     for step in range(3):
    ...         fault(ctx, step)
    >>> try:
    ...     ddtk.launch(train, 2, args=(KillAtStep(rank=0, step=1),), timeout=60, echo=False)
    ... except ddtk.RankError as err:
    ...     print(err.rank, "signal SIGKILL" in str(err))
    0 True
    """

    rank: int
    step: int

    def __post_init__(self) -> None:
        _check_rank_step(self.rank, self.step)

    def __call__(self, ctx: Any, step: int) -> None:
        if ctx.rank == self.rank and step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class RaiseAtStep:
    """Raise ``exc`` on rank ``rank`` at step ``step``: a bug or a failed read in one rank.

    >>> fault = RaiseAtStep(rank=0, step=1, exc=RuntimeError("disk full"))
    >>> class Ctx:
    ...     rank = 0
    >>> fault(Ctx(), 0)  # not this step: nothing happens
    >>> fault(Ctx(), 1)
    Traceback (most recent call last):
    ...
    RuntimeError: disk full
    """

    rank: int
    step: int
    exc: BaseException | type[BaseException]

    def __post_init__(self) -> None:
        _check_rank_step(self.rank, self.step)
        ok = isinstance(self.exc, BaseException) or (
            isinstance(self.exc, type) and issubclass(self.exc, BaseException)
        )
        if not ok:
            raise TypeError(f"exc must be an exception or exception class, got {self.exc!r}")

    def __call__(self, ctx: Any, step: int) -> None:
        if ctx.rank == self.rank and step == self.step:
            raise self.exc


@dataclass(frozen=True)
class Straggler:
    """Make rank ``rank`` sleep ``seconds`` every ``every`` steps: a slow node that everyone waits for.

    >>> import time
    >>> class Ctx:
    ...     rank = 1
    >>> slow = Straggler(rank=1, seconds=0.05, every=2)
    >>> start = time.perf_counter(); slow(Ctx(), 2); time.perf_counter() - start >= 0.05
    True
    >>> start = time.perf_counter(); slow(Ctx(), 3); time.perf_counter() - start < 0.05
    True
    """

    rank: int
    seconds: float
    every: int = 1

    def __post_init__(self) -> None:
        _check_rank_step(self.rank, 0)
        _check_seconds(self.seconds)
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an integer >= 1, got {self.every!r}")

    def __call__(self, ctx: Any, step: int) -> None:
        if ctx.rank == self.rank and step % self.every == 0:
            time.sleep(self.seconds)


@dataclass(frozen=True)
class Hang:
    """Make rank ``rank`` stop at step ``step`` for good (a deadlock, a stuck disk, a lost GPU).

    The rank sleeps until it is killed, so its peers block in their next
    collective: with ``op_timeout`` set they raise ``CollectiveTimeoutError``
    naming this rank; without, they wait for :func:`ddtk.launch`'s timeout.

    >>> Hang(rank=2, step=5)
    Hang(rank=2, step=5, seconds=10000000)
    """

    rank: int
    step: int
    seconds: float = _FOREVER

    def __post_init__(self) -> None:
        _check_rank_step(self.rank, self.step)
        _check_seconds(self.seconds)

    def __call__(self, ctx: Any, step: int) -> None:
        if ctx.rank == self.rank and step == self.step:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def kill_at_step(rank: int, step: int) -> KillAtStep:
    """SIGKILL ``rank`` at ``step`` (see :class:`KillAtStep`).

    >>> kill_at_step(1, 3)
    KillAtStep(rank=1, step=3)
    """
    return KillAtStep(rank, step)


def raise_at_step(
    rank: int, step: int, exc: BaseException | type[BaseException] = RuntimeError
) -> RaiseAtStep:
    """Raise ``exc`` on ``rank`` at ``step`` (see :class:`RaiseAtStep`).

    >>> raise_at_step(0, 2, ValueError("bad batch")).exc
    ValueError('bad batch')
    """
    return RaiseAtStep(rank, step, exc)


def straggler(rank: int, seconds: float, every: int = 1) -> Straggler:
    """Delay ``rank`` by ``seconds`` every ``every`` steps (see :class:`Straggler`).

    >>> straggler(1, 0.5, every=10)
    Straggler(rank=1, seconds=0.5, every=10)
    """
    return Straggler(rank, seconds, every)


def hang(rank: int, step: int) -> Hang:
    """Hang ``rank`` at ``step`` until it is killed (see :class:`Hang`).

    >>> hang(0, 1).step
    1
    """
    return Hang(rank, step)


class FaultPlan:
    """Several injectors behind one per-step call: ``plan.maybe_fail(ctx, step)``.

    The plan is picklable (it travels to the ranks with :func:`ddtk.launch`) and
    stateless, so every rank evaluates the same plan and only the targeted rank fails.

    >>> plan = FaultPlan(straggler(1, 0.0), kill_at_step(2, 10))
    >>> len(plan), plan.targets(10)
    (2, [1, 2])
    >>> class Ctx:
    ...     rank = 0
    >>> plan.maybe_fail(Ctx(), 10)  # rank 0 is not targeted: nothing happens
    """

    def __init__(self, *injectors: Injector) -> None:
        for inj in injectors:
            if not callable(inj):
                raise TypeError(f"a FaultPlan holds callables (ctx, step), got {inj!r}")
        self.injectors: list[Injector] = list(injectors)

    def add(self, injector: Injector) -> FaultPlan:
        """Append an injector; returns the plan so calls chain."""
        if not callable(injector):
            raise TypeError(f"a FaultPlan holds callables (ctx, step), got {injector!r}")
        self.injectors.append(injector)
        return self

    def maybe_fail(self, ctx: Any, step: int) -> None:
        """Run every injector for this rank and step, in the order they were given."""
        for inj in self.injectors:
            inj(ctx, step)

    __call__ = maybe_fail

    def targets(self, step: int) -> list[int]:
        """The ranks that some injector targets at ``step`` (stragglers count on their steps)."""
        ranks = set()
        for inj in self.injectors:
            rank, at = getattr(inj, "rank", None), getattr(inj, "step", None)
            every = getattr(inj, "every", None)
            if rank is not None and (at == step or (every is not None and step % every == 0)):
                ranks.add(rank)
        return sorted(ranks)

    def __len__(self) -> int:
        return len(self.injectors)

    def __repr__(self) -> str:
        return f"FaultPlan({', '.join(map(repr, self.injectors))})"


# -- file faults -------------------------------------------------------------------------
def _existing_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such file to damage: {p}")
    return p


def corrupt_file(
    path: str | os.PathLike, offset: int | None = None, nbytes: int = 1, seed: int = 0
) -> int:
    """Flip every bit of ``nbytes`` bytes at ``offset`` (random, from ``seed``, if None); return it.

    Bit rot or a torn write: the file keeps its size, so only a checksum notices.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "shard.bin"
    >>> _ = p.write_bytes(bytes(8))
    >>> corrupt_file(p, offset=2, nbytes=2)
    2
    >>> p.read_bytes().hex()
    '0000ffff00000000'
    """
    p = _existing_file(path)
    size = p.stat().st_size
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes must be an integer >= 1, got {nbytes!r}")
    if nbytes > size:
        raise ValueError(f"cannot corrupt {nbytes} bytes of {p}, which has {size}")
    if offset is None:
        offset = random.Random(seed).randrange(size - nbytes + 1)
    elif isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0 or None, got {offset!r}")
    if offset + nbytes > size:
        raise ValueError(f"offset {offset} + nbytes {nbytes} is past the end of {p} ({size} bytes)")
    with open(p, "r+b") as f:
        f.seek(offset)
        data = f.read(nbytes)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))
    return offset


def truncate_file(
    path: str | os.PathLike, fraction: float | None = None, size: int | None = None
) -> int:
    """Cut a file to ``fraction`` of its length or to ``size`` bytes; return the new size.

    A write interrupted by a crash or a full disk. Give exactly one of the two.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "shard.bin"
    >>> _ = p.write_bytes(bytes(100))
    >>> truncate_file(p, fraction=0.25), p.stat().st_size
    (25, 25)
    """
    p = _existing_file(path)
    old = p.stat().st_size
    if (fraction is None) == (size is None):
        raise ValueError("give exactly one of fraction and size")
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValueError(f"fraction must be a number in [0, 1), got {fraction!r}")
        if not 0 <= fraction < 1:
            raise ValueError(f"fraction must be in [0, 1), got {fraction!r}")
        size = int(old * fraction)
    elif isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= old:
        raise ValueError(f"size must be an integer in [0, {old}] (the file's size), got {size!r}")
    os.truncate(p, size)
    return size  # type: ignore[return-value]


# -- crash in the middle of a call -------------------------------------------------------
def _resolve(target: str | Callable) -> tuple[Any, str]:
    """The (owner, attribute) to patch for ``"pkg.module.attr"`` or a module-level function."""
    if callable(target) and not isinstance(target, str):
        module = getattr(target, "__module__", None)
        name = getattr(target, "__qualname__", getattr(target, "__name__", ""))
        if module is None or not name or "<" in name:
            raise ValueError(f"cannot locate {target!r}; pass its dotted path, e.g. 'os.replace'")
        if module in ("posix", "nt"):  # os functions are defined there, called through os
            module = "os"
        target = f"{module}.{name}"
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"target must be a dotted path like 'os.replace', got {target!r}")
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:-1]:
                owner = getattr(owner, attr)
            getattr(owner, parts[-1])
        except AttributeError:
            break
        return owner, parts[-1]
    raise ValueError(f"cannot find {target!r} to patch")


@contextlib.contextmanager
def crash_during(
    target: str | Callable,
    after_calls: int = 1,
    exc: BaseException | None = None,
    when: str = "before",
) -> Iterator[dict[str, int]]:
    """Kill this process (SIGKILL) at the ``after_calls``-th call of ``target``, inside the block.

    ``target`` is a dotted path (``"os.replace"``) or a module-level function; it is
    patched where it lives, so code must look it up there (``os.replace(...)``, not a
    ``from os import replace`` made before the patch). ``when="before"`` dies before
    the call takes effect, ``"after"`` right after it. With ``exc`` the call raises
    ``exc`` instead of killing the process, which a test can catch. The yielded dict
    counts the calls seen so far.

    >>> import os, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for name in "ab":
    ...     _ = (d / f"{name}.tmp").write_text(name)
    >>> with crash_during("os.replace", after_calls=2, exc=OSError("crash")) as calls:
    ...     os.replace(d / "a.tmp", d / "a")
    ...     os.replace(d / "b.tmp", d / "b")
    Traceback (most recent call last):
    ...
    OSError: crash
    >>> calls["calls"], sorted(p.name for p in d.iterdir())
    (2, ['a', 'b.tmp'])
    """
    if isinstance(after_calls, bool) or not isinstance(after_calls, int) or after_calls < 1:
        raise ValueError(f"after_calls must be an integer >= 1, got {after_calls!r}")
    if when not in ("before", "after"):
        raise ValueError(f"when must be 'before' or 'after', got {when!r}")
    if exc is not None and not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception instance or None, got {exc!r}")
    owner, attr = _resolve(target)
    original = getattr(owner, attr)
    counter = {"calls": 0}
    lock = threading.Lock()

    def fail() -> None:
        if exc is not None:
            raise exc
        os.kill(os.getpid(), signal.SIGKILL)

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        with lock:
            counter["calls"] += 1
            hit = counter["calls"] == after_calls
        if hit and when == "before":
            fail()
        result = original(*args, **kwargs)
        if hit and when == "after":
            fail()
        return result

    setattr(owner, attr, patched)
    try:
        yield counter
    finally:
        setattr(owner, attr, original)
