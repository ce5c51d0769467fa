"""The SIGKILL drill: kill one worker after a commit; the run must resume and lose no committed step.

The run starts on ``spec.ranks`` ranks under ``torchrun --max-restarts 1``. As soon as
a commit marker (``outputs.checkpoints/outputs.commit_marker``, e.g.
``step-000010/manifest.json``) of a step after 0 appears (a step-0 commit holds no
training, so resuming from it proves nothing), the checker notes the newest committed step
and SIGKILLs the worker of rank ``kill_rank`` (never the launcher). torchrun then
stops the other workers and restarts them all; they must resume. Pass when the run
exits 0, every rank reports the full step count, ``start_step`` (where the final
attempt resumed) is at least the last step committed before the kill, and the
ranks' parameter checksums agree.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ddtk.project.criteria import checksums_agree
from ddtk.project.manifest import ProjectSpec
from ddtk.project.procs import worker_pid
from ddtk.project.rubric import Criterion, CriterionResult
from ddtk.project.run import run


def committed_steps(spec: ProjectSpec, out: Path) -> list[int]:
    """Steps of the committed checkpoints: the last number in each marker's checkpoint folder name."""
    root = spec.checkpoint_dir(out)
    steps = []
    for marker in root.glob(spec.commit_marker):
        part = marker.relative_to(root).parts[0]
        numbers = re.findall(r"\d+", part)
        if numbers:
            steps.append(int(numbers[-1]))
    return sorted(steps)


@dataclass
class _Killer:
    """Called at every poll: waits for a commit, then kills rank ``rank``'s worker once."""

    spec: ProjectSpec
    out: Path
    rank: int
    killed_pid: int | None = None
    committed_before: int | None = None
    kill_time: float | None = None

    def __call__(self, proc: subprocess.Popen) -> None:
        if self.killed_pid is not None:
            return
        steps = [s for s in committed_steps(self.spec, self.out) if s > 0]
        if not steps:  # a commit at step 0 holds no training, so resuming from it proves nothing
            return
        pid = worker_pid(proc.pid, self.rank)
        if pid is None:
            return
        self.committed_before = steps[-1]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.killed_pid, self.kill_time = pid, time.monotonic()


def survives_sigkill(
    criterion: Criterion, spec: ProjectSpec, work: Path, timeout_s: float
) -> CriterionResult:
    """Run the drill and judge the resumed run."""
    rank = min(int(criterion.params.get("kill_rank", 1)), spec.ranks - 1)
    out = work / "sigkill"
    killer = _Killer(spec, out, rank)
    result = run(spec, spec.ranks, out, timeout_s, max_restarts=1, on_poll=killer)
    measured = {"ranks": spec.ranks, "kill_rank": rank, "seconds": round(result.seconds, 2)}
    if killer.killed_pid is None:
        where = f"{spec.checkpoints}/{spec.commit_marker}"
        if result.timed_out:
            return CriterionResult(
                criterion,
                "error",
                f"no checkpoint was committed ({where}) within {timeout_s:.0f} s; the run was killed",
                measured,
            )
        if committed_steps(spec, out):
            return CriterionResult(
                criterion,
                "error",
                "the run finished before the checker could kill a rank: make the check run longer (more steps after the first checkpoint)",
                measured,
            )
        return CriterionResult(
            criterion,
            "fail",
            f"no checkpoint was committed (nothing matches {where}) before the run ended, so there is nothing to resume from",
            measured,
        )
    measured["committed_before_kill"] = killer.committed_before
    if not result.ok:
        return CriterionResult(
            criterion,
            "fail",
            f"after rank {rank} was killed at committed step {killer.committed_before}: {result.failure()}",
            measured,
        )
    resumed = min(m["start_step"] for m in result.metrics.values())
    measured["resumed_at"] = resumed
    measured["final_step"] = result.metrics[0]["final_step"]
    if resumed < killer.committed_before:
        lost = killer.committed_before - resumed
        return CriterionResult(
            criterion,
            "fail",
            f"step {killer.committed_before} was committed before the kill but the run resumed at step {resumed}: {lost} committed steps lost",
            measured,
        )
    disagree = checksums_agree(result)
    if disagree:
        return CriterionResult(criterion, "fail", f"after the resume {disagree}", measured)
    message = f"rank {rank} SIGKILLed after step {killer.committed_before} was committed; resumed at step {resumed}, finished {spec.steps} steps, ranks identical"
    return CriterionResult(criterion, "pass", message, measured)
