"""The SIGKILL drill: kill one worker after a commit; the run must really resume from it.

The run starts on ``spec.ranks`` ranks under ``torchrun --max-restarts 1``, in a folder
named like any other run's, with the same command and environment: to the program
the drill is a normal run. As soon as a commit marker
(``outputs.checkpoints/outputs.commit_marker``, e.g. ``step-000010/manifest.json``) of a
step after 0 appears (a step-0 commit holds no training, so resuming from it proves
nothing), the checker notes the newest committed step, measures the bytes of that
checkpoint (it must hold at least one rank's parameters) and SIGKILLs the worker of
rank ``kill_rank`` (never the launcher). torchrun then stops the other workers and
restarts them all. Pass when the run exits 0, every rank reports the full step count
and a ``start_step`` at or after the commit, the ranks' checksums agree, and what the
checker observed confirms it: each rank's final process ran no more optimizer steps
than were left after the commit, and ends with exactly the parameters of the
uninterrupted check run (the probe's digest of what each rank's optimizer holds).
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
from ddtk.project.evidence import folder_bytes, observed, resume_problems
from ddtk.project.manifest import ProjectSpec
from ddtk.project.procs import worker_pid
from ddtk.project.rubric import Criterion, CriterionResult
from ddtk.project.run import RunResult, new_run_folder, run


def committed(spec: ProjectSpec, out: Path) -> dict[int, Path]:
    """The committed checkpoints by step: the last number in each marker's top folder name."""
    root = spec.checkpoint_dir(out)
    found = {}
    for marker in root.glob(spec.commit_marker):
        part = marker.relative_to(root).parts[0]
        numbers = re.findall(r"\d+", part)
        if numbers:
            found[int(numbers[-1])] = root / part
    return dict(sorted(found.items()))


def committed_steps(spec: ProjectSpec, out: Path) -> list[int]:
    """Steps of the committed checkpoints, in order."""
    return list(committed(spec, out))


@dataclass
class _Killer:
    """Called at every poll: waits for a commit, then kills rank ``rank``'s worker once."""

    spec: ProjectSpec
    out: Path
    rank: int
    killed_pid: int | None = None
    committed_before: int | None = None
    checkpoint_bytes: int = 0
    kill_time: float | None = None

    def __call__(self, proc: subprocess.Popen) -> None:
        if self.killed_pid is not None:
            return
        found = {s: p for s, p in committed(self.spec, self.out).items() if s > 0}
        if not found:  # a commit at step 0 holds no training, so resuming from it proves nothing
            return
        pid = worker_pid(proc.pid, self.rank)
        if pid is None:
            return
        self.committed_before = max(found)
        self.checkpoint_bytes = folder_bytes(found[self.committed_before])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.killed_pid, self.kill_time = pid, time.monotonic()


def survives_sigkill(
    criterion: Criterion, spec: ProjectSpec, work: Path, timeout_s: float,
    uninterrupted: RunResult | None = None, hide: tuple[Path, ...] = (),
) -> CriterionResult:  # fmt: skip
    """Run the drill and judge the resumed run against ``uninterrupted`` (the check run)."""
    rank = min(int(criterion.params.get("kill_rank", 1)), spec.ranks - 1)
    folder = new_run_folder(work)
    killer = _Killer(spec, folder / "out", rank)
    result = run(spec, spec.ranks, folder, timeout_s, on_poll=killer, hide=hide)
    measured = {"ranks": spec.ranks, "kill_rank": rank, "seconds": round(result.seconds, 2),
                **observed(result.probe, spec.global_batch)}  # fmt: skip
    if killer.killed_pid is None:
        where = f"{spec.checkpoints}/{spec.commit_marker}"
        if result.timed_out:
            return CriterionResult(
                criterion,
                "error",
                f"no checkpoint was committed ({where}) within {timeout_s:.0f} s; the run was killed",
                measured,
            )
        if committed_steps(spec, folder / "out"):
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
    measured["checkpoint_bytes"] = killer.checkpoint_bytes
    held = max((a.held_param_bytes for a in result.probe.final().values()), default=0)
    if killer.checkpoint_bytes < held:
        return CriterionResult(
            criterion, "fail",
            f"the checkpoint of step {killer.committed_before} held {killer.checkpoint_bytes} bytes "
            f"when its commit marker appeared, less than one rank's {held} bytes of parameters: "
            "a commit marker must come after the data it commits",
            measured,
        )  # fmt: skip
    problems = resume_problems(
        result.probe, uninterrupted.probe if uninterrupted and uninterrupted.ok else None,
        spec.ranks, spec.steps, killer.committed_before,
    )  # fmt: skip
    if problems:
        return CriterionResult(criterion, "fail", "; ".join(problems), measured)
    message = (
        f"rank {rank} SIGKILLed after step {killer.committed_before} was committed; resumed at "
        f"step {resumed}, finished {spec.steps} steps, ranks identical; the checker saw the final "
        "processes run only the remaining steps and end with the uninterrupted run's parameters"
    )
    return CriterionResult(criterion, "pass", message, measured)
