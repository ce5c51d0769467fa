"""A kill drill: SIGKILL a resumable training process at random moments, then compare.

Training that checkpoints correctly survives being killed at any moment: started
again, it resumes from its last committed checkpoint, and it ends with parameters
bitwise equal to a run that was never interrupted. The drill tests exactly that,
with real processes and real ``SIGKILL`` (no handler runs, nothing is flushed):

1. it runs ``train(run_dir, steps)`` once, uninterrupted, in a fresh process and
   a fresh directory: the reference, and the run time ``T`` that sets the kill times;
2. it runs it again in ``run_dir``, kills the process (its whole process group)
   ``kills`` times, each after a random delay (uniform in ``window`` x ``T``,
   drawn from ``seed``) counted from the moment ``train`` was called, restarting
   it after each kill;
3. it lets the last start finish and compares the two final states tensor by tensor.

``train`` is any picklable function (a function defined in a notebook travels by
cloudpickle, with the helpers it calls): it must resume from ``run_dir`` when
there is a checkpoint there, train until ``steps`` steps are done, and return
the final ``state_dict`` (a mapping of names to tensors). Both runs happen in
child processes started the same way, so thread counts and imports match.

>>> from ddtk.faults.drill import kill_delays
>>> [round(d, 2) for d in kill_delays(3, 10.0, seed=0, window=(0.2, 0.4))]
[3.69, 3.52, 2.84]
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import torch

from ddtk.launch import child_python_env

__all__ = ["Attempt", "DrillError", "DrillReport", "kill_delays", "run_drill"]

TrainFn = Callable[[str, int], Mapping[str, torch.Tensor]]
# Starting Python, importing torch and unpickling ``train`` take seconds on a loaded machine;
# that start-up gets at least this long, whatever ``timeout`` (which bounds ``train`` itself) is.
START_TIMEOUT_S = 120.0

_CHILD = """
import os, sys, cloudpickle, torch
job, ready, result = sys.argv[1:4]
with open(job, "rb") as f:
    train, run_dir, steps = cloudpickle.load(f)
open(ready, "w").close()
state = train(run_dir, steps)
tmp = result + ".tmp"
torch.save({k: v.detach().cpu().clone() for k, v in dict(state).items()}, tmp)
os.replace(tmp, result)
"""


class DrillError(RuntimeError):
    """A drill run failed on its own (an exception, a timeout), not because it was killed."""


@dataclass(frozen=True)
class Attempt:
    """One start of the training process: when it was killed (None: it finished) and its run time."""

    killed_after: float | None
    seconds: float


@dataclass
class DrillReport:
    """What the drill did and found: the two final states and every start of the drilled run."""

    reference: dict[str, torch.Tensor]
    result: dict[str, torch.Tensor]
    reference_seconds: float
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def kills(self) -> int:
        """How many starts were really killed (a start that finished first is not counted)."""
        return sum(a.killed_after is not None for a in self.attempts)

    @property
    def mismatched(self) -> list[str]:
        """Names whose tensors differ (missing on either side, other shape, or any bit)."""
        names = sorted(set(self.reference) | set(self.result))
        return [n for n in names if not _same(self.reference.get(n), self.result.get(n))]

    @property
    def bitwise_equal(self) -> bool:
        """True when every tensor of the drilled run equals the reference bit for bit."""
        return not self.mismatched


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)))


def kill_delays(
    kills: int,
    reference_seconds: float,
    *,
    seed: int = 0,
    window: tuple[float, float] = (0.2, 0.45),
) -> list[float]:
    """``kills`` delays in seconds, uniform in ``window`` times the reference run time."""
    lo, hi = window
    if not 0 < lo <= hi < 1:
        raise ValueError(f"window must satisfy 0 < low <= high < 1, got {window!r}")
    rng = random.Random(seed)
    return [rng.uniform(lo, hi) * reference_seconds for _ in range(kills)]


def _check(train: Any, steps: Any, kills: Any, timeout: Any) -> None:
    if not callable(train):
        raise TypeError(f"train must be a function train(run_dir, steps), got {train!r}")
    for name, value, low in (("steps", steps, 1), ("kills", kills, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


class _Child:
    """One training process in its own process group, with its log and result files."""

    def __init__(self, job: Path, tag: str) -> None:
        self.ready, self.result, self.log = (
            job.parent / f"{tag}.{x}" for x in ("ready", "pt", "log")
        )
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(job), str(self.ready), str(self.result)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=child_python_env(),
            )

    def wait_ready(self, deadline: float) -> float:
        """Block until ``train`` was called; return that moment (monotonic)."""
        limit = deadline - time.monotonic()
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise DrillError(f"the training process exited before training:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise DrillError(f"the training process did not start within {limit:.0f} s")
            time.sleep(0.01)
        return time.monotonic()

    def kill(self) -> None:
        """SIGKILL the whole process group and reap the process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def finish(self, deadline: float) -> dict[str, torch.Tensor]:
        """Wait for a normal end; raise DrillError with the log's tail on failure or timeout."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise DrillError(
                f"training did not finish within the timeout:\n{self.tail()}"
            ) from None
        if self.proc.returncode != 0 or not self.result.exists():
            raise DrillError(f"training failed (exit code {self.proc.returncode}):\n{self.tail()}")
        return torch.load(self.result, weights_only=True)


def _run_once(
    job: Path, tag: str, kill_after: float | None, timeout: float
) -> tuple[Attempt, dict[str, torch.Tensor] | None]:
    """Start ``train``; kill it ``kill_after`` s after it starts (None: let it finish)."""
    child = _Child(job, tag)
    try:
        start = child.wait_ready(time.monotonic() + max(timeout, START_TIMEOUT_S))
        deadline = start + timeout
        if kill_after is not None:
            try:
                child.proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                child.kill()
                return Attempt(kill_after, time.monotonic() - start), None
            if child.proc.returncode != 0:
                raise DrillError(f"training failed before the kill:\n{child.tail()}")
        state = child.finish(deadline)
        return Attempt(None, time.monotonic() - start), state
    finally:
        if child.proc.poll() is None:
            child.kill()


def run_drill(
    train: TrainFn,
    run_dir: str | os.PathLike[str],
    steps: int,
    *,
    kills: int = 3,
    seed: int = 0,
    window: tuple[float, float] = (0.2, 0.45),
    timeout: float = 120.0,
    on_attempt: Callable[[Attempt], None] | None = None,
) -> DrillReport:
    """Run ``train`` uninterrupted, then again with ``kills`` SIGKILLs; compare the final states.

    ``run_dir`` is where the drilled run checkpoints (created; it must be empty);
    the reference runs in a fresh temporary directory, removed afterwards.
    ``timeout`` bounds each start's training, counted from the moment ``train`` is
    called (the process's start-up before it gets ``START_TIMEOUT_S`` or ``timeout``,
    whichever is longer). ``on_attempt`` is called after each start of
    the drilled run (progress in a notebook). Raises DrillError when a run fails
    or times out on its own, with the tail of its output.
    """
    _check(train, steps, kills, timeout)
    run_dir = Path(run_dir).resolve()
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"run_dir {run_dir} is not empty; the drill needs a fresh directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddtk-drill-") as scratch:
        ref_dir = Path(scratch) / "reference-run"
        ref_dir.mkdir()
        job = Path(scratch) / "job.pkl"
        job.write_bytes(cloudpickle.dumps((train, str(ref_dir), steps)))
        first, reference = _run_once(job, "reference", None, timeout)
        assert reference is not None
        job.write_bytes(cloudpickle.dumps((train, str(run_dir), steps)))
        report = DrillReport(reference, {}, first.seconds)
        for n, delay in enumerate(kill_delays(kills, first.seconds, seed=seed, window=window)):
            attempt, state = _run_once(job, f"attempt{n}", delay, timeout)
            report.attempts.append(attempt)
            if on_attempt is not None:
                on_attempt(attempt)
            if state is not None:  # it finished before the kill came
                report.result = state
                return report
        attempt, state = _run_once(job, "final", None, timeout)
        report.attempts.append(attempt)
        report.result = state or {}
        if on_attempt is not None:
            on_attempt(attempt)
    return report
