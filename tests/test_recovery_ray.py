"""Ray Train automatic recovery: a worker SIGKILLs itself, Ray restarts the group, the end is exact.

One local Ray session and one ``TorchTrainer`` run (two CPU workers, gloo DDP)
serve the whole module: 12 steps, a checkpoint every 4, worker 1 killed before
step 10 on the first attempt. The run must finish after exactly one restart,
resume from the checkpoint of step 8 (the last one committed before the crash),
and end bitwise equal to the uninterrupted single-process reference
(:func:`ddtk.recovery.common.reference`, exact for two workers). The Ray
session is shut down by the module fixture, which then checks that no process
it started is still alive. The same session also serves one ``ddtk.profiling`` test:
``StepProfiler`` in the workers of a second, short ``TorchTrainer`` run (one Ray start
for both).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
import torch
from support import import_or_require

from ddtk.checkpoint import latest, load, verify
from ddtk.frameworks.ray_procs import init_local
from ddtk.recovery.common import build, fingerprint, reference
from ddtk.recovery.ray_train import _check_run_args, parse_args, run

STEPS, EVERY, KILL_STEP, WORKERS = 12, 4, 10, 2
RUN_TIMEOUT_S = 420  # the one Ray run, startup included: minutes on a loaded 2-core machine
SHUTDOWN_TIMEOUT_S = 30.0


def _children() -> set[int]:
    """Pids of the live (non-zombie) descendants of this process."""
    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray session for the module; after ray.shutdown() no process it started may live."""
    ray = import_or_require("ray", "ray")
    before = _children()
    try:
        # a local session; a loaded machine can miss Ray's 30 s wait for a raylet (retried)
        init_local(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        left = _children() - before
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _children() - before
        if left:
            found = []
            for pid in left:
                try:
                    proc = psutil.Process(pid)
                    found.append(f"{pid} ({' '.join(proc.cmdline()[:3])})")
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            names = ", ".join(found)
            pytest.fail(f"Ray processes left behind after ray.shutdown(): {names}")


@pytest.fixture(scope="module")
def recovered(ray_session, tmp_path_factory):
    """The summary of the one Ray Train run with a killed worker."""
    storage = tmp_path_factory.mktemp("ray-storage")
    result = run(
        STEPS, EVERY, KILL_STEP, storage=storage, max_failures=2, name="killed", keep_last=2
    )
    result["storage"] = storage
    print(
        f"\nRay Train recovery: {result['recovery_seconds']:.1f} s from the SIGKILL to the "
        f"first step after the restart (fit {result['fit_seconds']:.1f} s, loaded 2-core machine)"
    )
    return result


# -- no Ray needed ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"every": 0}, "every must be an integer >= 1"),
        ({"batch_size": 31}, "not divisible by num_workers 2"),
        ({"kill_step": 12}, r"kill_step must be in 0\.\.11"),
        ({"kill_rank": 2}, r"kill_rank must be in 0\.\.1"),
        ({"max_failures": 0}, "a kill needs max_failures >= 1"),
        ({"max_failures": -2}, "max_failures must be an integer >= -1"),
        ({"keep_last": 0}, "keep_last must be None or an integer >= 1"),
    ],
)
def test_bad_arguments_are_named(change, message):
    args = dict(
        steps=12, every=4, kill_step=10, kill_rank=1, num_workers=2, batch_size=32, max_failures=2
    )
    args.update(change)
    with pytest.raises(ValueError, match=message):
        _check_run_args(**args)


def test_existing_run_name_is_refused_before_ray_starts(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="'taken' already exists"):
        run(4, 2, storage=tmp_path, name="taken")


def test_uri_storage_needs_a_shared_work_directory():
    with pytest.raises(ValueError, match="is a URI: pass work="):
        run(4, 2, storage="s3://bucket/runs", name="r")


def test_existing_work_directory_is_refused(tmp_path):
    (tmp_path / "w").mkdir()
    with pytest.raises(ValueError, match=r"work directory .* already exists"):
        run(4, 2, storage=tmp_path / "s", name="r", work=tmp_path / "w")


def test_command_line_options():
    args = parse_args(["--steps", "12", "--every", "4", "--kill-step", "10", "--workers", "2"])
    assert (args.steps, args.every, args.kill_step, args.kill_rank, args.workers) == (
        12,
        4,
        10,
        1,
        2,
    )


# -- one Ray Train run with a kill -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.ray
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_training_finishes_after_exactly_one_restart(recovered):
    assert recovered["restarts"] == 1
    assert recovered["steps"] == STEPS and recovered["world_size"] == WORKERS
    assert (Path(recovered["work"]) / f"killed-rank1-step{KILL_STEP}").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.ray
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_final_model_equals_uninterrupted_reference_bitwise(recovered):
    ref = reference(STEPS, world_size=WORKERS)
    assert recovered["fingerprint"] == fingerprint(ref)
    # and training did change the model (the comparison is not trivially true)
    assert recovered["fingerprint"] != fingerprint(build()[0])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.ray
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_restart_resumes_from_last_committed_checkpoint(recovered):
    last_commit = (KILL_STEP // EVERY) * EVERY  # 8: the newest checkpoint before step 10
    crash = json.loads((Path(recovered["work"]) / "crash.json").read_text())["time"]
    commits = [json.loads(line) for line in (Path(recovered["work"]) / "commits.log").open()]
    assert [c["step"] for c in commits if c["time"] < crash] == [EVERY, last_commit]
    assert recovered["starts"] == [0, last_commit]
    assert recovered["resumed_step"] == last_commit  # first step after resume = checkpoint step
    assert recovered["resumed_from"][0] is None
    assert Path(recovered["resumed_from"][1]).name == f"step-{last_commit:06d}"
    # rank 0 computed 0..9, died with rank 1 inside step 10, recomputed 8..11 after the restart
    assert recovered["steps_run"] == list(range(KILL_STEP)) + list(range(last_commit, STEPS))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.ray
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_ray_checkpoints_are_verified_ddtk_checkpoints(recovered):
    run_dir = Path(recovered["storage"]) / "killed"
    kept = sorted(p.name for p in run_dir.glob("step-*"))
    assert kept == [f"step-{EVERY * 2:06d}", f"step-{STEPS:06d}"]  # keep_last=2
    newest = latest(run_dir)
    assert newest is not None and newest.name == f"step-{STEPS:06d}"
    assert Path(recovered["checkpoint"]) == newest
    assert verify(newest) == []
    model, optimizer = build()
    ckpt = load(newest, model, optimizer, rng=False)
    assert ckpt.step == STEPS
    torch.testing.assert_close(
        torch.cat([p.detach().flatten() for p in model.parameters()]),
        torch.cat([p.detach().flatten() for p in reference(STEPS, WORKERS).parameters()]),
        rtol=0,
        atol=0,
    )


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.ray
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_recovery_time_is_measured(recovered):
    seconds = recovered["recovery_seconds"]
    assert seconds is not None and seconds > 0  # a measurement, not a bound: timings are noisy


@pytest.fixture(scope="module")
def profiled(ray_session, tmp_path_factory):
    """Traces of a short TorchTrainer run with ddtk.profiling's job in each worker.

    Module-scoped like ``recovered``: the controller actors a fit leaves in the session
    live until ``ray_session`` shuts Ray down, not past the test.
    """
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ddtk.profiling.jobs import JobConfig, ray_train_loop

    root = tmp_path_factory.mktemp("ray-profile")
    trainer = TorchTrainer(
        ray_train_loop,
        train_loop_config={"job": JobConfig(profile_steps=2, timed_steps=1), "trace_dir": str(root / "traces")},
        scaling_config=ScalingConfig(num_workers=WORKERS),
        run_config=RunConfig(storage_path=str(root / "ray"), name="profile"),
    )  # fmt: skip
    return trainer.fit(), root / "traces"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.ray
def test_ray_train_workers_each_write_their_profile(profiled):
    """ddtk.profiling in Ray Train V2: each worker writes rank<world rank>.json with its collectives."""
    from ddtk.profiling import analyse

    result, traces = profiled
    assert result.error is None
    a = analyse(traces)
    assert [t.rank for t in a.traces] == list(range(WORKERS))
    assert all(t.world_size == WORKERS and t.backend == "gloo" for t in a.traces)
    assert all(r.collectives >= 1 and r.comm_bytes > 0 for r in a.breakdown.rows)
