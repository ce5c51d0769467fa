"""The kill drill: real SIGKILLs of a resumable training process, compared bit for bit."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import pytest
import torch

import ddtk.checkpoint as ckpt
from ddtk.faults.drill import Attempt, DrillError, DrillReport, kill_delays, run_drill
from ddtk.recovery.common import build, global_batch, loss_fn

STEPS = 30


def _resumable(run_dir: str, steps: int, *, keep_optimizer: bool = True):
    """Checkpoint every 3 steps with ddtk.checkpoint; resume from the newest good one."""
    torch.set_num_threads(1)
    model, opt = build(0)
    start = 0
    if ckpt.latest(run_dir) is not None:
        start = ckpt.load(run_dir, model, opt if keep_optimizer else None).step
    for step in range(start, steps):
        x, y = global_batch(step, 16)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        time.sleep(0.05)
        if (step + 1) % 3 == 0:
            ckpt.save(run_dir, ckpt.capture(model, opt, step=step + 1), step + 1)
    return model.state_dict()


def _forgets_momentum(run_dir: str, steps: int):
    latest = ckpt.latest(run_dir)
    with open(Path(run_dir) / "resumed-at.txt", "a") as f:  # where each start began, for the test
        f.write(f"{latest.name if latest else 'start'}\n")
    return _resumable(run_dir, steps, keep_optimizer=False)


def test_a_correct_resume_survives_three_sigkills_bitwise(tmp_path):
    seen: list[Attempt] = []
    report = run_drill(_resumable, tmp_path / "run", STEPS, kills=3, seed=1, on_attempt=seen.append)
    assert report.kills == 3, report.attempts
    assert seen == report.attempts and report.attempts[-1].killed_after is None
    assert report.bitwise_equal, report.mismatched
    assert set(report.result) == set(build(0)[0].state_dict())
    assert ckpt.latest(tmp_path / "run").name == f"step-{STEPS:06d}"


def test_a_resume_that_drops_the_optimizer_state_is_caught(tmp_path):
    # The kill times follow the reference run's time; on a loaded machine a drilled start can
    # be slower and be killed before its first checkpoint (a restart from scratch is not a
    # resume), or after its last (the resume has nothing left to train). So drill again, earlier
    # and later in the run, until some start resumed from a checkpoint with steps left.
    for n, window in enumerate([(0.2, 0.45), (0.1, 0.3), (0.4, 0.7)]):
        run_dir = tmp_path / f"run{n}"
        report = run_drill(_forgets_momentum, run_dir, STEPS, kills=2, seed=2, window=window)
        starts = (run_dir / "resumed-at.txt").read_text().split()
        # a resume with steps left to train: one from the last checkpoint trains nothing
        resumed = [s for s in starts if s != "start" and int(s.split("-")[1]) < STEPS]
        if resumed:
            break
    assert resumed, "no start resumed from a checkpoint with steps left, in three drills"
    assert report.kills >= 1
    assert not report.bitwise_equal
    assert report.mismatched  # the parameters drift once momentum is lost


def _fails(run_dir: str, steps: int):
    raise RuntimeError("no checkpoint format chosen yet")


def test_a_failing_train_function_is_reported_with_its_output(tmp_path):
    with pytest.raises(DrillError, match="no checkpoint format chosen yet"):
        run_drill(_fails, tmp_path / "run", 3, kills=1)


def _hangs(pid_file: Path, run_dir: str, steps: int):
    pid_file.write_text(str(os.getpid()))
    time.sleep(60)


def test_a_hanging_run_times_out_and_leaves_no_process(tmp_path):
    before = time.monotonic()
    with pytest.raises(DrillError, match="did not finish within the timeout"):
        run_drill(partial(_hangs, tmp_path / "pid"), tmp_path / "run", 3, kills=1, timeout=3)
    assert time.monotonic() - before < 30
    with pytest.raises(ProcessLookupError):  # killed and reaped, not orphaned
        os.kill(int((tmp_path / "pid").read_text()), 0)


def test_bad_arguments_are_named(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        run_drill(_resumable, tmp_path / "used", 3)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        run_drill(_resumable, tmp_path / "run", 0)
    with pytest.raises(ValueError, match="kills must be"):
        run_drill(_resumable, tmp_path / "run", 3, kills=-1)
    with pytest.raises(TypeError, match="train must be a function"):
        run_drill("train.py", tmp_path / "run", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        kill_delays(2, 1.0, window=(0.5, 0.2))


def test_comparison_is_by_bits_names_and_shapes():
    a = {"w": torch.tensor([0.0, 1.0])}
    assert DrillReport(a, {"w": torch.tensor([0.0, 1.0])}, 1.0).bitwise_equal
    assert DrillReport(a, {"w": torch.tensor([-0.0, 1.0])}, 1.0).mismatched == ["w"]  # -0.0 == 0.0
    assert DrillReport(a, {"w": torch.tensor([0.0, 1.0]), "b": a["w"]}, 1.0).mismatched == ["b"]
    assert DrillReport(a, {"w": torch.zeros(1, 2)}, 1.0).mismatched == ["w"]
