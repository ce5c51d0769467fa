"""StepProfiler in every kind of rank: one process, torchrun, and Ray Train V2 workers.

(``ddtk.launch`` ranks are covered by test_profiling_jobs.py; Ray Train workers by
``test_recovery_ray.test_ray_train_workers_each_write_their_profile``, which shares that
module's Ray session.) Each run must leave
exactly one ``rank<r>.json`` per rank, named by the rank the trace itself records
in ``distributedInfo``, with the collectives in it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ddtk.profiling import StepProfiler, analyse, current_rank, load_trace, region

TORCHRUN_JOB = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from ddtk.profiling import StepProfiler
    from ddtk.profiling.jobs import JobConfig, train_rank

    dist.init_process_group("gloo")
    train_rank(None, JobConfig(profile_steps=2, timed_steps=1), sys.argv[1])
    dist.destroy_process_group()
    # The traces are written and the group is gone. Interpreter finalization is left out:
    # once in CI both ranks of this job aborted after this point ("terminate called
    # without an active exception", torch 2.13, gloo), which is torch's teardown, not
    # the profiling this test is about. A crash before this line still fails the test.
    import os
    print(f"rank {os.environ['RANK']} done", flush=True)
    os._exit(0)
    """
)


def test_single_process_writes_rank0_with_the_window_of_steps(tmp_path):
    with StepProfiler(tmp_path, wait=1, warmup=1, active=2) as prof:
        for _ in range(prof.steps_needed + 2):  # steps after the window are not recorded
            with region("data"):
                x = torch.randn(32, 32)
            torch.mm(x, x)
            prof.step()
    assert prof.written == [tmp_path / "rank0.json"]
    t = load_trace(tmp_path / "rank0.json")
    assert t.step_numbers() == [2, 3] and t.rank == 0
    assert {"ddtk:data", "aten::mm"} <= {e.name for e in t.events}
    assert not list(tmp_path.glob("*.tmp"))


def test_disabled_profiler_writes_nothing(tmp_path):
    with StepProfiler(tmp_path, enabled=False) as prof:
        for _ in range(6):
            prof.step()
    assert prof.written == [] and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"active": 0}, "active must be an integer >= 1"), ({"wait": -1}, "wait must be"),
     ({"warmup": 1.5}, "warmup must be")],
)  # fmt: skip
def test_bad_schedule_is_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepProfiler(tmp_path, **kwargs)


def test_region_names_its_kind_or_refuses():
    with (
        pytest.raises(
            ValueError, match="region kind must be one of data, optimizer, comm, compute"
        ),
        region("io"),
    ):
        pass


def test_current_rank_reads_rank_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert current_rank() == 3


def test_torchrun_ranks_each_write_their_trace(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_JOB)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        str(tmp_path / "tr"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # no rank may outlive a hung run
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "rank 0 done" in out and "rank 1 done" in out, out[-3000:]
    a = analyse(tmp_path / "tr")
    assert [t.rank for t in a.traces] == [0, 1]
    assert all(t.world_size == 2 and t.backend == "gloo" for t in a.traces)
    assert all(r.collectives >= 1 for r in a.breakdown.rows)


def test_the_example_job_is_one_rank_under_torchrun(tmp_path):
    """``torchrun -m ddtk.profiling.jobs JOB --trace-dir D`` spreads one job over torchrun's
    processes (it must not launch ranks of its own in each of them)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "ddtk.profiling.jobs",
           "baseline", "--trace-dir", str(tmp_path / "tr")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "baseline: rank 0 of 2" in out and "baseline: rank 1 of 2" in out, out[-2000:]
    a = analyse(tmp_path / "tr")
    assert [(t.rank, t.world_size) for t in a.traces] == [(0, 2), (1, 2)]
    assert all(r.collectives == 1 for r in a.breakdown.rows)  # one 25 MB bucket per step
